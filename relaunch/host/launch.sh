#!/usr/bin/env bash
# shellcheck shell=bash
# Refuse to launch beside a live trainer or onto a half-built venv or cache; start the launcher in tmux.
# Arguments: STATE SESSION RUN_ID LOG SUPERVISOR_TEXT LAUNCHER_TEXT WAIT_S VENV CACHE CHECKPOINT IDENTITY
#   LEGACY_STATE CHECKPOINT_DIR RECORD_S (how often the run's recorder samples it, recorder.sh), then the trainer's spec (repo, venv bin, command, KEY=VALUE...). IDENTITY is
#   "name repo_dir tmux_session" (claim_state); LEGACY_STATE the older state folder whose marked runs still count
#   as this target's; CHECKPOINT_DIR may be empty (none configured).
# Prints the trainer's "PID STARTTIME" (or "adopted" after it, for a retry of this very launch). Exit codes:
#   10 the recorded trainer of the current run is alive       11 the tmux session exists and a pane runs a program
#                                                                (one of idle shells only gets the run in a new window)
#   12 a folder could not be made                             13 tmux could not start the session
#   14 no PID recorded in time                                15 the venv is half-built (.relaunch-building)
#   16 the compile cache is half-warmed (.relaunch-warming)   17 another launch holds the lock
#   18 a live process carries this target's marker (RELAUNCH_TARGET, or a RELAUNCH_RUN of its state or legacy state)
#   19 a live process has files open for writing under checkpoint_dir (a trainer started by hand writes the same
#      checkpoints; a reader, such as a backup, is no trainer and does not count)
#   20 the state folder belongs to another target (STATE/target)
#   21 a live process runs the launch command's program in repo_dir (a trainer started by hand, outside tmux), or a
#      Python working in repo_dir writes under checkpoint_dir or log_dir (one that renamed itself: setproctitle)
# shellcheck source=lib.sh
. ./lib.sh
# shellcheck source=panes.sh
. ./panes.sh
state=$1 session=$2 run_id=$3 log=$4 supervisor=$5 launcher=$6 wait_s=$7 venv=$8 cache=$9 checkpoint=${10}
identity=${11} legacy_state=${12} checkpoint_dir=${13} record_s=${14}; shift 14
# A marker in our own environment (relaunch run from inside a trainer) must not make the processes we start
# look like a trainer to the checks below. /proc/$$/environ keeps them regardless: $$ is left out by PID.
unset RELAUNCH_RUN RELAUNCH_TARGET
# One launch at a time: a retry after a dropped connection may start while the first try still runs here.
mkdir -p "$state" || exit 12
exec 9>>"$state/launch.lock"
flock -w "${wait_s%.*}" 9 || { echo "another launch holds $state/launch.lock for over ${wait_s}s: refusing to start a second trainer"; exit 17; }
claim_state "$state" "$identity"
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
# A trainer of this target that relaunch no longer records (an older run's, one that outlived its session and was
# then replaced, one of the legacy state folder) still carries its marker: a second trainer must not start beside it.
# Never the tmux server: one started from inside a trainer carries its marker, and it holds other people's sessions.
server=$(tmux list-sessions -F '#{pid}' 2> /dev/null | head -n 1)
others() { local p; while read -r p; do [ "$p" = "$$" ] || [ "$p" = "$server" ] || echo "$p"; done; }
mapfile -t marked < <(target_marked_pids "$state" "$state" "$legacy_state" | others)
if [ ${#marked[@]} -gt 0 ]; then
  echo "live processes carry this target's marker (RELAUNCH_TARGET=$state, or a RELAUNCH_RUN under $state/runs/ or $legacy_state/runs/): a trainer of this target runs; refusing to start a second one:"
  describe_pids "${marked[@]}"
  echo "stop them first (kill PID, after checking each is this target's), or adopt the run instead of launching; then launch again"
  exit 18
fi
if [ -n "$checkpoint_dir" ] && [ -d "$checkpoint_dir" ]; then
  mapfile -t writers < <(pids_writing_files_under "$checkpoint_dir" | sort -un | others)
  if [ ${#writers[@]} -gt 0 ]; then
    echo "live processes have files open for writing under checkpoint_dir $checkpoint_dir: a trainer started by hand writes the same checkpoint files; refusing to start a second one:"
    describe_pids "${writers[@]}"
    echo "stop that trainer (or wait for the program writing there to finish), then launch again"
    exit 19
  fi
fi
# The last run's own pane (its `tail --pid` notices the supervisor's end only within a second) may outlive that run by a
# moment: when it is the session's only pane, recorded as the last run's, and its trainer is gone, it is ours to close.
if [ -n "$cur" ] && tmux has-session -t "=$session" 2>/dev/null; then
  last=$(run_folder "$state" "$cur") lpane='' lstart='' lid=''
  read_pid "$last/pane" lpane lstart; slurp lid "$last/pane_id"
  if [ -n "$lid" ] && [ "$(tmux list-panes -s -t "=$session" -F '#{pane_pid}' 2>/dev/null)" = "$lpane" ] && alive "$lpane" "$lstart" \
    && ! alive "$pid" "$pstart"; then
    # Said first, so that the last run's launcher takes the hangup for what it is, not for a person ending the session:
    # a process of that run still on its way out (RUN/pid names it for a moment) is no trainer to stop.
    : > "$last/pane_closed_by_launch"
    tmux kill-pane -t "$lid" 2>/dev/null
    end=$(( SECONDS + 5 ))
    while tmux has-session -t "=$session" 2>/dev/null && [ "$SECONDS" -lt "$end" ]; do nap 0.01; done
  fi
fi
# Panes whose program has ended (a person's `remain-on-exit on`) hold no process, only the crash's last screen: kept in
# the state folder, then closed, so that a session holding nothing else ends and the launch goes on.
while read -r dead pane_id; do
  [ "$dead" = 1 ] || continue
  screen="$state/dead_pane_$(date -u +%Y%m%dT%H%M%SZ)_${pane_id#%}.txt"
  tmux capture-pane -p -S - -t "$pane_id" > "$screen" 2> /dev/null && tmux kill-pane -t "$pane_id" 2> /dev/null
done < <(tmux list-panes -s -t "=$session" -F '#{pane_dead} #{pane_id}' 2> /dev/null)
# A session that still exists: a person's window (an idle shell, kept after their trainer crashed, or opened to look
# around) is no trainer and no reason to leave the run dead: the run starts in a new window of that session. A pane that
# runs anything (a trainer, `tail -f`, an editor) is refused, named, for a person to judge.
window=0
if tmux has-session -t "=$session" 2>/dev/null; then
  busy=()
  while read -r ppid pid_of_pane; do
    dying "$ppid" && continue
    pane_tops "$ppid"
    for p in "${TOPS[@]}"; do cmdline_into c "$p"; busy+=("  PID $p in pane $pid_of_pane: ${c:0:200}"); done
  done < <(tmux list-panes -s -t "=$session" -F '#{pane_pid} #{pane_id}' 2> /dev/null)
  if [ ${#busy[@]} -gt 0 ]; then
    echo "tmux session $session exists, and its panes run programs (a pane holding only an idle shell would not stop the launch): refusing to start a second trainer:"
    printf '%s\n' "${busy[@]}"
    exit 11
  fi
  window=1
fi
# A trainer started by hand (`nohup python train.py > log &`, outside tmux, or under the target's old name) has no
# marker: it runs the launch command's program with its working folder in the repo.
mapfile -t programs < <(programs_of "$3" "$1")
program=${programs[*]}
# A trainer that renamed itself (setproctitle) names no program: a Python working in the repo that writes under
# checkpoint_dir or log_dir is one all the same. Another target's trainer in a shared repo (its marker says whose, and it logs elsewhere) is not.
mapfile -t running < <({ pids_running_program_in "$1" "${programs[@]}"; pids_python_writing_in "$1" "$venv" "$checkpoint_dir" "${log%/*}"; } | sort -un | others | drop_other_targets "$state" "${log%/*}")
if [ ${#running[@]} -gt 0 ]; then
  echo "live processes run $program in $1, as this target's trainer does: a trainer of this target started by hand (outside tmux, or under another name) runs; refusing to start a second one:"
  describe_pids "${running[@]}"
  echo "if it is this target's trainer, let it run (relaunch judges only runs it records or adopts from the target's tmux session) or stop it yourself; then launch again"
  exit 21
fi
[ -e "$venv/.relaunch-building" ] && { echo "venv $venv is half-built (.relaunch-building): rebuild it before launching"; exit 15; }
[ -e "$cache/.relaunch-warming" ] && { echo "compile cache $cache is half-warmed (.relaunch-warming): warm it again before launching"; exit 16; }
run=$(run_folder "$state" "$run_id")
mkdir -p "$run" "$(dirname "$log")" || exit 12
printf '%s' "$supervisor" > "$run/supervisor.sh"
printf '%s' "$launcher" > "$run/launcher.sh"
printf '%s\0' "$@" > "$run/spec"
printf '%s\n' "$log" > "$run/log_path"
# Where this run's text begins in a log that may hold earlier runs': its size now (the supervisor records it again,
# with the sum of the bytes before it, just before its first write; a poll meanwhile reads no earlier run's text).
printf '%s\n' "$(stat -L -c %s -- "$log" 2> /dev/null || echo 0)" > "$run/log_offset"
printf '%s\n' "$checkpoint" > "$run/checkpoint"
printf '%s\n' "$record_s" > "$run/record_seconds"
date +%s.%N > "$run/started_at"
printf '%s\n' "$run_id" > "$state/current.tmp" && mv -f "$state/current.tmp" "$state/current"
# Several arguments: tmux runs them directly, with no shell in between to quote for.
# 9>&-: the lock is the launch's alone; a tmux server or trainer inheriting it would hold it for the whole run.
# env -u: a pane takes the tmux server's environment, which is that of whatever first started the server; a
# RELAUNCH_RUN or RELAUNCH_TARGET there (a server started from inside a trainer) would mark this pane as another run's process.
# The pane closed above, or anyone's, may have been the server's last session: tmux then exits, and destroys as it goes
# a session created in that moment (the new trainer would be hung up a second after its start). Wait it out, and ask
# again where the server went away under the command itself.
pane_pid='' pane_id=''
if [ "$window" = 1 ]; then
  # -P: the new pane's own PID and id (the session's active pane is the person's, not this run's).
  out=$(tmux new-window -d -P -F '#{pane_pid} #{pane_id}' -t "=$session:" env -u RELAUNCH_RUN -u RELAUNCH_TARGET bash "$run/launcher.sh" "$run" 2>&1 9>&-) \
    && read -r pane_pid pane_id <<< "$out"
  # The person's shell ended meanwhile, and the session with it: a session of its own, as with none.
  [ -n "$pane_pid" ] || tmux has-session -t "=$session" 2> /dev/null || window=0
  [ -n "$pane_pid" ] || [ "$window" = 0 ] || { echo "tmux new-window in session $session failed: $out"; exit 13; }
fi
for try in 1 2 3; do
  [ "$window" = 1 ] && break
  tmux_settled 5
  out=$(tmux new-session -d -s "$session" -x 220 -y 50 env -u RELAUNCH_RUN -u RELAUNCH_TARGET bash "$run/launcher.sh" "$run" 2>&1 9>&-) && break
  case $out in *"server exited unexpectedly"* | *"lost server"*) [ "$try" -lt 3 ] && continue ;; esac
  echo "tmux new-session -s $session failed: $out"
  exit 13
done
# The pane that is this run's, so that a stop ends exactly it (a window the user opened beside it is not ours).
# `=NAME:`: tmux 3.3 reads a bare `=NAME` as a pane target to nothing (empty output, exit 0).
[ "$window" = 1 ] || read -r pane_pid pane_id < <(tmux display-message -p -t "=$session:" '#{pane_pid} #{pane_id}' 2>/dev/null)
if [ -n "${pane_pid-}" ]; then
  record_pid "$pane_pid" "$run/pane"
  printf '%s\n' "$pane_id" > "$run/pane_id.tmp" && mv -f "$run/pane_id.tmp" "$run/pane_id"
fi
# A launch ends a deliberate stop: the nightly check watches this run again.
rm -f -- "$state/stopped" "$state/stopped_how"
wait_for_pid "$run"
