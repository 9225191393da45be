#!/usr/bin/env bash
# shellcheck shell=bash
# shellcheck source=lib.sh
. ./lib.sh
# shellcheck source=recorder.sh
. ./recorder.sh
# relaunch supervisor. $1: the run folder; its `spec` holds repo, venv bin, command, then KEY=VALUE entries.
# Writes RUN/pid (the trainer: the command's process, or the process it backgrounded), RUN/log_writer_pid,
# and, when the trainer exits, RUN/exit_code; a trainer the command backgrounded leaves RUN/detached instead.
set -o pipefail
run_dir=$1
state=${run_dir%/runs/*}
log=$(cat "$run_dir/log_path")
run_id=${run_dir##*/}
mapfile -d '' spec < "$run_dir/spec"
repo=${spec[0]} venv_bin=${spec[1]} command=${spec[2]}
# A note that cannot be written (a full log disk) is lost, and says so by its status; nothing else depends on it.
note() { printf '[relaunch] %s run %s: %s\n' "$(date -u +%FT%TZ)" "$run_id" "$1" >> "$log"; } 2> /dev/null
finish() { echo "$1" > "$run_dir/exit_code.tmp" && mv -f "$run_dir/exit_code.tmp" "$run_dir/exit_code"; }
# A handler (not an ignore) so the trainer still gets default signal handling.
trap 'true' TERM HUP INT
# Where this run's text begins in its log (RUN/log_offset, "SIZE SUM"): the log's size before this supervisor's first
# write. The file may hold earlier runs' text (a target pointing many runs at one file, a log appended to): their
# failures are not this run's, and the poll reads failures only from here. SUM is cksum's CRC of the 64 bytes before
# it, so a poll can tell the log was rewritten under it (copytruncate): then all of the new content is this run's.
record_log_offset() {
  local size from sum=''
  size=$(stat -L -c %s -- "$1" 2> /dev/null) || size=0
  from=$(( size > 64 ? size - 64 : 0 ))
  [ "$size" -gt 0 ] && { sum=$(tail -c +$((from + 1)) -- "$1" 2> /dev/null | head -c $((size - from)) | cksum); sum=${sum%% *}; }
  printf '%s %s\n' "$size" "$sum" > "$2.tmp" && mv -f "$2.tmp" "$2"
}
record_log_offset "$log" "$run_dir/log_offset"
record_pid "$$" "$run_dir/supervisor_pid"
cd -- "$repo" || { note "cannot cd to $repo"; finish 126; exit 126; }
note "start: $command"

# The trainer's output reaches the log through this writer, never through a redirect of its own: with `>> log`
# a full log disk failed the trainer's own writes (Python's print raised) and killed it. cat ends at its first
# failed write (tee would drop the file and never write it again); the writer then reads on into /dev/null,
# so the trainer never blocks on a full pipe, and every 2 s tries to append a note: once that is written,
# space is back and so is the log. TERM, HUP and INT are ignored: a stop's SIGTERM to this process group must
# leave the trainer's last words (a save, a traceback) somewhere to go; the writer ends when the last holder of
# the pipe (the trainer and its children) closes it. It carries no marker: it is not the trainer.
log_writer() {
  trap '' TERM HUP INT
  unset RELAUNCH_RUN RELAUNCH_TARGET
  local since rc
  while :; do
    cat >> "$log" && return 0
    since=$(date -u +%FT%TZ)
    while :; do
      timeout 2 cat > /dev/null; rc=$?
      # 124: two seconds passed; 127: no `timeout` here, so drain to the end; else cat ended: the end of the output.
      [ "$rc" = 124 ] || { [ "$rc" = 127 ] && cat > /dev/null; return 0; }
      note "the log could not be written from $since (disk full?): the trainer's output of that time is lost" && break
    done
  done
}
exec {to_log}> >(log_writer)
writer=$! wstart=''
starttime_into wstart "$writer"
record_pid "$writer" "$run_dir/log_writer_pid"

# The environment reaches the trainer as environment: `env` takes each KEY=VALUE as one argument.
# RELAUNCH_RUN marks every process of this run, also ranks a launcher starts in sessions of their own;
# RELAUNCH_TARGET marks it as this target's, whichever run it belongs to (a launch refuses beside one).
# {to_log}>&-: the trainer gets the pipe as stdout and stderr only, not as a stray descriptor its children keep.
# -o pipefail: `python train.py | tee -a log` as the launch command exits with python's status, not tee's 0 (this
# shell's own option does not reach the `bash -c`; a script the command runs keeps its own options).
PATH="$venv_bin:$PATH" env -- "RELAUNCH_RUN=$run_dir" "RELAUNCH_TARGET=$state" "${spec[@]:3}" bash -o pipefail -c "$command" \
  >&"$to_log" 2>&1 {to_log}>&- < /dev/null &
pid=$!
exec {to_log}>&-
record_pid "$pid" "$run_dir/pid"
# The run's progress record from its first moment (RUN/record_seconds: launch.sh's; a poll starts one where this did not).
record_s=''
slurp record_s "$run_dir/record_seconds"
[ -n "$record_s" ] && start_recorder "$run_dir" "$record_s"
cstart=''
starttime_into cstart "$pid"
# A wrapper script (`bash start.sh` running `python train.py 2>&1 | tee -a log`) exits with its pipeline's last
# command's status: tee's 0, however its trainer ended (a SIGKILL, a traceback). Its trainer is not our child, so its
# status cannot be known; what can be seen is the shape: the run's program (python, torchrun) writing into a pipe that
# a sibling reads, under a shell that is not this one's `bash -o pipefail -c`. Watched from the side while the command
# runs (its own subshell, looking every 0.1 s at first, every 10 s at most, until seen): RUN/pipeline names what was
# seen, and an exit 0 then comes with RUN/exit_masked. Started after the log pipe is closed here: it holds no end of it.
cmdline_of() { local -a a=(); { mapfile -d '' a < "/proc/$1/cmdline"; } 2> /dev/null; printf '%s' "${a[*]}" | cut -c1-200; }
watch_pipeline() {
  trap - TERM HUP INT
  local ms=100 p comm pp out sib
  local -a st cand cmd
  local -A parent=()
  while alive "$pid" "$cstart"; do
    cand=() parent=()
    for p in $(marked_pids "$run_dir"); do
      { read -r comm < "/proc/$p/comm" && st=$(< "/proc/$p/stat"); } 2> /dev/null || continue
      st=${st##*) }; read -ra st <<< "$st"
      parent[$p]=${st[1]}
      case $comm in python* | torchrun | pt_* | deepspeed | accelerate) cand+=("$p") ;; esac
    done
    for p in "${cand[@]}"; do
      pp=${parent[$p]}
      # The command's own process (it exec'd the program), or a rank or worker of the program: not a mask.
      [ "$p" = "$pid" ] && continue
      [[ " ${cand[*]} " == *" $pp "* ]] && continue
      # This supervisor's own `bash -o pipefail -c` passes a failure in its pipeline on.
      cmd=()
      [ "$pp" = "$pid" ] && { mapfile -d '' cmd < "/proc/$pid/cmdline"; } 2> /dev/null
      [ "${cmd[*]:1:3}" = "-o pipefail -c" ] && continue
      out=$(readlink "/proc/$p/fd/1" 2> /dev/null) || continue
      [[ $out == pipe:* ]] || continue
      for sib in "${!parent[@]}"; do
        if [ "${parent[$sib]}" != "$pp" ] || [ "$sib" = "$p" ] || [ "$(readlink "/proc/$sib/fd/0" 2> /dev/null)" != "$out" ]; then continue; fi
        printf '%s\n' "the trainer PID $p (\`$(cmdline_of "$p")\`) wrote into a pipe read by PID $sib (\`$(cmdline_of "$sib")\`) inside \`$(cmdline_of "$pp")\` (PID $pp): that script's exit status is its pipeline's last command's, not the trainer's" \
          > "$run_dir/pipeline.tmp" && mv -f "$run_dir/pipeline.tmp" "$run_dir/pipeline"
        return 0
      done
    done
    nap "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
    ms=$(( ms * 2 > 10000 ? 10000 : ms * 2 ))
  done
}
watch_pipeline &
watcher=$! wst=''
starttime_into wst "$watcher"
wait "$pid"; code=$?
while kill -0 "$pid" 2> /dev/null; do wait "$pid"; code=$?; done
# Ended here (by PID and start time: not a process that took its PID) so that what it saw is all written now.
alive "$watcher" "$wst" && kill "$watcher" 2> /dev/null
wait "$watcher" 2> /dev/null

# Whether the trainer lives comes from its marked processes, not from the command's exit: `nohup python train.py &`
# exits 0 at once. A child on its way out (a worker ending with its parent) is gone within the half second this
# waits; RUN/pid names the oldest marked process at once, so a poll meanwhile sees a trainer that lives.
# A command killed by a signal (code 128+N: torchrun OOM-killed) did not background anything: the trainer died,
# its code is recorded, and what it left (ranks in sessions of their own) is the stop's to end, by the marker.
first=$(< "$run_dir/pid") marked=() follow=''
[ "$code" -lt 128 ] && mapfile -t marked < <(marked_pids "$run_dir") && follow=$(oldest_pid "${marked[@]}")
# A child in the middle of its exec (`nohup` becoming python) shows no environment for a moment (a loaded host makes
# that moment long): a 0 with nothing marked is looked at again for half a second before it is the trainer's own.
if [ "$code" = 0 ] && [ -z "$follow" ]; then
  now_us t; end=$(( t + 500000 ))
  while [ -z "$follow" ] && now_us t && [ "$t" -lt "$end" ]; do
    nap 0.05
    mapfile -t marked < <(marked_pids "$run_dir"); follow=$(oldest_pid "${marked[@]}")
  done
fi
[ -n "$follow" ] && record_pid "$follow" "$run_dir/pid"
# A command that exited 0 and left marked processes behind backgrounded its trainer, however soon that died: 0 is
# the launcher's code, not the trainer's, and a `finished` for a trainer that died is the lie judging must not tell.
backgrounded=''
[ "$code" = 0 ] && [ -n "$follow" ] && backgrounded=1
now_us t; end=$(( t + 500000 ))
while { [ -n "$follow" ] || alive "$writer" "$wstart"; } && now_us t && [ "$t" -lt "$end" ]; do
  nap 0.05
  if [ -n "$follow" ]; then mapfile -t marked < <(marked_pids "$run_dir"); follow=$(oldest_pid "${marked[@]}"); fi
done
if [ -z "$follow" ] && [ -z "$backgrounded" ]; then
  # The command's own process was the trainer (or all it left ended with it): its code is the trainer's.
  [ "$(< "$run_dir/pid")" = "$first" ] || { echo "$first" > "$run_dir/pid.tmp" && mv -f "$run_dir/pid.tmp" "$run_dir/pid"; }
  # An exit 0 through a wrapper's pipeline says nothing of the trainer: recorded before the code, so no poll reads a 0
  # without it. Judging calls it finished only where the trainer said it finished.
  [ "$code" = 0 ] && [ -s "$run_dir/pipeline" ] && cp -f -- "$run_dir/pipeline" "$run_dir/exit_masked.tmp" \
    && mv -f -- "$run_dir/exit_masked.tmp" "$run_dir/exit_masked"
  finish "$code"
  note "trainer exited with code $code"
  exit "$code"
fi
[ -n "$follow" ] && record_pid "$follow" "$run_dir/pid"
fpid='' fstart=''
read_pid "$run_dir/pid" fpid fstart
note "launch_command exited $code but its trainer PID $fpid lives on (backgrounded): following it"
while [ -n "$follow" ]; do
  read_pid "$run_dir/pid" fpid fstart
  while alive "$fpid" "$fstart"; do nap 0.2; done
  mapfile -t marked < <(marked_pids "$run_dir")
  follow=$(oldest_pid "${marked[@]}")
  [ -n "$follow" ] && record_pid "$follow" "$run_dir/pid" && note "trainer PID $fpid ended; PID $follow of this run lives on: following it"
done
# The writer drains what the trainer printed last; bounded: a process that left the marker behind may hold the pipe.
now_us t; end=$(( t + 1000000 ))
while alive "$writer" "$wstart" && now_us t && [ "$t" -lt "$end" ]; do nap 0.02; done
# No exit code: the backgrounded trainer's is unknowable (it was not our child). Judging reads a death without one.
printf 'launch_command exited %s; the trainer it backgrounded (PID %s) ended, its exit code unknown\n' "$code" "$fpid" \
  > "$run_dir/detached"
note "the backgrounded trainer ended (PID $fpid): its exit code cannot be known"
exit 0
