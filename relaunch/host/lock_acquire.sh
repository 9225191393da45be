#!/usr/bin/env bash
# shellcheck shell=bash
# Take the target's lock folder, under flock.
lock=$1 owner=$2 stale=$3 dead_owner=$4
mkdir -p "$(dirname "$lock")" || exit 12
exec 9>>"$lock.guard"
flock -w 30 9 || { echo "held: (another recovery is taking this lock)"; exit 9; }
if ! mkdir "$lock" 2>/dev/null; then
  current=$(cat "$lock/owner" 2>/dev/null)
  age=$(( $(date +%s) - $(stat -c %Y "$lock/owner" 2>/dev/null || echo 0) ))
  if [ -n "$dead_owner" ] && [ "$current" = "$dead_owner" ]; then
    echo "taking over the lock of a dead orchestrator ($current)"
  elif [ "$age" -gt "$stale" ]; then
    echo "taking over a lock whose heartbeat is ${age}s old ($current)"
  else
    echo "held: $current"; echo "heartbeat ${age}s ago"; exit 9
  fi
fi
printf '%s\n' "$owner" > "$lock/owner"
echo acquired
