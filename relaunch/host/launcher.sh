#!/usr/bin/env bash
# shellcheck shell=bash
# relaunch launcher. The pane shows the log; the log is the record. $1: the run folder.
run=$1
setsid -f bash "$run/supervisor.sh" "$run" < /dev/null > /dev/null 2>&1
for _ in $(seq 200); do [ -s "$run/supervisor_pid" ] && break; sleep 0.05; done
read -r spid _ < "$run/supervisor_pid"
log=$(cat "$run/log_path")
touch -- "$log"
exec tail -n +1 -F --pid="$spid" -- "$log" 2>/dev/null
