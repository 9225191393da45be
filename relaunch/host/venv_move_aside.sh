#!/usr/bin/env bash
# shellcheck shell=bash
# After the stop: move the current venv aside (VENV.old-STAMP, or .incomplete-STAMP if half-built) and rename
# the venv built aside (VENV.new-STAMP) into its place; print where the previous venv now is ("none": there was none).
# Both are renames in one folder: nothing is copied, so once the build passed, the swap cannot fail half-way
# for want of space or network. A venv built with `uv venv --relocatable` runs from its new name.
# shellcheck source=lib.sh
. ./lib.sh
venv=$1 stamp=$2 marker=$3 new=$4 record=$5 state=$6
old="$venv.old-$stamp"
# A venv whose record names this stamp and that is no longer marked half-built: this rebuild's build, complete.
built() {
  local s=''
  [ -f "$1/$record" ] && [ ! -e "$1/$marker" ] && read -r s < "$1/$record" && [ "$s" = "$stamp" ]
}
if built "$venv"; then
  # A retry after a dropped connection: the first try already swapped.
  if [ -e "$old" ]; then echo "$old"; else echo none; fi
  exit 0
fi
built "$new" || { echo "no complete build of this rebuild at $new: build the venv aside first; $venv is as it was"; exit 30; }
# The trainer has the venv's files open and imports from it as it goes: never swap under a live one.
cur=$(current_run "$state")
pid='' pstart=''
if [ -n "$cur" ] && read_pid "$(run_folder "$state" "$cur")/pid" pid pstart && alive "$pid" "$pstart"; then
  echo "trainer of run $cur is alive (PID $pid) and uses $venv: stop it before swapping the new venv in; $venv is as it was"; exit 20
fi
if [ -e "$old" ]; then
  # An earlier try of this same rebuild moved the previous venv there and was cut off before the rename:
  # that stays the one to keep, and whatever stands at $venv now is not the user's.
  aside=$old
  if [ -e "$venv" ] || [ -L "$venv" ]; then
    dest="$venv.incomplete-$stamp" n=1
    while [ -e "$dest" ]; do dest="$venv.incomplete-$stamp.$n" n=$((n + 1)); done
    mv -T -- "$venv" "$dest" || { echo "cannot move $venv aside to $dest"; exit 31; }
  fi
elif [ -e "$venv" ] || [ -L "$venv" ]; then
  # A symlinked venv: the link moves, what it points to is never touched.
  kind=old; [ -e "$venv/$marker" ] && kind=incomplete
  aside="$venv.$kind-$stamp"
  mv -T -- "$venv" "$aside" || { echo "cannot move $venv aside to $aside; it is as it was"; exit 31; }
else
  aside=none
fi
if ! mv -T -- "$new" "$venv"; then
  [ "$aside" = none ] || mv -T -- "$aside" "$venv"
  echo "cannot rename $new to $venv; the previous venv is back in place"; exit 32
fi
echo "$aside"
