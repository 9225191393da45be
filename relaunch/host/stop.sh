#!/usr/bin/env bash
# shellcheck shell=bash
# Stop what relaunch started or adopted for this target, and nothing else: the recorded supervisor and its
# process group, the recorded trainer and every descendant of either, every process carrying the run's or the
# target's marker, the log writer, and the run's own tmux pane. One SIGTERM per process, GRACE seconds to save
# and exit, then SIGKILL for the survivors; a survivor of SIGKILL is named and the exit is 3.
#   $1 STATE  $2 SESSION  $3 GRACE (seconds, may be fractional)
#   $4 `deliberate` (a person's `relaunch stop`: STATE/stopped is written before the first signal, so the nightly
#      check and the watch leave the target stopped, also if the stop then fails) or `recovery` (a recovery's own
#      stop step: no mark)
# Other panes of the session, and a session that holds nothing relaunch started, are left running and said.
# shellcheck source=lib.sh
. ./lib.sh
state=$1 session=$2 grace=$3 mode=${4:-recovery} identity=${5:-}
if owner=$(foreign_state "$state" "$identity"); then
  echo "state folder $state belongs to another target ($owner), not to this one ($identity): nothing stopped. Give this target its own state_dir"
  exit 20
fi
# A stop asked for from inside a trainer's environment: what it starts (ps, grep) must not carry the marker.
unset RELAUNCH_RUN RELAUNCH_TARGET
run_id=$(current_run "$state")
# A target never launched here has no state folder: a stop that ends nothing leaves the host without one.
had_state=''
[ -d "$state" ] && had_state=1
run='' pid='' pstart='' spid='' sstart='' lpid='' lstart='' panepid='' panestart='' pane_id=''
if [ -n "$run_id" ]; then
  run=$(run_folder "$state" "$run_id")
  read_pid "$run/pid" pid pstart
  read_pid "$run/supervisor_pid" spid sstart
  read_pid "$run/log_writer_pid" lpid lstart
  read_pid "$run/pane" panepid panestart
  slurp pane_id "$run/pane_id"
fi

# --- What is ours: PID -> start time as first seen (a PID compared later must still have it: no PID reuse).
declare -A start=() role=() skip=() ppid_of=() pgid_of=() kids=()
order=()   # every process of ours, in the order found
fresh=()   # those the last collect() found
listing() {
  ppid_of=() pgid_of=() kids=()
  local p pp pg
  while read -r p pp pg; do ppid_of[$p]=$pp; pgid_of[$p]=$pg; kids[$pp]+="$p "; done < <(ps -e -o pid=,ppid=,pgid=)
}
# PID joins as ROLE with start time T (the recorded one, or its own now); children of ours count only while
# their parent still has the start time it joined with, so a reused parent PID brings in nobody.
join() {
  local p=$1 r=$2 t=${3-}
  [ -n "${start[$p]-}" ] || [ -n "${skip[$p]-}" ] || [ "${ppid_of[$p]-}" = "$$" ] || under_writer "$p" && return 0
  if [ -n "$t" ]; then alive "$p" "$t" || return 0; else starttime_into t "$p" || return 0; fi
  start[$p]=$t role[$p]=$r; order+=("$p"); fresh+=("$p")
}
ours() { [ -n "${start[$1]-}" ] && alive "$1" "${start[$1]}"; }
# Every process carrying the target's marker (RELAUNCH_TARGET=STATE) or a run's (RELAUNCH_RUN=STATE/runs/...):
# also a trainer of an earlier run of this target that outlived its session. Not the legacy state folder's runs:
# two targets with one log_dir share it, and a stop of one would end the other's trainer.
marked() { target_marked_pids "$state" "$state"; }
# Whether PID is the log writer or runs under it (its cat): it shares the supervisor's group, and goes last.
under_writer() {
  local p=$1 n=0
  [ -n "$lpid" ] || return 1
  while [ -n "$p" ] && [ "$p" -gt 1 ] && [ "$n" -lt 64 ]; do [ "$p" = "$lpid" ] && return 0; p=${ppid_of[$p]-}; n=$((n + 1)); done
  return 1
}
collect() {
  fresh=()
  listing
  local p q queue
  alive "$spid" "$sstart" && join "$spid" supervisor "$sstart"
  alive "$pid" "$pstart" && join "$pid" trainer "$pstart"
  # The supervisor leads its process group. A group whose leader is gone (no process has that PID: the kernel
  # keeps a group's PID unused while the group lives) is still the supervisor's.
  if [ -n "$spid" ] && { alive "$spid" "$sstart" || [ ! -e "/proc/$spid" ]; }; then
    for p in "${!pgid_of[@]}"; do [ "${pgid_of[$p]}" = "$spid" ] && join "$p" "supervisor's group"; done
  fi
  for p in $(marked); do join "$p" marked; done
  # Every descendant (a setsid child with a cleared environment carries no marker but keeps its parent).
  queue=("${order[@]}")
  while [ ${#queue[@]} -gt 0 ]; do
    p=${queue[0]}; queue=("${queue[@]:1}")
    ours "$p" || continue
    for q in ${kids[$p]-}; do
      [ -n "${start[$q]-}" ] && continue
      join "$q" "child of $p" && [ -n "${start[$q]-}" ] && queue+=("$q")
    done
  done
}
# Never ours, whatever they carry: this script and its ancestors, init, and the tmux server (a server first
# started from inside a trainer has the trainer's environment, and it serves every session on the host).
listing
p=$$; while [ -n "$p" ] && [ "$p" != 0 ]; do skip[$p]=1; p=${ppid_of[$p]-}; done
skip[1]=1
server=$(tmux list-sessions -F '#{pid}' 2>/dev/null | head -n 1)
[ -n "$server" ] && skip[$server]=1
# The log writer goes last: it must see the trainer's last words (and a trainer writing to a pipe with no reader
# would die of SIGPIPE mid-save).
if alive "$lpid" "$lstart"; then skip[$lpid]=1; else lpid=""; fi
comm_of() { local c; { c=$(tr '\0' ' ' < "/proc/$1/cmdline"); } 2> /dev/null; printf '%s' "${c% }"; }
named() { local p out=(); for p in "$@"; do out+=("$p (${role[$p]-log writer})"); done; printf '%s' "${out[*]}"; }

# --- The run's own pane: the recorded one (checked against tmux and its start time), or, for runs recorded
# before panes were, the one whose process is this run's launcher or its `tail --pid=SUPERVISOR`.
panes=() mine=() others=()
if tmux has-session -t "=$session" 2>/dev/null; then
  mapfile -t panes < <(tmux list-panes -s -t "=$session" -F '#{pane_id} #{pane_pid}' 2>/dev/null)
fi
if [ -n "$pane_id" ] && alive "$panepid" "$panestart" \
  && [ "$(tmux display-message -p -t "$pane_id" '#{pane_pid}' 2>/dev/null)" = "$panepid" ]; then
  mine=("$pane_id $panepid")
fi
for entry in "${panes[@]}"; do
  read -r id pp <<< "$entry"
  [ ${#mine[@]} -gt 0 ] && [ "$id" = "${mine[0]%% *}" ] && continue
  cmd=$(comm_of "$pp")
  if [ -z "$pane_id" ] && [ -n "$run" ] && [ ${#mine[@]} -eq 0 ] \
    && { [[ " $cmd " == *" $run/launcher.sh "* ]] || { [ -n "$spid" ] && [[ " $cmd " == *" --pid=$spid "* ]]; }; }; then
    mine=("$id $pp")
  else
    others+=("$id $pp")
  fi
done
[ ${#mine[@]} -gt 0 ] && read -r my_pane my_panepid <<< "${mine[0]}" && starttime_into my_panestart "$my_panepid"

# --- One SIGTERM each, then the grace; processes born during it (or found marked since) get theirs once too.
collect
signalled=()
# A process stopped by a signal (T: a person's SIGSTOP or Ctrl-Z) keeps a SIGTERM pending and never saves: it is
# continued right after, as `kill -TERM PID; kill -CONT PID` by hand, so that it handles the TERM within the grace.
term() {
  local p
  for p in "$@"; do kill -TERM "$p" 2> /dev/null && signalled+=("$p") && kill -CONT "$p" 2> /dev/null; done
}
us_of() { awk -v s="$1" 'BEGIN { printf "%d", s * 1000000 }'; }
# FILE=the host's epoch time in seconds, with microseconds (what Python's float() reads), atomically.
stamp() { local us; now_us us; printf '%d.%06d\n' "$((us / 1000000))" "$((us % 1000000))" > "$1.tmp" && mv -f "$1.tmp" "$1"; }
# A person's stop is on record before its first signal: the trainer's death of that SIGTERM (143) is seen by the watch
# the moment its exit is recorded, and a death seen before the stop's record would be handed to recovery as a death, and
# relaunched. Recorded once there is a target here (state, or a process of it): a stop of a target never launched here
# writes nothing. A stop that then fails (a survivor of SIGKILL, GPUs held) keeps it: a person asked for the stop.
recorded=''
if [ "$mode" = deliberate ] && { [ -n "$had_state" ] || [ ${#order[@]} -gt 0 ]; }; then
  mkdir -p "$state" && rm -f -- "$state/stopped_how" && stamp "$state/stopped" && recorded=1 \
    && echo "recorded a deliberate stop in $state/stopped: checks and the watch leave the target stopped until \`relaunch recover\`"
fi
# Said where a failed stop ends: the record stands, so nothing relaunches what a person is still stopping by hand.
kept() {
  [ -n "$recorded" ] && echo "the deliberate stop stays recorded ($state/stopped): checks and the watch leave the target stopped; once its processes are gone, \`relaunch recover\` starts it again"
  return 0
}
if [ ${#order[@]} -gt 0 ]; then
  # The first stop of a run keeps its time: a checkpoint begun after it may have been cut short by a later SIGKILL.
  [ -n "$run" ] && [ ! -e "$run/stop_term_at" ] && stamp "$run/stop_term_at"
  term "${order[@]}"
  echo "sent SIGTERM to ${#signalled[@]} process(es): $(named "${signalled[@]}")"
fi
t0=0 t=0; now_us t0
deadline=$((t0 + $(us_of "$grace")))
looks=0
live=()
while [ ${#order[@]} -gt 0 ]; do
  live=(); for p in "${order[@]}"; do ours "$p" && live+=("$p"); done
  # A fresh listing every 0.2 s (ps and a grep over every environment): the 50 ms look above costs no process.
  if [ $((looks % 4)) = 0 ] || [ ${#live[@]} = 0 ]; then
    before=${#signalled[@]}
    collect
    if [ ${#fresh[@]} -gt 0 ]; then
      term "${fresh[@]}"; live+=("${fresh[@]}")
      [ ${#signalled[@]} -gt "$before" ] && echo "sent SIGTERM to $((${#signalled[@]} - before)) process(es) born since: $(named "${signalled[@]:before}")"
    fi
  fi
  [ ${#live[@]} = 0 ] && break
  now_us t; [ "$t" -ge "$deadline" ] && break
  looks=$((looks + 1)); nap 0.05
done

# --- SIGKILL for what outlived the grace. The supervisor last: once its trainer is gone it records the exit
# code and ends by itself, and the health poll needs that record.
killed=()
wait_gone() { # SECONDS PID...: true once none of them is alive (zombies count as gone)
  local end p left; now_us end; end=$((end + $(us_of "$1"))); shift
  while :; do
    left=0; for p in "$@"; do ours "$p" && left=1; done
    [ "$left" = 0 ] && return 0
    now_us p; [ "$p" -ge "$end" ] && return 1
    nap 0.02
  done
}
if [ ${#live[@]} -gt 0 ]; then
  [ -n "$run" ] && stamp "$run/stop_killed_at"
  rest=()
  for p in "${live[@]}"; do
    if [ "$p" = "$spid" ]; then rest+=("$p"); elif kill -KILL "$p" 2> /dev/null; then killed+=("$p"); fi
  done
  if [ ${#rest[@]} -gt 0 ] && ! wait_gone 2 "${rest[@]}"; then
    for p in "${rest[@]}"; do kill -KILL "$p" 2> /dev/null && killed+=("$p"); done
  fi
  [ ${#killed[@]} -gt 0 ] && echo "still alive after ${grace} s: sent SIGKILL to $(named "${killed[@]}")"
fi
wait_gone 5 "${order[@]}"
survivors=()
for p in "${order[@]}"; do ours "$p" && survivors+=("$p"); done

# --- The log writer: it ends by itself once the trainer's output ends (whoever holds the pipe after 2 s is no
# process of ours); if not, one SIGTERM (relaunch's own writer ignores it), then SIGKILL.
if alive "$lpid" "$lstart"; then
  start[$lpid]=$lstart
  if ! wait_gone 2 "$lpid"; then
    term "$lpid"
    echo "sent SIGTERM to the log writer $lpid"
    if ! wait_gone 1 "$lpid"; then kill -KILL "$lpid" 2> /dev/null && killed+=("$lpid") && echo "sent SIGKILL to the log writer $lpid"; fi
    wait_gone 2 "$lpid" || survivors+=("$lpid")
  fi
fi
if [ ${#survivors[@]} -gt 0 ]; then
  for p in "${survivors[@]}"; do echo "could not stop $p ($(comm_of "$p")): alive after SIGKILL"; done
  echo "could not stop: ${survivors[*]}; what to do: look at them (ps -o stat,wchan -p PID: D is a process stuck in the kernel, often a GPU driver) and end them by hand"
  kept
  exit 3
fi

# --- The run's own pane closes with it (tail --pid follows the supervisor); close it now if it has not. Only
# that pane: the session goes with its last pane, and a window the user opened there stays.
if [ -n "${my_pane-}" ] && [ -n "${my_panestart-}" ] && alive "$my_panepid" "$my_panestart" \
  && [ "$(tmux display-message -p -t "$my_pane" '#{pane_pid}' 2>/dev/null)" = "$my_panepid" ]; then
  tmux kill-pane -t "$my_pane" 2> /dev/null && echo "closed the run's pane $my_pane of session $session"
  start[$my_panepid]=$my_panestart
  wait_gone 5 "$my_panepid" || echo "the pane's process $my_panepid ($(comm_of "$my_panepid")) is still alive after its pane closed"
fi
if [ ${#others[@]} -gt 0 ]; then
  left=() lpids=()
  for entry in "${others[@]}"; do
    read -r id pp <<< "$entry"
    # A pane whose own process was ours (an adopted run's) closed with it; one whose process ended is gone too.
    if [ -n "${start[$pp]-}" ] || ! starttime_into t "$pp"; then continue; fi
    left+=("$id (PID $pp: $(comm_of "$pp"))") lpids+=("$pp")
  done
  if [ ${#left[@]} -gt 0 ] && [ ${#mine[@]} -gt 0 ]; then
    echo "other panes of session $session left running: ${left[*]}"
  elif [ ${#left[@]} -gt 0 ]; then
    echo "session $session holds processes relaunch did not start (PIDs ${lpids[*]}): left alone"
  fi
fi

# --- Wait for the GPUs to let go of the stopped processes' memory.
if command -v nvidia-smi > /dev/null 2>&1 && [ ${#order[@]} -gt 0 ]; then
  end=$((SECONDS + 60)) busy=0
  while [ "$SECONDS" -lt "$end" ]; do
    held=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2> /dev/null | tr -d ' ')
    busy=0; for p in "${order[@]}"; do grep -qx "$p" <<< "$held" && busy=1; done
    [ "$busy" = 0 ] && break; sleep 0.5
  done
  [ "$busy" = 0 ] || { echo "GPU memory still held by ${order[*]} 60 s after they exited; what to do: nvidia-smi shows who holds it"; kept; exit 4; }
fi
echo "stopped (${#order[@]} process(es))"
