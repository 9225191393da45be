#!/usr/bin/env bash
# shellcheck shell=bash
# Move the current venv aside and print where the previous venv now is; a half-built one is named .incomplete.
venv=$1 stamp=$2 marker=$3
old="$venv.old-$stamp"
if [ -e "$old" ]; then
  # An earlier try of this same rebuild (same stamp; its connection dropped) already moved the previous venv
  # there: that stays the one to put back, and what stands at $venv is that try's unfinished build.
  if [ -e "$venv" ]; then
    dest="$venv.incomplete-$stamp" n=1
    while [ -e "$dest" ]; do dest="$venv.incomplete-$stamp.$n" n=$((n + 1)); done
    mv -T -- "$venv" "$dest" || exit 1
  fi
  echo "$old"; exit 0
fi
[ -e "$venv" ] || { echo "none"; exit 0; }
kind=old; [ -e "$venv/$marker" ] && kind=incomplete
mv -T -- "$venv" "$venv.$kind-$stamp" && echo "$venv.$kind-$stamp"
