"""Bash that runs on the host, kept in one place. Every value reaches it as "$1".. or shlex-quoted once."""

from __future__ import annotations

# Shared helpers: a PID is alive only if /proc still shows its recorded start time (no PID reuse).
PROC_HELPERS = r"""
starttime() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; local f; read -ra f <<< "$s"; [ "${f[0]}" != Z ] || return 1; echo "${f[19]}"; }
alive() { [ -n "$1" ] && [ -n "$2" ] && [ "$(starttime "$1")" = "$2" ]; }
read_pid() { [ -r "$1" ] && read -r "$2" "$3" < "$1"; }
"""

# One health poll. Waits up to $3 milliseconds, returning early the moment the trainer dies.
# Sections are marked with a per-poll nonce, so no line a trainer prints can forge one. The log is
# read within a byte budget (a 2 GB log or a 200 MB line costs no more than a small one); earliest
# failures come with their byte offsets, so the parser can tell them from lines the tail holds.
SNAPSHOT = PROC_HELPERS + r"""
state=$1 session=$2 wait_ms=$3 tail_n=$4 want_kernel=$5 nonce=$6 venv=$7 cache=$8 tail_bytes=$9 failure_re=${10} logdir=${11} ckpt=${12}
M="@@relaunch-$nonce@@"
run_id=$(cat "$state/current" 2>/dev/null)
run="$state/runs/$run_id"
pid= pstart= spid= sstart=
[ -n "$run_id" ] && read_pid "$run/pid" pid pstart
[ -n "$run_id" ] && read_pid "$run/supervisor_pid" spid sstart
end=$(( $(date +%s%N) + wait_ms * 1000000 ))
while [ -n "$pid" ] && [ ! -e "$run/exit_code" ] && alive "$pid" "$pstart" && [ "$(date +%s%N)" -lt "$end" ]; do sleep 0.05; done
# The supervisor writes the exit code just after the trainer dies: give it a moment.
for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
  [ -e "$run/exit_code" ] && break; alive "$pid" "$pstart" && break; alive "$spid" "$sstart" || break; sleep 0.05
done
log=$(cat "$run/log_path" 2>/dev/null)
now=$(date +%s.%N)
echo "$M run_id $run_id"
echo "$M launched $([ -n "$run_id" ] && echo 1 || echo 0)"
echo "$M session $(tmux has-session -t "=$session" 2>/dev/null && echo 1 || echo 0)"
echo "$M pid $pid"
echo "$M pid_alive $(alive "$pid" "$pstart" && echo 1 || echo 0)"
echo "$M exit_code $(cat "$run/exit_code" 2>/dev/null)"
echo "$M started_at $(cat "$run/started_at" 2>/dev/null)"
echo "$M checkpoint $(cat "$run/checkpoint" 2>/dev/null)"
echo "$M now $now"
# A recovery that was killed mid-step leaves its marker behind: the next one must redo that step.
unfinished=
# A venv that is missing or still marked as building: a rebuild was cut short between its moves.
{ [ ! -d "$venv" ] || [ -e "$venv/.relaunch-building" ]; } && unfinished="$unfinished rebuild_venv"
[ -e "$cache/.relaunch-warming" ] && unfinished="$unfinished warm_cache"
echo "$M unfinished$unfinished"
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu_out=$(nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader,nounits 2>&1); gpu_rc=$?
  echo "$M gpu_rc $gpu_rc"
  echo "$M gpu"
  printf '%s\n' "$gpu_out" | head -64
  # Error counters, asked separately: a driver that lacks one of these fields must not look like a failing GPU.
  echo "$M gpu_health"
  nvidia-smi --query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure \
    --format=csv,noheader,nounits 2>/dev/null | head -64
fi
echo "$M disk"
for d in "$logdir" "$ckpt" /dev/shm; do
  [ -n "$d" ] && [ -d "$d" ] && echo "$(df -Pk -- "$d" 2>/dev/null | awk 'NR == 2 {print $4, $2}') $d"
done
if [ "$want_kernel" = 1 ] && ! alive "$pid" "$pstart"; then
  # Containers often cannot read the kernel log: say so, so no one reads "no Xid line" as "no GPU fault".
  kernel=$(dmesg 2>/dev/null) && echo "$M kernel_readable 1" || echo "$M kernel_readable 0"
  echo "$M kernel"
  # Only kernel lines since this launch: an older OOM kill or Xid on the host is not this run's cause.
  since=$(awk -v now="$now" -v s="$(cat "$run/started_at" 2>/dev/null || echo 0)" '{print s - (now - $1)}' /proc/uptime)
  printf '%s\n' "$kernel" | awk -v since="$since" '{ t = $0; sub(/^\[ */, "", t); split(t, a, "]"); if (a[1] + 0 >= since) print }' \
    | grep -E 'Out of memory|oom-kill|oom_reaper|Killed process|NVRM: Xid|fallen off the bus|GPU is lost' | tail -n 16
fi
if [ -n "$log" ] && [ -f "$log" ]; then
  size=$(stat -c %s "$log")
  skip=$(( size > tail_bytes ? size - tail_bytes : 0 ))
  kept=$(tail -c +$((skip + 1)) "$log" | head -c $((size - skip)) | tail -n "$tail_n" | wc -c)
  echo "$M log_mtime $(date -r "$log" +%s.%N)"
  echo "$M log_size $size"
  echo "$M tail_start $((size - kept))"
  # Fewer than tail_n line breaks in the budget: the tail starts mid-line.
  [ "$skip" -gt 0 ] && [ "$kept" -eq $((size - skip)) ] && echo "$M tail_partial 1"
  # The earliest failures anywhere in the log, with the frames before them, each prefixed by its byte offset.
  echo "$M matches"
  grep -a -b -B 12 -m 30 -E "$failure_re" -- "$log" | cut -c1-2000
  echo "$M tail"
  tail -c +$((size - kept + 1)) "$log" | head -c "$kept"
  echo
fi
echo "$M end"
"""

# Stop the recorded trainer and the configured session: by PID, process group and exact session name only.
STOP = PROC_HELPERS + r"""
state=$1 session=$2 timeout_s=$3
run_id=$(cat "$state/current" 2>/dev/null)
run="$state/runs/$run_id"
pid= pstart= spid= sstart=
[ -n "$run_id" ] && read_pid "$run/pid" pid pstart
[ -n "$run_id" ] && read_pid "$run/supervisor_pid" spid sstart
groups=()
alive "$spid" "$sstart" && groups+=("$spid")
alive "$pid" "$pstart" && groups+=("$pid")
if tmux has-session -t "=$session" 2>/dev/null; then
  for p in $(tmux list-panes -s -t "=$session" -F '#{pane_pid}' 2>/dev/null); do groups+=("$p"); done
fi
members() { ps -e -o pid=,pgid= | awk -v g="$1" '$2 == g {print $1}'; }
pids=()
for g in "${groups[@]}"; do pids+=("$g" $(members "$g")); done
[ ${#groups[@]} -gt 0 ] && echo "stopping process groups: ${groups[*]}"
for g in "${groups[@]}"; do kill -TERM -- "-$g" 2>/dev/null || kill -TERM "$g" 2>/dev/null; done
tmux kill-session -t "=$session" 2>/dev/null && echo "killed tmux session $session"
# Zombies count as gone: a reparented supervisor may wait seconds for init to reap it.
gone() { for p in "${pids[@]}"; do starttime "$p" >/dev/null && return 1; done; return 0; }
end=$(( $(date +%s) + ${timeout_s%.*} ))
while ! gone && [ "$(date +%s)" -lt "$end" ]; do sleep 0.1; done
if ! gone; then
  echo "still alive after ${timeout_s}s, sending SIGKILL"
  for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  sleep 0.5
  gone || { echo "could not stop: ${pids[*]}"; exit 3; }
fi
if command -v nvidia-smi >/dev/null 2>&1 && [ ${#pids[@]} -gt 0 ]; then
  while [ "$(date +%s)" -lt "$((end + 60))" ]; do
    held=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ')
    busy=0; for p in "${pids[@]}"; do grep -qx "$p" <<< "$held" && busy=1; done
    [ $busy = 0 ] && break; sleep 0.5
  done
  [ $busy = 0 ] || { echo "GPU memory still held by ${pids[*]}"; exit 4; }
fi
echo "stopped (${#pids[@]} process(es))"
"""

# Refuse to launch beside a live trainer or onto a half-built venv or cache; then start the launcher in
# tmux and wait for the PID record. The trainer's spec (repo, venv, command, environment) is written
# NUL-separated into the run folder: the supervisor reads it as data, never as script text.
LAUNCH = PROC_HELPERS + r"""
state=$1 session=$2 run_id=$3 log=$4 supervisor=$5 launcher=$6 wait_s=$7 venv=$8 cache=$9 checkpoint=${10}; shift 10
cur=$(cat "$state/current" 2>/dev/null)
if [ -n "$cur" ]; then
  read_pid "$state/runs/$cur/pid" pid pstart
  if alive "$pid" "$pstart"; then echo "trainer of run $cur is alive (PID $pid): refusing to start a second one"; exit 10; fi
fi
if tmux has-session -t "=$session" 2>/dev/null; then echo "tmux session $session exists: refusing to start a second trainer"; exit 11; fi
[ -e "$venv/.relaunch-building" ] && { echo "venv $venv is half-built (.relaunch-building): rebuild it before launching"; exit 15; }
[ -e "$cache/.relaunch-warming" ] && { echo "compile cache $cache is half-warmed (.relaunch-warming): warm it again before launching"; exit 16; }
run="$state/runs/$run_id"
mkdir -p "$run" "$(dirname "$log")" || exit 12
printf '%s' "$supervisor" > "$run/supervisor.sh"
printf '%s' "$launcher" > "$run/launcher.sh"
printf '%s\0' "$@" > "$run/spec"
printf '%s\n' "$log" > "$run/log_path"
printf '%s\n' "$checkpoint" > "$run/checkpoint"
date +%s.%N > "$run/started_at"
printf '%s\n' "$run_id" > "$state/current.tmp" && mv -f "$state/current.tmp" "$state/current"
# Several arguments: tmux runs them directly, with no shell in between to quote for.
tmux new-session -d -s "$session" -x 220 -y 50 bash "$run/launcher.sh" "$run" || exit 13
end=$(( $(date +%s) + ${wait_s%.*} ))
until [ -e "$run/pid" ] || [ -e "$run/exit_code" ]; do
  [ "$(date +%s)" -ge "$end" ] && { echo "no PID recorded within ${wait_s}s"; exit 14; }
  sleep 0.05
done
cat "$run/pid" 2>/dev/null || echo "exited at once"
"""

# What tmux runs: detach the supervisor into its own session, then show the log until it ends.
# setsid -f: the supervisor is nobody's child here, so init reaps it and the pane ends with it.
LAUNCHER = r"""#!/usr/bin/env bash
# relaunch launcher. The pane shows the log; the log is the record. $1: the run folder.
run=$1
setsid -f bash "$run/supervisor.sh" "$run" < /dev/null > /dev/null 2>&1
for _ in $(seq 200); do [ -s "$run/supervisor_pid" ] && break; sleep 0.05; done
read -r spid _ < "$run/supervisor_pid"
log=$(cat "$run/log_path")
touch -- "$log"
exec tail -n +1 -F --pid="$spid" -- "$log" 2>/dev/null
"""

# Runs the trainer outside tmux, appends its output to the attempt log, records PID and exit code.
# The trainer runs in its own process group, outside tmux: a lost session loses no output and kills
# nothing. Its exit code is written when it exits, so no death is silent.
SUPERVISOR = r"""#!/usr/bin/env bash
# relaunch supervisor. $1: the run folder; its `spec` holds repo, venv bin, command, then KEY=VALUE entries.
set -o pipefail
run_dir=$1
log=$(cat "$run_dir/log_path")
run_id=${run_dir##*/}
mapfile -d '' spec < "$run_dir/spec"
repo=${spec[0]} venv_bin=${spec[1]} command=${spec[2]}
note() { printf '[relaunch] %s run %s: %s\n' "$(date -u +%FT%TZ)" "$run_id" "$1" >> "$log"; }
# A handler (not an ignore) so the trainer still gets default signal handling.
trap 'true' TERM HUP INT
s=$(cat "/proc/$$/stat"); s=${s##*) }; read -ra f <<< "$s"
echo "$$ ${f[19]}" > "$run_dir/supervisor_pid.tmp" && mv -f "$run_dir/supervisor_pid.tmp" "$run_dir/supervisor_pid"
cd -- "$repo" || { note "cannot cd to $repo"; echo 126 > "$run_dir/exit_code"; exit 126; }
note "start: $command"
# The environment reaches the trainer as environment: `env` takes each KEY=VALUE as one argument.
PATH="$venv_bin:$PATH" env -- "${spec[@]:3}" bash -c "$command" >> "$log" 2>&1 < /dev/null &
pid=$!
s=$(cat "/proc/$pid/stat" 2>/dev/null); s=${s##*) }; read -ra f <<< "$s"
echo "$pid ${f[19]}" > "$run_dir/pid.tmp" && mv -f "$run_dir/pid.tmp" "$run_dir/pid"
wait "$pid"; code=$?
while kill -0 "$pid" 2>/dev/null; do wait "$pid"; code=$?; done
echo "$code" > "$run_dir/exit_code.tmp" && mv -f "$run_dir/exit_code.tmp" "$run_dir/exit_code"
note "trainer exited with code $code"
exit "$code"
"""
