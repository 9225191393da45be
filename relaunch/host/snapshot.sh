#!/usr/bin/env bash
# shellcheck shell=bash
# One health poll: waits up to $3 ms, returns the moment the trainer dies (and, with $13 = 1, the moment its log
# is written: a trainer already stepping is judged at the step line that settles it, not up to a poll later);
# sections marked with a per-poll nonce.
# shellcheck source=lib.sh
. ./lib.sh
state=$1 session=$2 wait_ms=$3 tail_n=$4 want_kernel=$5 nonce=$6 venv=$7 cache=$8 tail_bytes=$9 failure_re=${10} logdir=${11} ckpt=${12}
wake_ms=${13:-0} identity=${14:-} seen_step=${15:-} want_stacks=${16:-0} repo=${17:-} command=${18:-}
progress_wake_ms=${19:-0} progress_re=${20:-} record_s=${21:-0}
# py-spy where relaunch brought it (capture_stacks: STATE/tools) or on PATH; asked for only when stacks are wanted.
pyspy=''
if [ "$want_stacks" = 1 ]; then
  if [ -x "$state/tools/bin/py-spy" ]; then pyspy=$state/tools/bin/py-spy; else pyspy=$(command -v py-spy 2> /dev/null); fi
fi
if owner=$(foreign_state "$state" "$identity"); then
  echo "@@relaunch-$nonce@@ state_owner $owner"
  echo "@@relaunch-$nonce@@ end"
  exit 0
fi
M="@@relaunch-$nonce@@"
# What `grep -a -b -B 12 -m 30 -E RE LOG` prints, read incrementally so a poll costs the new bytes, not the
# whole log: RUN/scan keeps how far the log was scanned (and for which words), RUN/scan_matches what was found.
# A log that shrank, or other words, or another start ($5, where this run's text begins: nothing before it is
# scanned, not even as context), is scanned again from that start. Each new scan starts 64 KiB before the
# last one ended so that a failure just after it keeps its 12 lines of context; lines already kept are dropped.
scan_failures() {
  local run=$1 log=$2 size=$3 words=$4 base=${5:-0} from=0 sum='' key start seen last sep
  exec 8>> "$run/scan.lock" && flock -w 30 8
  key=$(printf '%s %s' "$words" "$base" | cksum); key=${key%% *}
  { read -r from sum < "$run/scan"; } 2> /dev/null
  if [ "$sum" != "$key" ] || [ "${from:-0}" -gt "$size" ] || [ ! -f "$run/scan_matches" ]; then from=$base; : > "$run/scan_matches"; fi
  seen=$(grep -c '^[0-9]*:' "$run/scan_matches")
  if [ "$seen" -lt 30 ] && [ "$from" -lt "$size" ]; then
    last=$(tail -n 1 "$run/scan_matches" | sed -n 's/^\([0-9]*\)[-:].*/\1/p')
    start=$(( from - 65536 > base ? from - 65536 : base )) sep=0
    [ -s "$run/scan_matches" ] && sep=1
    tail -c +$((start + 1)) -- "$log" | head -c $((size - start)) | grep -a -b -B 12 -m 60 -E "$words" \
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
# shellcheck source=panes.sh
. ./panes.sh
# shellcheck source=recorder.sh
. ./recorder.sh
# LOG=the file the run's writer has open when its log was renamed under it (rotation by rename), and FOLLOWED
# says so; kept in RUN/log_followed so that the poll after a death still reads the file the trainer wrote last.
# The writer: RUN/log_writer_pid (the process relaunch or the adoption recorded as writing the log) or its
# children (the supervisor's writer is a subshell whose `cat` holds the log), else, for an adopted run, the
# trainer's standard output. `-ef` (no process) tells whether the record still names the file they write.
follow_log() {
  local w='' ws='' fd f k
  local -a fds=()
  followed=''
  [ -n "$log" ] || return 0
  if alive "$pid" "$pstart"; then
    read_pid "$run/log_writer_pid" w ws
    if alive "$w" "$ws"; then
      load_tree
      fds=("/proc/$w/fd/1" /proc/"$w"/fd/*)
      for k in ${KIDS[$w]-}; do fds+=("/proc/$k/fd/1" /proc/"$k"/fd/*); done
    elif [ -e "$run/adopted" ]; then
      fds=("/proc/$pid/fd/1")
    fi
    for fd in "${fds[@]}"; do [ -f "$fd" ] && [ "$fd" -ef "$log" ] && { rm -f -- "$run/log_followed"; return 0; }; done
    for fd in "${fds[@]}"; do
      [ -f "$fd" ] && f=$(readlink "$fd") && [ -f "$f" ] && { followed=$f; break; }
    done
    # The log deleted under its writer (to free disk): the writer still writes it, readable through its descriptor.
    if [ -z "$followed" ] && [ ! -e "$log" ]; then
      for fd in "${fds[@]}"; do
        [ -f "$fd" ] && f=$(readlink "$fd") && [[ $f == "$log (deleted)" ]] && { followed=$fd; break; }
      done
    fi
    [ -n "$followed" ] && [ -w "$run" ] && { printf '%s\n' "$followed" > "$run/log_followed"; } 2> /dev/null
  else
    slurp followed "$run/log_followed"
    [ -n "$followed" ] && [ -f "$followed" ] || followed=''
  fi
  [ -n "$followed" ] && log=$followed
  return 0
}
# ACT_CPU=the CPU time of the PIDs given in clock ticks (utime+stime, and cutime+cstime of the children they reaped:
# inductor's compile workers), ACT_WCHAR=the bytes they wrote anywhere (/proc/PID/io, where readable), ACT_FILES=
# "SIZE MTIME PATH" of each regular file they hold open for writing (the log they really write, wherever it is, one
# deleted under them, a checkpoint being saved), ACT_WBYTES/ACT_WMTIME the sum of those sizes and the newest mtime.
# One find for every descriptor of the tree and one stat: not a process per descriptor.
tree_activity() {
  local p s k v fd flags line
  local -a f fds=() dirs=()
  local -A seen=() target=()
  ACT_CPU=0 ACT_WCHAR=0 ACT_FILES=() ACT_WBYTES=0 ACT_WMTIME=0
  for p in "$@"; do
    { s=$(< "/proc/$p/stat"); } 2> /dev/null || continue
    s=${s##*) }; read -ra f <<< "$s"
    ACT_CPU=$((ACT_CPU + f[11] + f[12] + f[13] + f[14]))
    if [ -r "/proc/$p/io" ]; then
      while read -r k v; do [ "$k" = wchar: ] && ACT_WCHAR=$((ACT_WCHAR + v)); done < "/proc/$p/io" 2> /dev/null
    fi
    dirs+=("/proc/$p/fd")
  done
  [ ${#dirs[@]} -gt 0 ] || return 0
  while read -r fd line; do
    case $line in /dev/* | /proc/* | /sys/* | *"/.relaunch"*) continue ;; esac
    flags=''
    while read -r k v; do [ "$k" = flags: ] && { flags=$v; break; }; done < "${fd%/fd/*}/fdinfo/${fd##*/}" 2> /dev/null
    { [ -n "$flags" ] && (( (8#$flags & 3) != 0 )); } || continue
    [ -n "${seen[$line]-}" ] && continue
    seen[$line]=1 target[$fd]=$line fds+=("$fd")
    [ ${#fds[@]} -ge 32 ] && break
  done < <(find "${dirs[@]}" -mindepth 1 -maxdepth 1 -lname '/*' -printf '%p %l\n' 2> /dev/null)
  [ ${#fds[@]} -gt 0 ] || return 0
  # stat -L reads through the descriptor: a file deleted (or renamed) under the writer is still sized and timed.
  while read -r k v fd; do
    ACT_FILES+=("$k $v ${target[$fd]-}")
    ACT_WBYTES=$((ACT_WBYTES + k))
    [ "${v%.*}" -ge "${ACT_WMTIME%.*}" ] && ACT_WMTIME=$v
  done < <(stat -L -c '%s %.9Y %n' -- "${fds[@]}" 2> /dev/null)
  return 0
}
run_id=$(current_run "$state")
run=$(run_folder "$state" "$run_id")
pid='' pstart='' spid='' sstart='' rpane='' rpane_start='' t=0 log='' exit_code='' started='' checkpoint='' stopped='' stopped_how='' followed=''
[ -n "$run_id" ] && read_pid "$run/pid" pid pstart
[ -n "$run_id" ] && read_pid "$run/supervisor_pid" spid sstart
[ -n "$run_id" ] && read_pid "$run/pane" rpane rpane_start
now_us t; end=$(( t + wait_ms * 1000 ))
# RUN/poll_mark is written (a redirection, no process) as each poll reads the log: a log newer than it (`-nt`,
# no process either) was written after the last poll read it. A write in the same clock tick as the mark goes
# unseen until the next one: a poll returns late then, never early. Not before WAKE_MS (the 13th argument, 0: no
# wake): a log written many times a second makes at most one poll per WAKE_MS.
ref='' log='' wake_from=$(( t + wake_ms * 1000 ))
if [ "$wake_ms" -gt 0 ] && [ -n "$run_id" ] && [ -f "$run/poll_mark" ]; then slurp log "$run/log_path"; follow_log; ref=$run/poll_mark; fi
# Sooner, not before PROGRESS_WAKE_MS (the 19th argument; 0: never), where what was written since the last poll
# read the log (RUN/poll_size: how far it read) holds a line like the 20th argument (a step word, it/s): a start-up's
# compile lines wake a poll once per WAKE_MS, its first step line at once. One look (tail and grep) per PROGRESS_WAKE_MS
# at most, and only while the log is newer than the mark.
read_upto='' progress_from=$(( t + progress_wake_ms * 1000 ))
if [ -n "$ref" ] && [ "$progress_wake_ms" -gt 0 ] && [ "$progress_wake_ms" -lt "$wake_ms" ] && [ -n "$progress_re" ] && [ -r "$run/poll_size" ]; then
  read -r read_upto < "$run/poll_size" || read_upto=''
  [[ $read_upto =~ ^[0-9]+$ ]] || read_upto=''
fi
while [ -n "$pid" ] && [ ! -e "$run/exit_code" ] && alive "$pid" "$pstart" && now_us t && [ "$t" -lt "$end" ]; do
  [ -n "$ref" ] && [ "$t" -ge "$wake_from" ] && [ "$log" -nt "$ref" ] && break
  if [ -n "$read_upto" ] && [ "$t" -ge "$progress_from" ] && [ "$log" -nt "$ref" ]; then
    grep -Eiqm1 -- "$progress_re" < <(tail -c +$((read_upto + 1)) -- "$log" 2> /dev/null) && break
    progress_from=$(( t + progress_wake_ms * 1000 ))
  fi
  nap 0.05
done
# The supervisor writes the exit code just after the trainer dies (once the log writer drained and no marked process
# of the run lives on: up to a second or so on a loaded host): wait while it lives, up to 5 s, never past its end.
waited=0
while [ "$waited" -lt 100 ]; do
  [ -e "$run/exit_code" ] && break; alive "$pid" "$pstart" && break; alive "$spid" "$sstart" || break; nap 0.05
  waited=$((waited + 1))
done
# Whether trainer and supervisor live is read before the exit record, once, and printed as read: a supervisor that
# recorded the exit and ended after the record was read (its trainer dying meanwhile) would otherwise read as a
# death with no exit code and no supervisor left to write one: silent_exit, for a trainer that exited with a code.
pid_up=0 sup_up=0
# A process on its way out (a zombie not yet reaped, a SIGKILL pending) is read as gone: it trains no more.
alive "$pid" "$pstart" && ! dying "$pid" && pid_up=1
alive "$spid" "$sstart" && sup_up=1
slurp log "$run/log_path"; slurp exit_code "$run/exit_code"; slurp started "$run/started_at"; slurp checkpoint "$run/checkpoint"
[ -n "$run_id" ] && follow_log
slurp stopped "$state/stopped"; slurp stopped_how "$state/stopped_how"
now_us t; now="${t%??????}.${t: -6}"
echo "$M run_id $run_id"
echo "$M launched $([ -n "$run_id" ] && echo 1 || echo 0)"
session_up=0
tmux has-session -t "=$session" 2> /dev/null && session_up=1
echo "$M session $session_up"
echo "$M pid $pid"
echo "$M pid_alive $pid_up"
echo "$M exit_code $exit_code"
# When the exit was recorded (host clock): a session ended after the trainer died did not stop it (its exit wins).
[ -n "$exit_code" ] && echo "$M exit_at $(stat -c %.9Y -- "$run/exit_code" 2> /dev/null)"
# The supervisor writes the exit code: while it lives, a dead trainer without one is still being recorded.
echo "$M supervisor_alive $sup_up"
echo "$M started_at $started"
# A repo_dir that is not there: nothing can be launched from it, and a check says so rather than a bare unknown.
[ -n "$repo" ] && [ ! -d "$repo" ] && echo "$M repo_missing $repo"
echo "$M checkpoint $checkpoint"
# The GPUs the current run was launched on: its spec's CUDA_VISIBLE_DEVICES ("-": none set), which a recovery may have
# moved off a ledgered GPU. Said only where the spec is there to read (a run adopted or launched before it was kept).
if [ -n "$run_id" ] && [ -r "$run/spec" ]; then
  visible=- spec=()
  mapfile -d '' spec < "$run/spec" 2> /dev/null
  for kv in "${spec[@]:3}"; do [[ $kv == CUDA_VISIBLE_DEVICES=* ]] && visible=${kv#CUDA_VISIBLE_DEVICES=}; done
  echo "$M launched_gpus $visible"
fi
echo "$M now $now"
echo "$M stopped_at $stopped"
echo "$M stopped_how $stopped_how"
[ -n "$run_id" ] && [ -e "$run/adopted" ] && echo "$M adopted 1"
[ -n "$followed" ] && echo "$M log_followed $followed"
if alive "$pid" "$pstart"; then
  # The run's whole tree, remembered across polls (RUN/tree): after a death the kernel's OOM lines about a
  # DataLoader worker or a rank are its, and lines about any other process are not.
  descendants "$pid"
  declare -A known=()
  { while read -r p; do known[$p]=1; done < "$run/tree"; } 2> /dev/null
  fresh=()
  for p in "$pid" "${DESC[@]}"; do [ -n "${known[$p]-}" ] || { known[$p]=1; fresh+=("$p"); }; done
  [ ${#fresh[@]} -gt 0 ] && [ -w "$run" ] && { printf '%s\n' "${fresh[@]}" >> "$run/tree"; } 2> /dev/null
  echo "$M tree"
  if [ -f "$run/tree" ]; then tail -n 4096 -- "$run/tree"; else printf '%s\n' "${fresh[@]}"; fi
  # What the tree itself does, whatever its log says (a buffered pipe, a log of its own elsewhere, a deleted log).
  tree_activity "$pid" "${DESC[@]}"
  echo "$M tree_cpu_ticks $ACT_CPU"
  echo "$M tree_wchar $ACT_WCHAR"
  echo "$M writing"
  printf '%s\n' "${ACT_FILES[@]}"
  # A log of its own: the trainer may log through Python `logging` to a file of its choosing while stdout stays
  # silent. The newest-written file it holds open that looks like a log (not the recorded log, not a checkpoint or
  # cache file) is read too; the judging side reads its steps where the recorded log has none.
  own='' own_m=0
  for line in "${ACT_FILES[@]}"; do
    read -r _ m f <<< "$line"
    case $f in *.log | *.txt | *.out | *.err | *.jsonl) ;; *) continue ;; esac
    [ -f "$f" ] || continue
    [ -n "$log" ] && [ "$f" -ef "$log" ] && continue
    [ -n "$ckpt" ] && [[ $f == "${ckpt%/}"/* ]] && continue
    [ -n "$cache" ] && [[ $f == "${cache%/}"/* ]] && continue
    [ "${m%.*}" -ge "${own_m%.*}" ] && own=$f own_m=$m
  done
  if [ -n "$own" ]; then
    echo "$M own_log $own"
    echo "$M own_log_tail"
    tail -c 65536 -- "$own" 2> /dev/null | tail -n "$tail_n"
    echo
  fi
  if [ -n "$pyspy" ] && [ -x "$pyspy" ]; then
    # Asked for while the log is quiet but the tree burns CPU: is it computing, or waiting in every thread?
    echo "$M stacks"
    n=0
    for p in "$pid" "${DESC[@]}"; do
      case $(< "/proc/$p/comm") in python* | pt_*) ;; *) continue ;; esac 2> /dev/null
      n=$((n + 1)); [ "$n" -gt 8 ] && break
      echo "=== py-spy dump --pid $p"
      timeout 20 "$pyspy" dump --pid "$p" 2>&1 | head -n 400
    done
  fi
  # The run's progress record (recorder.sh): started here for a live run that has none (a launch's first poll, an
  # adopted run, a run of an older relaunch, a recorder that died), and sent thinned, with a sample of this moment last.
  [ "$record_s" != 0 ] && [ -w "$run" ] && start_recorder "$run" "$record_s"
  echo "$M progress"
  print_progress "$run"
  TREE=("$pid" "${DESC[@]}") NVSMI='' us=0
  progress_sample "$log"
  # A checkpoint being written is progress: the newest mtime in checkpoint_dir (a save may last minutes).
  if [ -n "$ckpt" ] && [ -d "$ckpt" ]; then
    ckpt_mtime=$(find -H "$ckpt" -maxdepth 3 -printf '%T@\n' 2> /dev/null | awk '$1 > m { m = $1 } END { if (NR) printf "%s", m }')
    echo "$M checkpoint_mtime $ckpt_mtime"
  fi
elif [ -n "$run_id" ] && [ -f "$run/tree" ]; then
  echo "$M tree"
  tail -n 4096 -- "$run/tree"
fi
# With no live trainer on record: this target's trainers relaunch has no record of, found in the whole process table
# (a marker of this target but not of the current run, or the launch command's program running in the repo: a run
# started by hand outside tmux, a renamed target's, one whose state folder was removed). Reported, never acted on.
if ! alive "$pid" "$pstart"; then
  declare -A own=()
  if [ -n "$run_id" ]; then
    # The current run's own processes alive after its recorded trainer ended (they carry its marker): a launch command
    # that backgrounded its trainer (`nohup python train.py &`) exited 0 while that trainer trains on.
    survivors=()
    while read -r p; do
      own[$p]=1
      [ "$p" != "$$" ] && survivors+=("$p")
    done < <(marked_pids "$run")
    if [ ${#survivors[@]} -gt 0 ]; then
      echo "$M survivors"
      for p in "${survivors[@]:0:16}"; do cmdline_into c "$p" && echo "$p ${c:0:300}"; done
    fi
    { while read -r p; do own[$p]=1; done < "$run/tree"; } 2> /dev/null
  fi
  strays=()
  own[$$]=1
  server=$(tmux list-sessions -F '#{pid}' 2> /dev/null | head -n 1)
  [ -n "$server" ] && own[$server]=1
  while read -r p; do [ -z "${own[$p]-}" ] && [ "$p" != "$$" ] && strays+=("$p marker"); done < <(target_marked_pids "$state" "$state")
  while read -r p; do
    [ -z "${own[$p]-}" ] && [ "$p" != "$$" ] && [[ " ${strays[*]} " != *" $p marker "* ]] && strays+=("$p program")
  done < <(mapfile -t programs < <(programs_of "$command" "$repo"); pids_running_program_in "$repo" "${programs[@]}" | drop_other_targets "$state" "$logdir")
  # A trainer that set its own process title: a Python working in the repo that writes under log_dir or checkpoint_dir.
  while read -r p; do
    [ -z "${own[$p]-}" ] && [ "$p" != "$$" ] && [[ " ${strays[*]} " != *" $p "* ]] && strays+=("$p writer")
  done < <([ -n "$repo" ] && pids_python_writing_in "$repo" "$venv" "$logdir" "$ckpt" | drop_other_targets "$state" "$logdir")
  if [ ${#strays[@]} -gt 0 ]; then
    echo "$M strays"
    for line in "${strays[@]:0:16}"; do cmdline_into c "${line%% *}"; echo "$line ${c:0:300}"; done
  fi
fi
# What runs in the target's session when none of its panes is the current run's: a run started (or restarted)
# by hand, or a program that is no trainer. Reported, with the log it writes, never acted on here.
if [ "$session_up" = 1 ]; then
  read_panes "$session"
  if [ "$OURS" = 0 ] && [ ${#PANES[@]} -gt 0 ]; then
    echo "$M foreign"
    foreign_log=''
    for line in "${PANES[@]}"; do
      pane_tops "${line%% *}"
      for p in "${TOPS[@]}"; do cmdline_into c "$p"; echo "$p ${c:0:300}"; done
      [ ${#TOPS[@]} -gt 0 ] && [ -z "$foreign_log" ] && pane_log "${line%% *}" "$logdir" && foreign_log=$LOGF
    done
    [ -n "$foreign_log" ] && echo "$M foreign_log $foreign_log"
  fi
fi
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
  # Which processes hold GPU memory: the tree's own are the run's GPU work (another job's are not).
  if alive "$pid" "$pstart"; then
    echo "$M gpu_apps"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2> /dev/null | head -64
  fi
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
  # Only kernel lines since this run started: an older OOM kill or Xid on the host is not this run's cause, and
  # with no start on record (no run) no line is known to be newer than the run.
  if [ -n "$started" ]; then
    since=$(awk -v now="$now" -v s="$started" '{printf "%.3f\n", s - (now - $1)}' /proc/uptime)
    # A line without its own [stamp] continues the one before (drivers split "fallen off the bus" over lines).
    # The driver's UUID and serial lines come too: the GPU ledger (relaunch/deciding/ledger.py) names a failed GPU by them.
    printf '%s\n' "$kernel" | awk -v since="$since" '/^\[ *[0-9.]+\]/ { t = $0; sub(/^\[ */, "", t); split(t, a, "]"); at = a[1] + 0 } at >= since' \
      | grep -E 'Out of memory|oom-kill|oom_reaper|Killed process|NVRM: Xid|NVRM: The NVIDIA GPU|fallen off the bus|GPU is lost|NVRM: GPU at PCI:|GPU serial number is' | tail -n 16
  fi
fi
if [ -n "$log" ] && [ -f "$log" ]; then
  [ -w "$run" ] && { : > "$run/poll_mark"; } 2> /dev/null
  size=$(stat -L -c %s -- "$log")
  # How far this poll read (the mark is written first: a write between the two is newer than the mark, never lost).
  [ -w "$run" ] && { printf '%s\n' "$size" > "$run/poll_size"; } 2> /dev/null
  # Only this run's text: from RUN/log_offset ("SIZE SUM": where the run began, written at its launch or adoption),
  # not what earlier runs appended before it (`tee -a`, `>>`, many runs pointed at one file). A log now shorter than
  # that, or whose 64 bytes before it are no longer the ones summed (copytruncate, then new writes past it), was
  # rewritten since: all of its content is this run's. No record (a run of an older relaunch): the whole log.
  base=0 osum=''
  { read -r base osum < "$run/log_offset"; } 2> /dev/null
  [[ $base =~ ^[0-9]+$ ]] || base=0
  if [ "$base" -gt "$size" ]; then
    base=0
  elif [ "$base" -gt 0 ] && [ -n "$osum" ]; then
    from=$(( base > 64 ? base - 64 : 0 ))
    sum=$(tail -c +$((from + 1)) -- "$log" 2> /dev/null | head -c $((base - from)) | cksum); sum=${sum%% *}
    [ "$sum" = "$osum" ] || base=0
  fi
  # An adopted trainer that lives: the step lines it printed before its adoption are its progress, and its tail may
  # reach back for them (the failure scan does not). Dead, or launched by relaunch: the tail starts at the offset too.
  tail_from=$base
  [ -e "$run/adopted" ] && alive "$pid" "$pstart" && tail_from=0
  skip=$(( size - tail_bytes > tail_from ? size - tail_bytes : tail_from ))
  kept=$(tail -c +$((skip + 1)) "$log" | head -c $((size - skip)) | tail -n "$tail_n" | wc -c)
  echo "$M log_mtime $(date -r "$log" +%s.%N)"
  echo "$M log_size $size"
  echo "$M log_offset $base"
  echo "$M tail_start $((size - kept))"
  # Fewer than tail_n line breaks in the byte budget: the tail starts mid-line (never at the run's own first byte).
  [ "$skip" -gt "$tail_from" ] && [ "$kept" -eq $((size - skip)) ] && echo "$M tail_partial 1"
  # The earliest failures of this run's text, with the frames before them, each prefixed by its byte offset in the log.
  echo "$M matches"
  if [ -w "$run" ]; then
    scan_failures "$run" "$log" "$size" "$failure_re" "$base"
  else
    tail -c +$((base + 1)) -- "$log" | head -c $((size - base)) | grep -a -b -B 12 -m 30 -E "$failure_re" \
      | awk -v base="$base" 'match($0, /^[0-9]+[-:]/) { print substr($0, 1, RLENGTH - 1) + base substr($0, RLENGTH); next } { print }'
  fi | cut -c1-2000
  echo "$M tail"
  tail -c +$((size - kept + 1)) "$log" | head -c "$kept"
  echo
fi
# The launch command exited 0 through a wrapper script's pipeline (supervisor.sh, RUN/exit_masked): not the trainer's.
if [ -n "$run_id" ] && [ -s "$run/exit_masked" ]; then
  masked=''
  slurp masked "$run/exit_masked"
  echo "$M exit_masked ${masked//$'\n'/ }"
fi
# The journal's last STEP_CHANGES `S` lines whose step differs from the `S` line before.
STEP_CHANGES=40
step_changes() { awk '$1 == "S" && NF == 3 { if ($3 != last) print; last = $3 }' "$1" | tail -n "$STEP_CHANGES"; }
# The run's journal (RUN/journal): every poll of every check appends what it saw, so a stall window is judged from
# the run's own history, never from one look. `S HOSTTIME STEP` is the step the previous poll read in the log (the
# judging side parses step lines); `P NOW CPU_TICKS LOG_SIZE WRITTEN_BYTES WRITTEN_MTIME CKPT_MTIME` this poll.
if [ -n "$run_id" ] && [ -w "$run" ] && alive "$pid" "$pstart"; then
  {
    [ -n "$seen_step" ] && echo "S $seen_step"
    echo "P $now $ACT_CPU ${size:-0} $ACT_WBYTES $ACT_WMTIME ${ckpt_mtime:--}"
  } >> "$run/journal" 2> /dev/null
  # Bounded: a run polled every few seconds for weeks keeps its last thousand lines, and the lines where its step
  # changed: its step interval (the stall window) outlives a quiet stretch longer than the tail.
  if [ "$(stat -c %s -- "$run/journal" 2> /dev/null || echo 0)" -gt 262144 ]; then
    { step_changes "$run/journal"; tail -n 1000 -- "$run/journal"; } > "$run/journal.tmp" && mv -f -- "$run/journal.tmp" "$run/journal"
  fi
fi
if [ -n "$run_id" ] && [ -f "$run/journal" ]; then
  echo "$M journal"
  step_changes "$run/journal"
  tail -n 400 -- "$run/journal"
fi
echo "$M end"
