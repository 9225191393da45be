#!/usr/bin/env bash
# shellcheck shell=bash
# Run "$@" recorded in $1 (PID, start time, process group) while it runs.
dir=$1 name=$2; shift 2
mkdir -p -- "$dir" || exit 125
rec="$dir/$name.$$"
# PID, start time, process group (that of `timeout`, our parent), parent.
s=$(cat "/proc/$$/stat"); s=${s##*) }; read -ra f <<< "$s"
printf '%s %s %s %s\n' "$$" "${f[19]}" "${f[2]}" "${f[1]}" > "$rec"
"$@"; code=$?
rm -f -- "$rec"
exit "$code"
