#!/usr/bin/env bash
# shellcheck shell=bash
# Put the previous venv back after a failed build; the failed one is kept.
venv=$1 aside=$2 stamp=$3
[ -e "$venv" ] && mv -- "$venv" "$venv.failed-$stamp"
[ "$aside" = none ] || mv -- "$aside" "$venv"
