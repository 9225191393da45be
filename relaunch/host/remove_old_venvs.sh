#!/usr/bin/env bash
# shellcheck shell=bash
# Remove the named old venvs; each must still be a VENV.old-* sibling.
venv=$1; shift
parent=$(dirname -- "$venv") base=$(basename -- "$venv")
for name in "$@"; do
  case $name in */* | "") echo "refusing $name"; continue ;; "$base".old-*) ;; *) echo "refusing $name"; continue ;; esac
  rm -rf -- "${parent:?}/$name" && printf 'removed %s\0' "$parent/$name"
done
