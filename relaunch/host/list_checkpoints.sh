#!/usr/bin/env bash
# shellcheck shell=bash
# shellcheck source=lib.sh
. ./lib.sh
# List checkpoint_dir NUL-separated for relaunch/checkpoints.py, which makes the choice. $1 checkpoint_dir,
# $2 the file of checkpoints recorded as failing to load, $3 one to record now (or ""), $4 the state folder.
# Records (a name may hold anything but NUL and `/`):
#   KIND MTIME E|N NAME  each entry (find's %y, its own mtime, Empty or Not)
#   W NEWEST NAME        a folder's newest write: the newest mtime of anything in it, a few levels down
#   L NAME/TARGET        where a symbolic link points (a `latest` link names the newest complete checkpoint)
#   C NAME/TEXT          the first line of a framework tracker (Megatron, DeepSpeed `latest`)
#   S MTIME NAME         a checkpoint recorded as failing to load
#   R KEY VALUE          the current run's records: when it started, when a stop signalled it, how it died
dir=$1 skipfile=$2 refuse=$3 state=$4
# Deep enough for Megatron's iter_N/mp_rank_00/model_optim_rng.pt and DeepSpeed's sharded folders; bounded, so a
# folder of a million files is never walked whole.
DEPTH=4
# Recorded with its mtime: a trainer that later saves a good checkpoint under the same name is not skipped.
if [ -n "$refuse" ] && [ -e "$dir/$refuse" ]; then
  mkdir -p -- "$(dirname -- "$skipfile")" && printf '%s %s\0' "$(stat -c %Y -- "$dir/$refuse")" "$refuse" >> "$skipfile" || exit 3
fi
[ -d "$dir" ] || { echo "missing"; exit 0; }
echo "present"
find "$dir" -mindepth 1 -maxdepth 1 \( -empty -printf '%y %T@ E %f\0' -o -printf '%y %T@ N %f\0' \)
# A file being written inside a folder does not change the folder's own mtime: its newest write is inside.
while IFS= read -r -d '' sub; do
  newest=$(find "$sub" -maxdepth "$DEPTH" -printf '%T@\n' 2> /dev/null | sort -n | tail -n 1)
  [ -n "$newest" ] && printf 'W %s %s\0' "$newest" "${sub##*/}"
done < <(find "$dir" -mindepth 1 -maxdepth 1 -type d -print0)
while IFS= read -r -d '' link; do
  printf 'L %s/%s\0' "${link##*/}" "$(readlink -- "$link")"
done < <(find "$dir" -mindepth 1 -maxdepth 1 -type l -print0)
# Megatron's tracker holds an iteration number (or `release`), DeepSpeed's `latest` file the tag of its folder.
for name in latest_checkpointed_iteration.txt latest; do
  if [ -f "$dir/$name" ] && [ ! -L "$dir/$name" ]; then
    line=$(head -c 256 -- "$dir/$name" 2> /dev/null | tr -d '\0' | head -n 1)
    printf 'C %s/%s\0' "$name" "$line"
  fi
done
if [ -f "$skipfile" ]; then while IFS= read -r -d '' name; do printf 'S %s\0' "$name"; done < "$skipfile"; fi
# The current run's records: a checkpoint written while a stop was killing it, or growing when it died, is suspect.
if [ -n "$state" ] && cur=$(current_run "$state"); then
  run=$(run_folder "$state" "$cur")
  printf 'R run %s\0' "$cur"
  for key in started_at stop_term_at stop_killed_at exit_code; do
    slurp value "$run/$key"
    [ -n "$value" ] && printf 'R %s %s\0' "$key" "$value"
  done
  # When the trainer died: the supervisor writes exit_code the moment it exits.
  [ -f "$run/exit_code" ] && printf 'R exit_at %s\0' "$(find "$run/exit_code" -maxdepth 0 -printf '%T@')"
fi
exit 0
