#!/usr/bin/env bash
# shellcheck shell=bash
# relaunch launcher. The pane shows the log; the log is the record. $1: the run folder.
run=$1
setsid -f bash "$run/supervisor.sh" "$run" < /dev/null > /dev/null 2>&1
log=$(cat "$run/log_path")
touch -- "$log"
# The pane lives as long as the supervisor. A supervisor slow to record itself (a loaded host) must not end the
# pane, and with it the tmux session, under a trainer that runs on: without its PID the pane follows the log
# until the session is stopped.
spid=''
for _ in $(seq 2400); do [ -s "$run/supervisor_pid" ] && read -r spid _ < "$run/supervisor_pid" && break; sleep 0.05; done
[ -n "$spid" ] && exec tail -n +1 -F --pid="$spid" -- "$log" 2>/dev/null
echo "[relaunch] the supervisor did not record its PID within 120 s; following the log" >> "$log"
exec tail -n +1 -F -- "$log" 2>/dev/null
