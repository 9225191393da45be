#!/usr/bin/env bash
# shellcheck shell=bash
# The missing-dependency remedy: PACKAGE into the venv, and nothing the venv holds changed. $1: the venv's python,
# $2: the package as the diagnosis named it, $3: the target's lock; the rest: uv's index flags.
# The venv's own packages are the constraints (its `uv pip freeze`): an install that would move any of them (the
# package needs another numpy than the lock's) fails, naming the conflict, instead of drifting the venv from its lock.
# A package the lock pins is installed at that pin. Prints `added NAME==VERSION` for each distribution it added.
set -o pipefail
py=$1 pkg=$2 lock=$3; shift 3
canon() { local s=${1,,}; s=${s//_/-}; s=${s//./-}; while [[ $s == *--* ]]; do s=${s//--/-}; done; printf '%s' "$s"; }
want=$(canon "$pkg")
spec=$pkg
if [ -r "$lock" ]; then
  while IFS= read -r line; do
    line=${line%%#*}; line=${line//[[:space:]]/}
    [[ $line == *==* ]] || continue
    name=${line%%==*}; name=${name%%\[*}
    [ "$(canon "$name")" = "$want" ] && { spec=$line; break; }
  done < "$lock"
fi
freeze() { uv pip freeze --python "$py" --exclude-editable 2> /dev/null | grep -E '^[A-Za-z0-9._-]+==' | sort; }
before=$(freeze) || before=''
constraints=$(mktemp) || exit 1
trap 'rm -f -- "$constraints"' EXIT
printf '%s\n' "$before" > "$constraints"
uv pip install --python "$py" --compile-bytecode --constraint "$constraints" "$@" "$spec" || {
  rc=$?
  echo "nothing was installed: uv found no $spec that fits the venv's packages as they are (kept as constraints, so that the venv does not drift from its lock) in the configured indexes; above: why" >&2
  exit "$rc"
}
comm -13 <(printf '%s\n' "$before") <(freeze) | sed 's/^/added /'
