#!/usr/bin/env bash
# shellcheck shell=bash
# The run's progress record (RUN/progress): what an expert at the host would watch between two looks, sampled every
# few seconds by a small recorder beside the trainer, so that a check or the watch judges a stall window from the
# host's own history however long ago the quiet began (relaunch/judging/progress.py reads it). One sample:
#   @ EPOCH LOG_SIZE                                  when (host clock), and the size of the run's log
#   p PID STATE TICKS IO_BYTES WCHAN COMM              per process of the whole tree: the trainer, every descendant
#                                                      (non-Python children too) and every process carrying the run's
#                                                      marker (ranks a launcher started in sessions of their own);
#                                                      TICKS utime+stime+cutime+cstime; IO_BYTES rchar+wchar
#   l WAITER HOLDER HOLDER_COMM                       a process of the tree blocked on a file lock, and who holds it
#   g INDEX UTIL_PERCENT MEMORY_MIB BUS               per GPU (nvidia-smi, where there is one)
#   a PID MEMORY_MIB BUS                              GPU memory held by a process of the tree
# Bounded (RECORD_MAX_BYTES: its newer half is kept). Started by every health poll and watch look that finds the
# current run's trainer alive with no recorder (relaunch/host/snapshot.sh, pulse.sh: runs launched or adopted, and runs
# of older relaunch versions alike); one per run (a lock), ending by itself once the run is over. It reads /proc with
# bash's own reads: no process per sample but ps-free child lists, a grep for marked processes every MARK_EVERY samples,
# and nvidia-smi where present.
RECORD_MAX_BYTES=1048576
MARK_EVERY=10
APPS_EVERY=12
# The functions a detached recorder needs (start_recorder sends them to a fresh bash: the caller's script ends first).
RECORDER_FUNCS=(nap now_us stat_fields_into starttime_into alive read_pid marked_pids record_progress progress_sample tree_of)

# TREE=PIDs of the trainer, its descendants and the marked ones (MARKED, refreshed by the caller), each once.
tree_of() {
  local -a queue=("$@") kids
  local -A seen=()
  local p f i=0
  TREE=()
  while [ "$i" -lt "${#queue[@]}" ]; do
    p=${queue[$i]} i=$((i + 1))
    if [ -z "$p" ] || [ -n "${seen[$p]-}" ] || [ ! -d "/proc/$p" ]; then continue; fi
    seen[$p]=1 TREE+=("$p")
    # Children of every thread: a thread that starts a subprocess is its parent, not the main thread.
    for f in /proc/"$p"/task/*/children; do
      # No newline ends the file: read fills the array and still says end of file.
      kids=()
      { read -ra kids < "$f"; } 2> /dev/null
      queue+=("${kids[@]}")
    done
  done
}

# One sample of the tree into stdout.
progress_sample() {
  local log=$1 p k v ticks io state wchan comm size=0 line waiting=''
  local -a f st
  local -A intree=()
  now_us us
  [ -n "$log" ] && { size=$(stat -L -c %s -- "$log" 2> /dev/null) || size=0; }
  printf '@ %d.%06d %s\n' "$((us / 1000000))" "$((us % 1000000))" "$size"
  for p in "${TREE[@]:0:64}"; do
    # One line, read without a process (lib.sh's stat_fields_into forks a subshell: 9 processes were 9 forks a sample).
    { read -r line < "/proc/$p/stat"; } 2> /dev/null || continue
    line=${line##*) }
    read -ra st <<< "$line"
    intree[$p]=1
    ticks=$((st[11] + st[12] + st[13] + st[14])) io=0 wchan=0 comm=''
    if [ -r "/proc/$p/io" ]; then
      while read -r k v; do case $k in rchar: | wchar:) io=$((io + v)) ;; esac; done < "/proc/$p/io" 2> /dev/null
    fi
    { read -r wchan < "/proc/$p/wchan"; } 2> /dev/null
    { read -r comm < "/proc/$p/comm"; } 2> /dev/null
    state=${st[0]}
    case $wchan in *lock* | fcntl_setlk) waiting=1 ;; esac
    printf 'p %s %s %s %s %s %s\n' "$p" "$state" "$ticks" "$io" "${wchan:-0}" "${comm//[[:space:]]/_}"
  done
  # Who holds the lock a process of the tree waits for: /proc/locks lists a waiter as `N: -> ... PID` after its
  # blocker's `N: ... PID` line. Read only when a wait on a lock shows in a wchan.
  if [ -n "$waiting" ] && [ -r /proc/locks ]; then
    local -A holder=()
    while read -r -a f; do
      if [ "${f[1]}" = '->' ]; then
        [ -n "${intree[${f[5]}]-}" ] && [ -n "${holder[${f[0]}]-}" ] \
          && { comm=''; { read -r comm < "/proc/${holder[${f[0]}]}/comm"; } 2> /dev/null; echo "l ${f[5]} ${holder[${f[0]}]} ${comm//[[:space:]]/_}"; }
      else
        holder[${f[0]}]=${f[4]}
      fi
    done < /proc/locks
  fi
  [ -n "$NVSMI" ] || return 0
  # Each GPU's newest line from the long-lived nvidia-smi (GPU_FD: it prints a line per GPU every interval; read
  # without waiting), else from one call; which GPU the tree's memory is on, every APPS_EVERY samples (it seldom moves).
  local -A gpu=()
  if [ -n "${GPU_FD-}" ]; then
    while read -r -t 0 -u "$GPU_FD" 2> /dev/null && IFS= read -r -u "$GPU_FD" line; do gpu[${line%%,*}]=$line; done
  else
    while IFS= read -r line; do gpu[${line%%,*}]=$line; done \
      < <("$NVSMI" --query-gpu=index,utilization.gpu,memory.used,pci.bus_id --format=csv,noheader,nounits 2> /dev/null)
  fi
  for line in "${gpu[@]}"; do IFS=', ' read -r k v p line <<< "$line"; [ -n "$k" ] && echo "g $k $v $p $line"; done
  if [ $((SAMPLES % APPS_EVERY)) = 0 ]; then
    mapfile -t APPS < <("$NVSMI" --query-compute-apps=pid,used_memory,gpu_bus_id --format=csv,noheader,nounits 2> /dev/null)
  fi
  for line in "${APPS[@]}"; do IFS=', ' read -r p k line <<< "$line"; [ -n "${intree[$p]-}" ] && echo "a $p $k $line"; done
  return 0
}

# record_progress RUN SECONDS: sample until the run is over (its trainer gone, or another run current).
record_progress() {
  local run=$1 every=$2 state pid='' pstart='' gone=0 n=0 log='' us=0 cur=''
  local -a MARKED=()
  state=${run%/runs/*}
  exec 7>> "$run/recorder.lock" || return 0
  flock -n 7 || return 0
  printf '%s %s\n' "$BASHPID" "$(stat_fields_into st "$BASHPID" && echo "${st[19]}")" > "$run/recorder_pid"
  NVSMI=$(command -v nvidia-smi 2> /dev/null) GPU_FD='' SAMPLES=0 APPS=()
  if [ -n "$NVSMI" ]; then
    # One nvidia-smi for the whole run (`-lms`: a line per GPU every interval from one NVML session; a call per sample
    # costs tens of ms of CPU on a GPU host), ended with the recorder: its keeper looks every 5 s whether the recorder
    # lives, so no nvidia-smi outlives a recorder that was killed.
    local me=$BASHPID ms
    ms=$(awk -v s="$every" 'BEGIN { printf "%d", (s < 0.5 ? 0.5 : s) * 1000 }')
    coproc GPUQ {
      "$NVSMI" --query-gpu=index,utilization.gpu,memory.used,pci.bus_id --format=csv,noheader,nounits -lms "$ms" 2> /dev/null &
      nv=$!
      while kill -0 "$me" 2> /dev/null && kill -0 "$nv" 2> /dev/null; do nap 5; done
      kill "$nv" 2> /dev/null
    }
    GPU_FD=${GPUQ[0]}
  fi
  while :; do
    { read -r cur < "$state/current"; } 2> /dev/null
    [ "$cur" = "${run##*/}" ] || break
    read_pid "$run/pid" pid pstart
    { read -r log < "$run/log_path"; } 2> /dev/null
    [ $((n % MARK_EVERY)) = 0 ] && mapfile -t MARKED < <(marked_pids "$run")
    if alive "$pid" "$pstart"; then gone=0; else gone=$((gone + 1)); fi
    # Over once its trainer and every marked process are gone, looked at twice (a trainer followed after its launcher).
    [ "$gone" -ge 2 ] && [ ${#MARKED[@]} = 0 ] && break
    tree_of "$pid" "${MARKED[@]}"
    { progress_sample "$log"; } >> "$run/progress" 2> /dev/null || break
    n=$((n + 1)) SAMPLES=$((SAMPLES + 1))
    if [ $((n % 32)) = 0 ] && [ "$(stat -c %s -- "$run/progress" 2> /dev/null || echo 0)" -gt "$RECORD_MAX_BYTES" ]; then
      # The newer half, from a sample's first line.
      tail -c $((RECORD_MAX_BYTES / 2)) -- "$run/progress" | sed -n '/^@ /,$p' > "$run/progress.tmp" && mv -f -- "$run/progress.tmp" "$run/progress"
    fi
    nap "$every"
  done
  rm -f -- "$run/recorder_pid"
}

# print_progress RUN: the record as a poll sends it: its last RECENT_SAMPLES samples whole, and before them one sample
# per bucket of the span (at most THINNED_SAMPLES), so a poll costs kilobytes however long the record is. The rules
# compare counters between samples (monotonic: a thinned record keeps every rise), and states per sample.
print_progress() {
  [ -s "$1/progress" ] || return 0
  awk -v recent=20 -v thinned=120 '
    NR == FNR { if ($1 == "@") { n++; if (n == 1) first = $2; last = $2 } next }
    $1 == "@" {
      i++; keep = 0
      if (i > n - recent) keep = 1
      else { b = int(($2 - first) / ((last - first) / thinned + 0.001)); if (b != bucket) { bucket = b; keep = 1 } }
    }
    keep' "$1/progress" "$1/progress"
}

# start_recorder RUN SECONDS: a recorder for RUN unless one lives; detached (its own session, / as its folder, no
# marker: it is no trainer and holds nothing of the run's folders), so the poll that starts it returns at once.
start_recorder() {
  local run=$1 every=$2 rp='' rs=''
  read_pid "$run/recorder_pid" rp rs && alive "$rp" "$rs" && return 0
  (
    cd / || exit 0
    unset RELAUNCH_RUN RELAUNCH_TARGET
    exec setsid -f bash --noprofile --norc -c "$(declare -f "${RECORDER_FUNCS[@]}"); RECORDER_FUNCS=(); RECORD_MAX_BYTES=$RECORD_MAX_BYTES; MARK_EVERY=$MARK_EVERY; APPS_EVERY=$APPS_EVERY; record_progress \"\$@\"" \
      relaunch-recorder "$run" "$every" < /dev/null > /dev/null 2>&1
  )
  return 0
}
