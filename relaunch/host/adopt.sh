#!/usr/bin/env bash
# shellcheck shell=bash
# Adopt a run a person started in the target's tmux session: record it as the current run (PIDs with start
# times, its pane, its log), so that later polls judge it and later stops and recoveries treat it as relaunch's.
# Nothing is signalled. $3: the log the run writes ('' : found from the pane's processes), $4: the target's
# identity (STATE/target), $5: the new run id, $7: the target's log_dir (a log the run holds open for writing there).
# shellcheck source=lib.sh
. ./lib.sh
state=$1 session=$2 given=$3 identity=$4 new_id=$5 wait_s=${6:-30} logdir=${7:-}
# Exit codes: 12 a folder could not be made; 17 another launch or adoption holds the lock; 20 the state folder
# belongs to another target (lib.sh claim_state); 21 the session is relaunch's own run; 22 a trainer of this
# target recorded by relaunch is alive elsewhere; 23 no such tmux session; 24 no log found (name it: --log);
# 25 the --log given is not a regular file; 26 nothing runs in the session (idle shells, or it ended meanwhile).
# shellcheck source=panes.sh
. ./panes.sh
run_id='' run='' spid='' pid='' pstart='' rpane='' rpane_start=''
if [ -n "$given" ]; then
  [[ $given == /* ]] || given=$PWD/$given
  [ -f "$given" ] || { echo "--log $given is not a regular file on this host: name the file the run writes its log to"; exit 25; }
fi
tmux has-session -t "=$session" 2> /dev/null || { echo "no tmux session $session on this host: nothing to adopt (is tmux_session right?)"; exit 23; }
mkdir -p "$state" || exit 12
# One launch or adoption at a time (launch.sh takes the same lock): never two runs recorded as current.
exec 9>> "$state/launch.lock"
flock -w "${wait_s%.*}" 9 || { echo "a launch or adoption holds $state/launch.lock for over ${wait_s}s: try again when it is done"; exit 17; }
# Another target's state folder is refused before anything of it is read; it is claimed only by the adoption.
[ -e "$state/target" ] && claim_state "$state" "$identity"
run_id=$(current_run "$state") && run=$(run_folder "$state" "$run_id")
if [ -n "$run_id" ]; then
  read_pid "$run/pid" pid pstart
  read_pid "$run/supervisor_pid" spid _
  read_pid "$run/pane" rpane rpane_start
fi
read_panes "$session"
[ "$OURS" = 1 ] && { echo "tmux session $session runs relaunch's own run $run_id: nothing to adopt"; exit 21; }
if alive "$pid" "$pstart"; then
  echo "the trainer of run $run_id (PID $pid) is alive outside tmux session $session: adopting the session's run would make two trainers of one target; stop one of them first"
  exit 22
fi
# The pane to adopt: the one whose processes hold the given log open, else the first whose log can be found.
pane='' pane_id='' trainer='' log='' how='' writer=''
for line in "${PANES[@]}"; do
  pane_tops "${line%% *}"
  [ ${#TOPS[@]} -gt 0 ] || continue  # an idle shell: nothing was started in it
  if [ -n "$given" ]; then
    descendants "${line%% *}"
    holder=''
    for p in "${line%% *}" "${DESC[@]}"; do
      for fd in /proc/"$p"/fd/*; do [ -f "$fd" ] && [ "$fd" -ef "$given" ] && { holder=$p; break 2; }; done
    done
    [ -n "$holder" ] || [ -z "$pane" ] || continue
    pane=${line%% *} pane_id=${line#* } log=$given how=--log writer=$holder
    [ -n "$holder" ] && break
  elif pane_log "${line%% *}" "$logdir"; then
    pane=${line%% *} pane_id=${line#* } log=$LOGF how=$HOW writer=$WRITER
    break
  fi
done
if [ -z "$pane" ]; then
  what=''
  for line in "${PANES[@]}"; do pane_tops "${line%% *}"; for p in "${TOPS[@]}"; do cmdline_into c "$p"; what="$what; $p ${c:0:120}"; done; done
  [ -n "$what" ] || { echo "tmux session $session runs nothing but idle shells: nothing to adopt"; exit 26; }
  echo "no log found for what runs in tmux session $session (${what#; }): no tee, no standard output to a file; if it is a training run, name its log: relaunch adopt TARGET --log PATH"
  exit 24
fi
# The trainer: the pane's process, or what an interactive shell started there (not the tee beside it).
pane_tops "$pane"
trainer=${TOPS[0]}
for p in "${TOPS[@]}"; do
  comm=''
  { read -r comm < "/proc/$p/comm"; } 2> /dev/null
  [ "$comm" != tee ] && { trainer=$p; break; }
done
tstart='' pane_start='' trainer_cmd=''
if ! starttime_into tstart "$trainer" || ! starttime_into pane_start "$pane"; then
  echo "the run in tmux session $session (PID $trainer) ended while it was being adopted"
  exit 26
fi
claim_state "$state" "$identity"
run=$(run_folder "$state" "$new_id")
mkdir -p "$run" || exit 12
echo "$trainer $tstart" > "$run/pid"
echo "$pane $pane_start" > "$run/pane"
printf '%s\n' "$pane_id" > "$run/pane_id"
printf '%s\n' "$log" > "$run/log_path"
# Where the poll starts reading this run's failures (RUN/log_offset, "SIZE SUM" as the supervisor writes it): the log's
# size now. The run is alive now, so nothing printed before could have ended it, and a log appended to (`tee -a`,
# `>>`) holds earlier runs' deaths before it. Its step lines before it are still read while it lives (the poll's tail),
# as its progress; once it is dead only text from here is read. SUM (cksum of the 64 bytes before) tells a rewrite.
size=$(stat -L -c %s -- "$log" 2> /dev/null) || size=0
from=$(( size > 64 ? size - 64 : 0 )) sum=''
[ "$size" -gt 0 ] && { sum=$(tail -c +$((from + 1)) -- "$log" 2> /dev/null | head -c $((size - from)) | cksum); sum=${sum%% *}; }
printf '%s %s\n' "$size" "$sum" > "$run/log_offset"
printf '%s\n' "$how" > "$run/adopted"
: > "$run/checkpoint"
[ -n "$writer" ] && record_pid "$writer" "$run/log_writer_pid"
cmdline_into trainer_cmd "$trainer"
printf '%s\n' "$trainer_cmd" > "$run/command"
# When the process started, host clock: /proc/PID/stat's start (clock ticks since boot) plus the boot time.
awk -v t="$tstart" -v hz="$(getconf CLK_TCK)" '/^btime / { printf "%.2f\n", $2 + t / hz }' /proc/stat > "$run/started_at"
descendants "$trainer"
printf '%s\n' "$trainer" "${DESC[@]}" > "$run/tree"
printf '%s\n' "$new_id" > "$state/current.tmp" && mv -f "$state/current.tmp" "$state/current"
rm -f -- "$state/stopped"
echo "adopted $new_id"
echo "pid $trainer"
echo "pane $pane_id"
echo "how $how"
echo "log $log"
echo "command ${trainer_cmd:0:300}"
