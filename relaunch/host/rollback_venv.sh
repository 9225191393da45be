#!/usr/bin/env bash
# shellcheck shell=bash
# Swap the newest VENV.old-* back in; the current venv is kept aside.
# shellcheck source=lib.sh
. ./lib.sh
venv=$1 stamp=$2 state=$3
cur=$(current_run "$state")
pid='' pstart=''
if [ -n "$cur" ] && read_pid "$(run_folder "$state" "$cur")/pid" pid pstart && alive "$pid" "$pstart"; then
  echo "trainer of run $cur is alive (PID $pid) and uses $venv: stop it before rolling the venv back"; exit 20
fi
# The glob sorts by name, and the stamp in each name sorts by time: the last is the newest.
old=''
for d in "$venv".old-*; do [ -d "$d" ] && old=$d; done
[ -n "$old" ] || { echo "no previous venv kept aside ($venv.old-*): nothing to roll back to"; exit 21; }
if [ -e "$venv" ] || [ -L "$venv" ]; then
  mv -T -- "$venv" "$venv.rolled-back-$stamp" || { echo "cannot move $venv aside"; exit 22; }
  echo "kept $venv.rolled-back-$stamp"
fi
if ! mv -T -- "$old" "$venv"; then
  if [ -e "$venv.rolled-back-$stamp" ]; then mv -T -- "$venv.rolled-back-$stamp" "$venv"; fi
  echo "cannot move $old into place; $venv is as it was"; exit 23
fi
echo "restored $old"
