#!/usr/bin/env bash
# shellcheck shell=bash
# The watch's round (`relaunch watch`): only what is cheap to read of the current run: whose the state folder is, the
# run on record, whether its trainer and its supervisor live (recorded PID and start time), its exit record, and a
# person's stop, read last. No log, no process table, no GPU: the full check reads those once something changed.
# A live run's progress record (recorder.sh) comes last, thinned: the watch finds a hang from it (no process table read
# here: the recorder read it), and a run without a recorder gets one ($4: its sample interval; 0: none started).
# shellcheck source=lib.sh
. ./lib.sh
# shellcheck source=recorder.sh
. ./recorder.sh
state=$1 identity=$2 hold_ms=${3:-0} record_s=${4:-0}
if owner=$(foreign_state "$state" "$identity"); then echo "foreign $owner"; exit 0; fi
run_id=$(current_run "$state") || run_id=''
echo "run_id $run_id"
if [ -z "$run_id" ]; then [ -e "$state/stopped" ] && echo "stopped 1"; exit 0; fi
run=$(run_folder "$state" "$run_id")
pid='' pstart='' spid='' sstart='' exit_code=''
read_pid "$run/pid" pid pstart
read_pid "$run/supervisor_pid" spid sstart
# Held (hold_ms): the look returns when the recorded trainer's exit is recorded (or trainer and supervisor are gone)
# or a person stops the target, else when the hold is over; so the watch hears of a death within a nap, whatever its interval. A nap is a
# read that times out (no process): five reads of /proc a second, while the trainer lives.
t=0
now_us t; end=$(( t + hold_ms * 1000 ))
# A trainer just dead is held for too, while its supervisor lives to record the exit: the look then returns a death
# with its code rather than one still being recorded.
while [ "$t" -lt "$end" ] && [ ! -e "$run/exit_code" ] && [ ! -e "$state/stopped" ] && { alive "$pid" "$pstart" || alive "$spid" "$sstart"; }; do
  nap 0.2; now_us t
done
# Liveness before the exit record (as snapshot.sh): a supervisor ending between the two reads no death without a code.
# A person's stop last, after both: a stop is recorded before its first signal (stop.sh), so a death this look reports
# comes with the stop that caused it, and the watch hands no stop over as a death. Read first, a stop made between the
# reads would leave its SIGTERM's death (143) looking like a crash.
# A process on its way out (a zombie not yet reaped, a SIGKILL pending) is read as gone: it trains no more.
pid_up=0 sup_up=0
alive "$pid" "$pstart" && ! dying "$pid" && pid_up=1
alive "$spid" "$sstart" && sup_up=1
slurp exit_code "$run/exit_code"
[ -e "$state/stopped" ] && echo "stopped 1"
echo "pid $pid"
echo "pid_alive $pid_up"
echo "supervisor_alive $sup_up"
echo "exit_code $exit_code"
# When the run was launched, and the host's clock: a run with no PID recorded yet is a launch under way (launch.sh waits
# for the supervisor's record), not a death, for as long as a launch may take.
started=''
slurp started "$run/started_at"
echo "started_at $started"
now_us t
echo "now ${t%??????}.${t: -6}"
if [ "$pid_up" = 1 ]; then
  [ "$record_s" != 0 ] && [ -w "$run" ] && start_recorder "$run" "$record_s"
  echo "progress"
  print_progress "$run"
fi
