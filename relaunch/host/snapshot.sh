#!/usr/bin/env bash
# shellcheck shell=bash
# One health poll: waits up to $3 ms, returns the moment the trainer dies (and, with $13 = 1, the moment its log
# is written: a trainer already stepping is judged at the step line that settles it, not up to a poll later);
# sections marked with a per-poll nonce.
# shellcheck source=lib.sh
. ./lib.sh
state=$1 session=$2 wait_ms=$3 tail_n=$4 want_kernel=$5 nonce=$6 venv=$7 cache=$8 tail_bytes=$9 failure_re=${10} logdir=${11} ckpt=${12}
wake=${13:-0}
M="@@relaunch-$nonce@@"
# What `grep -a -b -B 12 -m 30 -E RE LOG` prints, read incrementally so a poll costs the new bytes, not the
# whole log: RUN/scan keeps how far the log was scanned (and for which words), RUN/scan_matches what was found.
# A log that shrank, or other words, is scanned again from the start. Each new scan starts 64 KiB before the
# last one ended so that a failure just after it keeps its 12 lines of context; lines already kept are dropped.
scan_failures() {
  local run=$1 log=$2 size=$3 re=$4 from=0 sum='' key start seen last sep
  exec 8>> "$run/scan.lock" && flock -w 30 8
  key=$(printf '%s' "$re" | cksum); key=${key%% *}
  { read -r from sum < "$run/scan"; } 2> /dev/null
  if [ "$sum" != "$key" ] || [ "${from:-0}" -gt "$size" ] || [ ! -f "$run/scan_matches" ]; then from=0; : > "$run/scan_matches"; fi
  seen=$(grep -c '^[0-9]*:' "$run/scan_matches")
  if [ "$seen" -lt 30 ] && [ "$from" -lt "$size" ]; then
    last=$(tail -n 1 "$run/scan_matches" | sed -n 's/^\([0-9]*\)[-:].*/\1/p')
    start=$(( from > 65536 ? from - 65536 : 0 )) sep=0
    [ -s "$run/scan_matches" ] && sep=1
    tail -c +$((start + 1)) -- "$log" | head -c $((size - start)) | grep -a -b -B 12 -m 60 -E "$re" \
      | awk -v base="$start" -v last="${last:--1}" -v sep="$sep" '
          match($0, /^[0-9]+[-:]/) {
            off = substr($0, 1, RLENGTH - 1) + base
            if (off <= last) next
            if (sep) { print "--"; sep = 0 }
            print off substr($0, RLENGTH); next
          }
          $0 == "--" { sep = 1 }' | cut -c1-2000 >> "$run/scan_matches"
    printf '%s %s\n' "$size" "$key" > "$run/scan.tmp" && mv -f "$run/scan.tmp" "$run/scan"
  fi
  awk '/^[0-9]+:/ { if (++n > 30) exit } { print }' "$run/scan_matches"
  exec 8>&-
}
run_id=$(current_run "$state")
run=$(run_folder "$state" "$run_id")
pid='' pstart='' spid='' sstart='' t=0 log='' exit_code='' started='' checkpoint=''
[ -n "$run_id" ] && read_pid "$run/pid" pid pstart
[ -n "$run_id" ] && read_pid "$run/supervisor_pid" spid sstart
now_us t; end=$(( t + wait_ms * 1000 ))
# RUN/poll_mark is written (a redirection, no process) as each poll reads the log: a log newer than it (`-nt`,
# no process either) was written after the last poll read it. A write in the same clock tick as the mark goes
# unseen until the next one: a poll returns late then, never early. Not before 200 ms: a log written many times
# a second makes at most five polls a second.
ref='' log='' wake_from=$(( t + 200000 ))
if [ "$wake" = 1 ] && [ -n "$run_id" ] && [ -f "$run/poll_mark" ]; then slurp log "$run/log_path"; ref=$run/poll_mark; fi
while [ -n "$pid" ] && [ ! -e "$run/exit_code" ] && alive "$pid" "$pstart" && now_us t && [ "$t" -lt "$end" ]; do
  [ -n "$ref" ] && [ "$t" -ge "$wake_from" ] && [ "$log" -nt "$ref" ] && break
  nap 0.05
done
# The supervisor writes the exit code just after the trainer dies: give it a moment.
for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
  [ -e "$run/exit_code" ] && break; alive "$pid" "$pstart" && break; alive "$spid" "$sstart" || break; nap 0.05
done
slurp log "$run/log_path"; slurp exit_code "$run/exit_code"; slurp started "$run/started_at"; slurp checkpoint "$run/checkpoint"
now_us t; now="${t%??????}.${t: -6}"
echo "$M run_id $run_id"
echo "$M launched $([ -n "$run_id" ] && echo 1 || echo 0)"
echo "$M session $(tmux has-session -t "=$session" 2>/dev/null && echo 1 || echo 0)"
echo "$M pid $pid"
echo "$M pid_alive $(alive "$pid" "$pstart" && echo 1 || echo 0)"
echo "$M exit_code $exit_code"
echo "$M started_at $started"
echo "$M checkpoint $checkpoint"
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
  since=$(awk -v now="$now" -v s="${started:-0}" '{printf "%.3f\n", s - (now - $1)}' /proc/uptime)
  # A line without its own [stamp] continues the one before (drivers split "fallen off the bus" over lines).
  printf '%s\n' "$kernel" | awk -v since="$since" '/^\[ *[0-9.]+\]/ { t = $0; sub(/^\[ */, "", t); split(t, a, "]"); at = a[1] + 0 } at >= since' \
    | grep -E 'Out of memory|oom-kill|oom_reaper|Killed process|NVRM: Xid|NVRM: The NVIDIA GPU|fallen off the bus|GPU is lost' | tail -n 16
fi
if [ -n "$log" ] && [ -f "$log" ]; then
  [ -w "$run" ] && { : > "$run/poll_mark"; } 2> /dev/null
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
  if [ -w "$run" ]; then scan_failures "$run" "$log" "$size" "$failure_re"; else grep -a -b -B 12 -m 30 -E "$failure_re" -- "$log"; fi | cut -c1-2000
  echo "$M tail"
  tail -c +$((size - kept + 1)) "$log" | head -c "$kept"
  echo
fi
echo "$M end"
