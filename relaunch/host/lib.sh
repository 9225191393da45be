#!/usr/bin/env bash
# shellcheck shell=bash
# What every host script shares. relaunch sends a script as `bash -c TEXT label ARGS...` with this file
# inlined where it says `. ./lib.sh`; an operator can also run one by hand from this folder:
#   bash snapshot.sh STATE SESSION 0 200 1 x VENV CACHE 262144 Error LOGDIR ""

# The run folder (relaunch/runlayout.py says the same in Python):
#   STATE/current                 the run id of the current attempt
#   STATE/runs/ID/pid             "PID STARTTIME" of the trainer
#   STATE/runs/ID/supervisor_pid  "PID STARTTIME" of its supervisor (leader of its process group)
#   STATE/runs/ID/exit_code       written when the trainer exits
#   STATE/runs/ID/{log_path,started_at,checkpoint,spec,launcher.sh,supervisor.sh}
#   STATE/runs/ID/{scan,scan_matches,scan.lock,poll_mark,poll_size}  the health poll's bookkeeping (snapshot.sh)
# Files are read with bash's own `$(< FILE)` (no cat process): a fleet check runs this on every host, often.
current_run() { local r; { r=$(< "$1/current"); } 2> /dev/null || return 1; printf '%s\n' "$r"; }
# VAR=the contents of FILE (without the final newline), empty if it cannot be read.
slurp() { { printf -v "$1" '%s' "$(< "$2")"; } 2> /dev/null || printf -v "$1" ''; }
# VAR=the time in microseconds since the epoch (bash 5's EPOCHREALTIME; `date` on older shells).
now_us() { if [ -n "${EPOCHREALTIME-}" ]; then printf -v "$1" '%s' "${EPOCHREALTIME/[.,]/}"; else printf -v "$1" '%s' "$(date +%s%6N)"; fi; }
run_folder() { printf "%s/runs/%s" "$1" "$2"; }

# A PID is alive only if /proc still shows its recorded start time (no PID reuse) and it is no zombie.
# VAR=the start time of PID; fails for no such process or a zombie. No subshell: the health poll's wait loop
# asks this every 50 ms for the whole of a trainer's start-up, on the cores that start-up needs.
# The fields of /proc/PID/stat after the command name into the array NAME (its state is [0], its flags [6], its start
# time [19]); fails when PID is gone. The one reader of it: a command name may hold spaces and ")", so it is cut first.
stat_fields_into() { local -n _fields=$1; local s; { s=$(< "/proc/$2/stat"); } 2> /dev/null || return 1; s=${s##*) }; read -ra _fields <<< "$s"; }
starttime_into() { local -a f; stat_fields_into f "$2" && [ "${f[0]}" != Z ] || return 1; printf -v "$1" '%s' "${f[19]}"; }
starttime() { local t; starttime_into t "$1" && echo "$t"; }
alive() { local t; [ -n "$1" ] && [ -n "$2" ] && starttime_into t "$1" && [ "$t" = "$2" ]; }
# Whether PID is on its way out though it still looks alive: exiting (PF_EXITING, 0x4, in /proc/PID/stat's flags:
# a SIGKILLed process freeing gigabytes of memory stays there a while) or with a SIGKILL pending (SigPnd/ShdPnd bit 9).
dying() {
  local k v
  local -a f
  stat_fields_into f "$1" || return 0
  [ "${f[0]}" = Z ] || [ "${f[0]}" = X ] || (( f[6] & 4 )) && return 0
  while read -r k v; do
    case $k in SigPnd: | ShdPnd:) (( 16#$v & 0x100 )) && return 0 ;; esac
  done < "/proc/$1/status" 2> /dev/null
  return 1
}
# Wait (at most SECONDS) until the tmux server either holds sessions or has gone: one that is exiting, after its last
# session ended, destroys a session created in that moment along with the rest.
tmux_settled() {
  local end=$(( SECONDS + $1 )) seen
  while [ "$SECONDS" -lt "$end" ]; do
    seen=$(tmux list-sessions -F . 2>&1) && [ -n "$seen" ] && return 0
    case $seen in *"no server running"* | *"error connecting"*) return 0 ;; esac
    nap 0.01
  done
}
# Sleep SECONDS without a process: a read that times out on a pipe this shell holds both ends of (never ready).
nap() {
  [ -n "${NAP_FD-}" ] || exec {NAP_FD}<> <(:) || { sleep "$1"; return 0; }
  read -rt "$1" -u "$NAP_FD" _ 2> /dev/null || true
}
read_pid() { [ -r "$1" ] && read -r "$2" "$3" < "$1"; }
# "PID STARTTIME" into FILE, atomically.
record_pid() { echo "$1 $(starttime "$1")" > "$2.tmp" && mv -f "$2.tmp" "$2"; }
# Every process carrying this run's marker in its environment (the supervisor puts RELAUNCH_RUN=<run folder>
# into the trainer's environment; launchers like torchrun pass it on to ranks they start in sessions of their own).
# One grep over every environment (NUL-separated entries, -z): not two processes per process on the host.
marked_pids() { local f p; while IFS= read -r f; do p=${f#/proc/}; echo "${p%/environ}"; done < <(grep -lszxF -- "RELAUNCH_RUN=$1" /proc/[0-9]*/environ); return 0; }

# Text quoted for grep's basic regular expressions (BRE): a path matched literally inside a pattern.
bre_quote() { local s=$1 out='' c i; for ((i = 0; i < ${#s}; i++)); do c=${s:i:1}; case $c in '.' | '[' | '*' | '^' | '$' | "\\") out+="\\$c" ;; *) out+=$c ;; esac; done; printf '%s' "$out"; }
# Text quoted for a find/fnmatch glob (-lname): a path matched literally, with a pattern after it.
glob_quote() { local s=$1 out='' c i; for ((i = 0; i < ${#s}; i++)); do c=${s:i:1}; case $c in '*' | '?' | '[' | ']' | "\\") out+="\\$c" ;; *) out+=$c ;; esac; done; printf '%s' "$out"; }
# Every live process carrying a marker of the target whose state folder is STATE: RELAUNCH_TARGET=STATE, or a
# RELAUNCH_RUN naming a run folder under STATE/runs/ or under each further folder given (a legacy state folder,
# whose runs were marked before RELAUNCH_TARGET existed). One grep over every environment, as marked_pids.
target_marked_pids() {
  local state=$1 s f p
  local -a re=(-e "^RELAUNCH_TARGET=$(bre_quote "$state")\$")
  for s in "$@"; do [ -n "$s" ] && re+=(-e "^RELAUNCH_RUN=$(bre_quote "$s")/runs/"); done
  while IFS= read -r f; do p=${f#/proc/}; echo "${p%/environ}"; done < <(grep -lsz "${re[@]}" /proc/[0-9]*/environ)
  return 0
}
# Every live process with a file open under DIR (as given, and as resolved: /proc shows resolved paths), one PID a
# line: a trainer started by hand writes its checkpoints there. Unreadable fds (other users', not root) are skipped.
pids_with_files_under() {
  local d=${1%/} r
  r=$(readlink -f -- "$d" 2> /dev/null) || r=$d
  find /proc/[0-9]*/fd -lname "$(glob_quote "$d")/*" -o -lname "$(glob_quote "$r")/*" 2> /dev/null | cut -d/ -f3 | sort -un
  return 0
}
# Every live process with a file open FOR WRITING under DIR (write-only or read-write, by /proc/PID/fdinfo's flags, as
# snapshot.sh's tree_activity reads them), one PID a line: a trainer writes its checkpoints there; a backup, an
# evaluation or a person's `python -c "torch.load(...)"` only reads them, and is no second trainer.
pids_writing_files_under() {
  local d=${1%/} r fd k v flags p last=''
  r=$(readlink -f -- "$d" 2> /dev/null) || r=$d
  while IFS= read -r fd; do
    p=${fd#/proc/} p=${p%%/*}
    [ "$p" = "$last" ] && continue
    flags=''
    while read -r k v; do [ "$k" = flags: ] && { flags=$v; break; }; done < "/proc/$p/fdinfo/${fd##*/}" 2> /dev/null
    { [ -n "$flags" ] && (( (8#$flags & 3) != 0 )); } || continue
    last=$p
    printf '%s\n' "$p"
  done < <(find /proc/[0-9]*/fd -lname "$(glob_quote "$d")/*" -o -lname "$(glob_quote "$r")/*" 2> /dev/null)
  return 0
}
# The program a launch command runs, as its processes' arguments name it: the first word naming a script (`train.py`,
# `start.sh`, by its file name), or the module after `-m`. Empty when the command names neither.
program_of() {
  local -a cmd_words=()
  local x prev=''
  read -ra cmd_words <<< "$1"
  for x in "${cmd_words[@]}"; do
    [ "$prev" = -m ] && { printf '%s\n' "$x"; return 0; }
    case $x in *.py | *.sh) printf '%s\n' "${x##*/}"; return 0 ;; esac
    prev=$x
  done
  return 0
}
# programs_of COMMAND REPO: the launch command's program, and where it is a shell script (`bash start_training.sh`,
# read as REPO sees it), the programs its lines run (`python train.py`, `torchrun -m pkg.train`): a trainer
# restarted by hand runs the script's program without the script. One per line, one level deep.
programs_of() {
  local command=$1 repo=${2%/} program script line word
  local -a parts=()
  program=$(program_of "$command")
  [ -n "$program" ] || return 0
  printf '%s\n' "$program"
  [[ $program == *.sh ]] || return 0
  read -ra parts <<< "$command"
  for word in "${parts[@]}"; do
    [[ $word == *.sh ]] || continue
    script=$word
    [[ $script == /* ]] || script=$repo/$script
    [ -f "$script" ] && [ -r "$script" ] || return 0
    while IFS= read -r line || [ -n "$line" ]; do
      line=${line%%#*}
      [[ $line == *.py* || $line == *.sh* || $line == *" -m "* ]] || continue
      program_of "$line"
    done < "$script" | sort -u
    return 0
  done
}
# Every live process that runs one of PROGRAMS (an argument naming it) with its working folder in REPO (or under
# it), or naming it by a path under REPO from any folder (`cd / && nohup python /root/dflash/train.py &`): a trainer
# started by hand, outside tmux, under another target name, carries no marker but this. Only processes that run
# programs (an interpreter, a shell, a launcher): `vim train.py` in the repo is no trainer.
pids_running_program_in() {
  local repo=${1%/} r p f comm x program
  shift
  local -a a=() programs=("$@")
  local -A in_repo=() seen=()
  [ -n "$repo" ] && [ ${#programs[@]} -gt 0 ] && [ -n "${programs[0]}" ] || return 0
  r=$(readlink -f -- "$repo" 2> /dev/null) || r=$repo
  # Two looks over the whole table, one process each (a bash loop over every PID costs seconds on a host of thousands):
  # the processes working in the repo, and those whose arguments name a path in it.
  while IFS= read -r f; do p=${f#/proc/} p=${p%/cwd}; in_repo[$p]=1; done \
    < <(find /proc/[0-9]*/cwd -maxdepth 0 \( -lname "$(glob_quote "$r")" -o -lname "$(glob_quote "$r")/*" \) 2> /dev/null)
  while IFS= read -r p; do
    { [ -n "${seen[$p]-}" ] || [ -z "$p" ]; } && continue
    seen[$p]=1
    { read -r comm < "/proc/$p/comm"; } 2> /dev/null || continue
    case $comm in python* | torchrun | pt_* | bash | sh | dash | zsh | deepspeed | accelerate | uv | mpirun | srun | composer) ;; *) continue ;; esac
    a=()
    { mapfile -d '' a < "/proc/$p/cmdline"; } 2> /dev/null
    for x in "${a[@]:1}"; do
      for program in "${programs[@]}"; do
        [ -n "$program" ] || continue
        if { [ -n "${in_repo[$p]-}" ] && { [ "$x" = "$program" ] || [[ $x == */"$program" ]]; }; } \
          || [[ $x == "$r/$program" || $x == "$r"/*/"$program" || $x == "$repo/$program" || $x == "$repo"/*/"$program" ]]; then
          printf '%s\n' "$p"
          continue 3
        fi
      done
    done
  done < <(
    printf '%s\n' "${!in_repo[@]}"
    grep -lsaF -e "$r/" -e "$repo/" /proc/[0-9]*/cmdline 2> /dev/null | cut -d/ -f3
  )
  return 0
}
# Every live process that works in REPO (its working folder in or under it), whose executable is a Python (a python*
# binary, or one under VENV), and that holds a file open for writing under one of the FOLDERS given (the target's
# log_dir, checkpoint_dir): a trainer started by hand that set its own process title (setproctitle, `exec -a NAME`:
# neither its arguments nor its command name say train.py any more). Found by what it is and what it writes, never by
# its name.
pids_python_writing_in() {
  local repo=${1%/} venv=${2%/} r p wd x d
  shift 2
  local -A writes=()
  [ -n "$repo" ] || return 0
  r=$(readlink -f -- "$repo" 2> /dev/null) || r=$repo
  for d in "$@"; do
    if [ -n "$d" ] && [ -d "$d" ]; then
      while read -r p; do writes[$p]=1; done < <(pids_writing_files_under "$d")
    fi
  done
  for p in "${!writes[@]}"; do
    wd=$(readlink "/proc/$p/cwd" 2> /dev/null) || continue
    [[ $wd == "$r" || $wd == "$r"/* || $wd == "$repo" || $wd == "$repo"/* ]] || continue
    x=$(readlink "/proc/$p/exe" 2> /dev/null) || continue
    if [[ ${x##*/} == python || ${x##*/} == python[0-9]* ]] || { [ -n "$venv" ] && [[ $x == "$venv"/* ]]; }; then
      printf '%s\n' "$p"
    fi
  done
  return 0
}
# The PIDs read (one a line), less those of another target: a process carrying RELAUNCH_TARGET of another state folder
# than STATE whose run (its RELAUNCH_RUN folder's log_path) logs into another folder than LOGDIR. Two targets may run
# the same program from one repo; the other's trainer writes its own log_dir, and is no trainer of this one (nor a
# reason never to launch it). One whose run logs into LOGDIR is kept: this target renamed (a new state folder).
drop_other_targets() {
  local state=$1 logdir=${2%/} p e tgt run lp
  local -a env=()
  logdir=$(readlink -f -- "$logdir" 2> /dev/null) || logdir=${2%/}
  while read -r p; do
    env=() tgt='' run='' lp=''
    { mapfile -d '' env < "/proc/$p/environ"; } 2> /dev/null
    for e in "${env[@]}"; do
      case $e in RELAUNCH_TARGET=*) tgt=${e#RELAUNCH_TARGET=} ;; RELAUNCH_RUN=*) run=${e#RELAUNCH_RUN=} ;; esac
    done
    if [ -n "$tgt" ] && [ "$tgt" != "$state" ] && [ -n "$run" ] && [ -n "$logdir" ]; then
      slurp lp "$run/log_path"
      lp=${lp%/*}
      lp=$(readlink -f -- "$lp" 2> /dev/null) || lp=''
      [ -n "$lp" ] && [ "$lp" != "$logdir" ] && continue
    fi
    printf '%s\n' "$p"
  done
  return 0
}
# "  PID N: COMMAND LINE" for each live PID given: what a refusal names, so that a person can tell what it is.
describe_pids() { local p a; for p in "$@"; do a=''; { a=$(tr '\0' ' ' < "/proc/$p/cmdline"); } 2> /dev/null; [ -n "$a" ] && echo "  PID $p: ${a% }"; done; return 0; }
# The oldest live process among the PIDs given (by start time, then PID): the first process of a backgrounded trainer.
oldest_pid() {
  local p t best='' bt=''
  for p in "$@"; do
    starttime_into t "$p" || continue
    if [ -z "$best" ] || [ "$t" -lt "$bt" ] || { [ "$t" = "$bt" ] && [ "$p" -lt "$best" ]; }; then best=$p bt=$t; fi
  done
  [ -n "$best" ] && echo "$best"
}
# Claim STATE for the target IDENTITY ("name repo_dir tmux_session", one line): STATE/target is written when absent
# (by a hard link of a full file: a reader never sees it half-written); a state folder holding another target's
# identity ends the calling script with exit 20. Two targets sharing a state folder would read, stop and relaunch
# each other's trainers.
# Prints the identity in STATE/target and succeeds when it is another target's (ID given, folder claimed, not by ID).
# Polls and stops ask it first: a state folder of another target is never read as this one's, nor acted on.
foreign_state() {
  local held=''
  [ -n "$2" ] && [ -e "$1/target" ] || return 1
  slurp held "$1/target"
  [ "$held" != "$2" ] && printf '%s\n' "${held:-unreadable: $1/target}"
}
claim_state() {
  local state=$1 id=$2 held='' tmp
  mkdir -p -- "$state" || { echo "cannot create the state folder $state"; exit 12; }
  if [ ! -e "$state/target" ]; then
    tmp=$state/.target.$$.tmp
    printf '%s\n' "$id" > "$tmp" && { ln -- "$tmp" "$state/target" 2> /dev/null || [ -e "$state/target" ] || (set -C && cat -- "$tmp" > "$state/target") 2> /dev/null; }
    rm -f -- "$tmp"
  fi
  slurp held "$state/target"
  [ "$held" = "$id" ] && return 0
  echo "state folder $state belongs to another target (${held:-unreadable: $state/target}), not to this one ($id): two targets sharing a state folder stop and relaunch each other's trainers. Give this target its own state_dir; if it is the same target renamed (name, repo_dir or tmux_session changed), check that no trainer of the old one runs and remove $state/target"
  exit 20
}
