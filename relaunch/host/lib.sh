#!/usr/bin/env bash
# shellcheck shell=bash
# What every host script shares. relaunch sends a script as `bash -c TEXT label ARGS...` with this file
# inlined where it says `. ./lib.sh`; an operator can also run one by hand from this folder:
#   bash snapshot.sh STATE SESSION 0 200 1 x VENV CACHE 262144 Error LOGDIR ""

# The run folder (relaunch/runlayout.py says the same in Python):
#   STATE/current                 the run id of the current attempt
#   STATE/runs/ID/pid             "PID STARTTIME" of the trainer
#   STATE/runs/ID/supervisor_pid  "PID STARTTIME" of its supervisor (leader of its process group)
#   STATE/runs/ID/exit_code       written when the trainer exits
#   STATE/runs/ID/{log_path,started_at,checkpoint,spec,launcher.sh,supervisor.sh}
# Files are read with bash's own `$(< FILE)` (no cat process): a fleet check runs this on every host, often.
current_run() { local r; { r=$(< "$1/current"); } 2> /dev/null || return 1; printf '%s\n' "$r"; }
# VAR=the contents of FILE (without the final newline), empty if it cannot be read.
slurp() { { printf -v "$1" '%s' "$(< "$2")"; } 2> /dev/null || printf -v "$1" ''; }
# VAR=the time in microseconds since the epoch (bash 5's EPOCHREALTIME; `date` on older shells).
now_us() { if [ -n "${EPOCHREALTIME-}" ]; then printf -v "$1" '%s' "${EPOCHREALTIME/[.,]/}"; else printf -v "$1" '%s' "$(date +%s%6N)"; fi; }
run_folder() { printf "%s/runs/%s" "$1" "$2"; }

# A PID is alive only if /proc still shows its recorded start time (no PID reuse) and it is no zombie.
starttime() { local s f; { s=$(< "/proc/$1/stat"); } 2> /dev/null || return 1; s=${s##*) }; read -ra f <<< "$s"; [ "${f[0]}" != Z ] || return 1; echo "${f[19]}"; }
alive() { [ -n "$1" ] && [ -n "$2" ] && [ "$(starttime "$1")" = "$2" ]; }
read_pid() { [ -r "$1" ] && read -r "$2" "$3" < "$1"; }
# "PID STARTTIME" into FILE, atomically.
record_pid() { echo "$1 $(starttime "$1")" > "$2.tmp" && mv -f "$2.tmp" "$2"; }
# Every process carrying this run's marker in its environment (the supervisor puts RELAUNCH_RUN=<run folder>
# into the trainer's environment; launchers like torchrun pass it on to ranks they start in sessions of their own).
marked_pids() { local f p; for f in /proc/[0-9]*/environ; do p=${f#/proc/}; p=${p%/environ}; tr '\0' '\n' < "$f" 2>/dev/null | grep -qxF "RELAUNCH_RUN=$1" && echo "$p"; done; return 0; }
