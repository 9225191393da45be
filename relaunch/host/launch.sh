#!/usr/bin/env bash
# shellcheck shell=bash
# Refuse to launch beside a live trainer or onto a half-built venv or cache; start the launcher in tmux.
# shellcheck source=lib.sh
. ./lib.sh
state=$1 session=$2 run_id=$3 log=$4 supervisor=$5 launcher=$6 wait_s=$7 venv=$8 cache=$9 checkpoint=${10}; shift 10
# One launch at a time: a retry after a dropped connection may start while the first try still runs here.
mkdir -p "$state" || exit 12
exec 9>>"$state/launch.lock"
flock -w "${wait_s%.*}" 9 || { echo "another launch holds $state/launch.lock for over ${wait_s}s: refusing to start a second trainer"; exit 17; }
wait_for_pid() {
  local end; end=$(( SECONDS + ${wait_s%.*} ))  # SECONDS: no `date` process per 10 ms look
  until [ -e "$1/pid" ] || [ -e "$1/exit_code" ]; do
    [ "$SECONDS" -ge "$end" ] && { echo "no PID recorded within ${wait_s}s"; exit 14; }
    nap 0.01
  done
  cat "$1/pid" 2>/dev/null || echo "exited at once"
}
cur=$(current_run "$state")
if [ "$cur" = "$run_id" ]; then
  # An earlier try of this very launch got this far before its connection dropped: its trainer is the one.
  wait_for_pid "$(run_folder "$state" "$run_id")"
  echo "adopted"; exit 0
fi
pid='' pstart=''
if [ -n "$cur" ]; then
  read_pid "$(run_folder "$state" "$cur")/pid" pid pstart
  if alive "$pid" "$pstart"; then echo "trainer of run $cur is alive (PID $pid): refusing to start a second one"; exit 10; fi
fi
if tmux has-session -t "=$session" 2>/dev/null; then echo "tmux session $session exists: refusing to start a second trainer"; exit 11; fi
[ -e "$venv/.relaunch-building" ] && { echo "venv $venv is half-built (.relaunch-building): rebuild it before launching"; exit 15; }
[ -e "$cache/.relaunch-warming" ] && { echo "compile cache $cache is half-warmed (.relaunch-warming): warm it again before launching"; exit 16; }
run=$(run_folder "$state" "$run_id")
mkdir -p "$run" "$(dirname "$log")" || exit 12
printf '%s' "$supervisor" > "$run/supervisor.sh"
printf '%s' "$launcher" > "$run/launcher.sh"
printf '%s\0' "$@" > "$run/spec"
printf '%s\n' "$log" > "$run/log_path"
printf '%s\n' "$checkpoint" > "$run/checkpoint"
date +%s.%N > "$run/started_at"
printf '%s\n' "$run_id" > "$state/current.tmp" && mv -f "$state/current.tmp" "$state/current"
# Several arguments: tmux runs them directly, with no shell in between to quote for.
# 9>&-: the lock is the launch's alone; a tmux server or trainer inheriting it would hold it for the whole run.
# env -u: a pane takes the tmux server's environment, which is that of whatever first started the server; a
# RELAUNCH_RUN there (a server started from inside a trainer) would mark this pane as another run's process.
tmux new-session -d -s "$session" -x 220 -y 50 env -u RELAUNCH_RUN bash "$run/launcher.sh" "$run" 9>&- || exit 13
wait_for_pid "$run"
