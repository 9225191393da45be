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
#   STATE/runs/ID/{scan,scan_matches,scan.lock,poll_mark}  the health poll's bookkeeping (snapshot.sh)
# Files are read with bash's own `$(< FILE)` (no cat process): a fleet check runs this on every host, often.
current_run() { local r; { r=$(< "$1/current"); } 2> /dev/null || return 1; printf '%s\n' "$r"; }
# VAR=the contents of FILE (without the final newline), empty if it cannot be read.
slurp() { { printf -v "$1" '%s' "$(< "$2")"; } 2> /dev/null || printf -v "$1" ''; }
# VAR=the time in microseconds since the epoch (bash 5's EPOCHREALTIME; `date` on older shells).
now_us() { if [ -n "${EPOCHREALTIME-}" ]; then printf -v "$1" '%s' "${EPOCHREALTIME/[.,]/}"; else printf -v "$1" '%s' "$(date +%s%6N)"; fi; }
run_folder() { printf "%s/runs/%s" "$1" "$2"; }

# A PID is alive only if /proc still shows its recorded start time (no PID reuse) and it is no zombie.
# VAR=the start time of PID; fails for no such process or a zombie. No subshell: the health poll's wait loop
# asks this every 50 ms for the whole of a trainer's start-up, on the cores that start-up needs.
starttime_into() { local s f; { s=$(< "/proc/$2/stat"); } 2> /dev/null || return 1; s=${s##*) }; read -ra f <<< "$s"; [ "${f[0]}" != Z ] || return 1; printf -v "$1" '%s' "${f[19]}"; }
starttime() { local t; starttime_into t "$1" && echo "$t"; }
alive() { local t; [ -n "$1" ] && [ -n "$2" ] && starttime_into t "$1" && [ "$t" = "$2" ]; }
# Sleep SECONDS without a process: a read that times out on a pipe this shell holds both ends of (never ready).
nap() {
  [ -n "${NAP_FD-}" ] || exec {NAP_FD}<> <(:) || { sleep "$1"; return 0; }
  read -rt "$1" -u "$NAP_FD" _ 2> /dev/null || true
}
read_pid() { [ -r "$1" ] && read -r "$2" "$3" < "$1"; }
# "PID STARTTIME" into FILE, atomically.
record_pid() { echo "$1 $(starttime "$1")" > "$2.tmp" && mv -f "$2.tmp" "$2"; }
# Every process carrying this run's marker in its environment (the supervisor puts RELAUNCH_RUN=<run folder>
# into the trainer's environment; launchers like torchrun pass it on to ranks they start in sessions of their own).
# One grep over every environment (NUL-separated entries, -z): not two processes per process on the host.
marked_pids() { local f p; while IFS= read -r f; do p=${f#/proc/}; echo "${p%/environ}"; done < <(grep -lszxF -- "RELAUNCH_RUN=$1" /proc/[0-9]*/environ); return 0; }
