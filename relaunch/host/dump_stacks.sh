#!/usr/bin/env bash
# shellcheck shell=bash
# py-spy dump of every live process of the recorded trainer's group.
# shellcheck source=lib.sh
. ./lib.sh
pyspy=$1 state=$2 out=$3
run_id=$(current_run "$state")
spid='' sstart=''
read_pid "$(run_folder "$state" "$run_id")/supervisor_pid" spid sstart || { echo "no trainer on record"; exit 3; }
alive "$spid" "$sstart" || { echo "the recorded trainer is gone"; exit 3; }
mkdir -p -- "$(dirname -- "$out")" || exit 3
# The supervisor's group, and every process carrying the run's marker: torchrun starts each rank in a
# session (and process group) of its own.
for p in $( { ps -e -o pid=,pgid= | awk -v g="$spid" '$2 == g && $1 != g {print $1}'; marked_pids "$(run_folder "$state" "$run_id")"; } | sort -un); do
  [ "$(readlink "/proc/$p/exe" 2>/dev/null)" ] || continue
  case $(cat "/proc/$p/comm" 2>/dev/null) in python*|pt_*|torchrun) ;; *) continue ;; esac
  echo "=== py-spy dump --pid $p ($(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | cut -c1-200))"
  timeout 60 "$pyspy" dump --pid "$p" 2>&1
done > "$out"
cat -- "$out"
