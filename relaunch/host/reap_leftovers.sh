#!/usr/bin/env bash
# shellcheck shell=bash
# Stop host commands a killed recovery left running, by their records.
# shellcheck source=lib.sh
. ./lib.sh
dir=$1 timeout_s=$2
[ -d "$dir" ] || exit 0
for rec in "$dir"/*; do
  [ -f "$rec" ] || continue
  read -r pid start pgid ppid < "$rec" || { rm -f -- "$rec"; continue; }
  # Only a group our own `timeout` leads (the recorded shell's parent) is ours to signal as a group.
  [ "$pgid" = "$ppid" ] || pgid=$pid
  if ! alive "$pid" "$start"; then rm -f -- "$rec"; continue; fi
  echo "stopping ${rec##*/} (PID $pid, process group $pgid), left running by a recovery that was killed or lost its connection"
  kill -TERM -- "-$pgid" 2>/dev/null; kill -TERM "$pid" 2>/dev/null
  # A stopped process acts on TERM only once continued.
  kill -CONT -- "-$pgid" 2>/dev/null; kill -CONT "$pid" 2>/dev/null
  end=$(( $(date +%s) + timeout_s ))
  while alive "$pid" "$start" && [ "$(date +%s)" -lt "$end" ]; do sleep 0.1; done
  if alive "$pid" "$start"; then kill -KILL -- "-$pgid" 2>/dev/null; kill -KILL "$pid" 2>/dev/null; sleep 0.2; fi
  alive "$pid" "$start" && { echo "could not stop PID $pid"; exit 3; }
  # The group may hold children that outlived the recorded shell.
  kill -KILL -- "-$pgid" 2>/dev/null
  rm -f -- "$rec"
done
