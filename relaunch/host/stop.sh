#!/usr/bin/env bash
# shellcheck shell=bash
# Stop the recorded trainer and the configured session: by PID, process group and exact session name only.
# shellcheck source=lib.sh
. ./lib.sh
state=$1 session=$2 timeout_s=$3
run_id=$(current_run "$state")
run=$(run_folder "$state" "$run_id")
pid='' pstart='' spid='' sstart=''
[ -n "$run_id" ] && read_pid "$run/pid" pid pstart
[ -n "$run_id" ] && read_pid "$run/supervisor_pid" spid sstart
groups=()
alive "$spid" "$sstart" && groups+=("$spid")
alive "$pid" "$pstart" && groups+=("$pid")
if tmux has-session -t "=$session" 2>/dev/null; then
  for p in $(tmux list-panes -s -t "=$session" -F '#{pane_pid}' 2>/dev/null); do groups+=("$p"); done
fi
# Ranks a launcher (torchrun) starts in sessions of their own carry the run's marker: found by it, even
# when the launcher itself is gone (killed, they would train on beside the next launch).
marked=()
if [ -n "$run_id" ]; then
  for p in $(marked_pids "$run"); do
    if [ "$(ps -o pgid= -p "$p" | tr -d ' ')" = "$p" ]; then groups+=("$p"); else marked+=("$p"); fi
  done
fi
members() { ps -e -o pid=,pgid= | awk -v g="$1" '$2 == g {print $1}'; }
pids=("${marked[@]}")
for g in "${groups[@]}"; do mapfile -t more < <(members "$g"); pids+=("$g" "${more[@]}"); done
[ ${#groups[@]} -gt 0 ] && echo "stopping process groups: ${groups[*]}"
for g in "${groups[@]}"; do kill -TERM -- "-$g" 2>/dev/null || kill -TERM "$g" 2>/dev/null; done
for p in "${marked[@]}"; do kill -TERM "$p" 2>/dev/null; done
tmux kill-session -t "=$session" 2>/dev/null && echo "killed tmux session $session"
# Zombies count as gone: a reparented supervisor may wait seconds for init to reap it.
gone() { for p in "${pids[@]}"; do starttime "$p" >/dev/null && return 1; done; return 0; }
# bash's SECONDS, not `date`: this waits in 10 ms naps, and a process per look would cost more than the nap.
end=$(( SECONDS + ${timeout_s%.*} ))
while ! gone && [ "$SECONDS" -lt "$end" ]; do nap 0.01; done
if ! gone; then
  echo "still alive after ${timeout_s}s, sending SIGKILL"
  for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  sleep 0.5
  gone || { echo "could not stop: ${pids[*]}"; exit 3; }
fi
if command -v nvidia-smi >/dev/null 2>&1 && [ ${#pids[@]} -gt 0 ]; then
  while [ "$SECONDS" -lt "$((end + 60))" ]; do
    held=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ')
    busy=0; for p in "${pids[@]}"; do grep -qx "$p" <<< "$held" && busy=1; done
    [ "$busy" = 0 ] && break; sleep 0.5
  done
  [ "$busy" = 0 ] || { echo "GPU memory still held by ${pids[*]}"; exit 4; }
fi
echo "stopped (${#pids[@]} process(es))"
