#!/usr/bin/env bash
# shellcheck shell=bash
# List checkpoint_dir NUL-separated, with the checkpoints recorded as failing to load.
dir=$1 skipfile=$2 refuse=$3
# Recorded with its mtime: a trainer that later saves a good checkpoint under the same name is not skipped.
if [ -n "$refuse" ] && [ -e "$dir/$refuse" ]; then
  mkdir -p -- "$(dirname -- "$skipfile")" && printf '%s %s\0' "$(stat -c %Y -- "$dir/$refuse")" "$refuse" >> "$skipfile" || exit 3
fi
[ -d "$dir" ] || { echo "missing"; exit 0; }
echo "present"
find "$dir" -mindepth 1 -maxdepth 1 \( -empty -printf '%y %T@ E %f\0' -o -printf '%y %T@ N %f\0' \)
if [ -f "$skipfile" ]; then while IFS= read -r -d '' name; do printf 'S %s\0' "$name"; done < "$skipfile"; fi
