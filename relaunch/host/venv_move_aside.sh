#!/usr/bin/env bash
# shellcheck shell=bash
# Move the current venv aside; a half-built one is named .incomplete.
venv=$1 stamp=$2 marker=$3
[ -e "$venv" ] || { echo "none"; exit 0; }
kind=old; [ -e "$venv/$marker" ] && kind=incomplete
mv -T -- "$venv" "$venv.$kind-$stamp" && echo "$venv.$kind-$stamp"
