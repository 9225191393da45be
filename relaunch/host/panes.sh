#!/usr/bin/env bash
# shellcheck shell=bash
# Panes and process trees, shared by the health poll (snapshot.sh) and the adoption (adopt.sh), inlined where a
# script says `. ./panes.sh` (after `. ./lib.sh`): which panes of the target's session are the current run's, what
# runs in the others, and which log it writes. Uses run_id, run, spid and the RUN/pane record (rpane rpane_start)
# of the script that includes it.
# shellcheck disable=SC2154,SC2034  # reads run_id, run, spid, rpane, rpane_start; sets OURS, TOPS, LOGF for the includer
declare -A KIDS=()
tree_loaded=0
# One `ps` per poll answers every question about children: not one process per process asked about.
load_tree() {
  local p pp
  [ "$tree_loaded" = 1 ] && return 0
  if command -v ps > /dev/null 2>&1; then
    while read -r p pp; do KIDS[$pp]+=" $p"; done < <(ps -e -o pid=,ppid= 2> /dev/null)
  else  # a container without procps: the parent is field 4 of /proc/PID/stat (after the command's parenthesis)
    local s f
    local -a st
    for f in /proc/[0-9]*/stat; do
      { read -r s < "$f"; } 2> /dev/null || continue
      p=${f#/proc/} p=${p%/stat} s=${s##*) }
      read -ra st <<< "$s"
      KIDS[${st[1]}]+=" $p"
    done
  fi
  tree_loaded=1
}
# DESC=every descendant of PID (not PID itself), parents before children.
descendants() {
  local -a queue=("$1")
  local p k i=0
  DESC=()
  load_tree
  while [ "$i" -lt "${#queue[@]}" ]; do
    p=${queue[$i]} i=$((i + 1))
    for k in ${KIDS[$p]-}; do DESC+=("$k") queue+=("$k"); done
  done
}
# VAR=the command line of PID, its arguments joined by spaces (empty for a process that is gone).
cmdline_into() { local -a a=(); { mapfile -d '' a < "/proc/$2/cmdline"; } 2> /dev/null; printf -v "$1" '%s' "${a[*]}"; }
# A shell a person types into (tmux's default pane): no -c and no script to run. Its children are what was started.
interactive_shell() {
  local comm x
  local -a a=()
  { read -r comm < "/proc/$1/comm"; } 2> /dev/null || return 1
  case $comm in bash | zsh | sh | dash | fish | ksh | mksh) ;; *) return 1 ;; esac
  { mapfile -d '' a < "/proc/$1/cmdline"; } 2> /dev/null
  for x in "${a[@]:1}"; do [[ $x == -* && $x != --* && $x == *c* ]] && return 1; [[ $x == -* ]] || return 1; done
  return 0
}
# The current run's pane: the one RUN/pane names (PID and start time). A run launched before RUN/pane existed:
# the pane that runs its launcher, or the `tail --pid=SUPERVISOR` the launcher became.
ours_pane() {
  local c
  [ -n "$run_id" ] || return 1
  if [ -e "$run/pane" ]; then [ "$1" = "$rpane" ] && alive "$1" "$rpane_start"; return; fi
  cmdline_into c "$1"
  [[ $c == *"$run/launcher.sh"* ]] && return 0
  [ -n "$spid" ] && [[ " $c " == *" --pid=$spid "* ]]
}
# PANES=("PANEPID PANEID" ...) of session SESSION; OURS=1 when one of them is the current run's (then the
# others are windows a person opened beside it, not a run of their own).
read_panes() {
  local line dead
  PANES=() OURS=0
  while read -r dead line; do
    [ -n "$line" ] || continue
    # A pane whose program has ended (kept by `remain-on-exit`, or for a moment on a loaded host until tmux reaps it)
    # holds nothing: no run of anyone's, and no pane of ours.
    [ "$dead" = 1 ] && continue
    dying "${line%% *}" && continue
    PANES+=("$line")
    ours_pane "${line%% *}" && OURS=1
  done < <(tmux list-panes -s -t "=$1" -F '#{pane_dead} #{pane_pid} #{pane_id}' 2> /dev/null)
  return 0
}
# TOPS=what a person started in the pane whose process is PID: that process, or an interactive shell's children
# (none for an idle shell: nothing was started).
pane_tops() {
  local -a kids=()
  TOPS=("$1")
  interactive_shell "$1" || return 0
  load_tree
  read -ra kids <<< "${KIDS[$1]-}"
  TOPS=("${kids[@]}")
}
# VAR=the file `tee` PID writes: its first file argument (resolved against its working folder) while tee has
# that file open, else the first regular file it has open (the argument's file was renamed).
tee_file_into() {
  local -a a=()
  local x cwd fd opts=1
  { mapfile -d '' a < "/proc/$2/cmdline"; } 2> /dev/null
  for x in "${a[@]:1}"; do
    [ "$opts" = 1 ] && [ "$x" = -- ] && { opts=0; continue; }
    [ "$opts" = 1 ] && [[ $x == -?* ]] && continue
    [[ $x == /* ]] || { cwd=$(readlink "/proc/$2/cwd") && x=$cwd/$x; }
    for fd in /proc/"$2"/fd/*; do [ -f "$fd" ] && [ "$fd" -ef "$x" ] && { printf -v "$1" '%s' "$x"; return 0; }; done
    break
  done
  for fd in /proc/"$2"/fd/*; do
    [ -f "$fd" ] && x=$(readlink "$fd") && [ -f "$x" ] && { printf -v "$1" '%s' "$x"; return 0; }
  done
  return 1
}
# VAR=the newest-written regular file PID holds open for writing (fdinfo flags) under DIR: a trainer that logs through
# Python `logging` to the target's log_dir while its output goes to the terminal. Fails when it holds none there.
written_file_under_into() {
  local _d=${3%/} _r _fd _k _v _flags _f _m _best='' _best_m=0
  [ -n "$_d" ] || return 1
  _r=$(readlink -f -- "$_d" 2> /dev/null) || _r=$_d
  for _fd in /proc/"$2"/fd/*; do
    _f=$(readlink "$_fd" 2> /dev/null) || continue
    [[ $_f == "$_r"/* || $_f == "$_d"/* ]] || continue
    [ -f "$_fd" ] || continue
    _flags=''
    while read -r _k _v; do [ "$_k" = flags: ] && { _flags=$_v; break; }; done < "/proc/$2/fdinfo/${_fd##*/}" 2> /dev/null
    { [ -n "$_flags" ] && (( (8#$_flags & 3) != 0 )); } || continue
    _m=$(stat -L -c %Y -- "$_fd" 2> /dev/null) || continue
    if [ -z "$_best" ] || [ "$_m" -gt "$_best_m" ]; then _best=$_f _best_m=$_m; fi
  done
  [ -n "$_best" ] && printf -v "$1" '%s' "$_best"
}
# LOGF=the log the processes of pane PID write, WRITER=the process writing it, HOW=how it was found: `tee` (a
# tee's file), `stdout` (a process whose standard output is a regular file) or, given LOGDIR (the target's log_dir),
# `open` (a file a process of the pane holds open for writing there). Fails when none is found.
# shellcheck disable=SC2034  # WRITER and HOW are for the adoption; the poll reads LOGF only
pane_log() {
  local p comm f
  LOGF='' WRITER='' HOW=''
  descendants "$1"
  for p in "$1" "${DESC[@]}"; do
    comm=''
    { read -r comm < "/proc/$p/comm"; } 2> /dev/null
    [ "$comm" = tee ] && tee_file_into LOGF "$p" && { WRITER=$p HOW=tee; return 0; }
  done
  for p in "$1" "${DESC[@]}"; do
    [ -f "/proc/$p/fd/1" ] && f=$(readlink "/proc/$p/fd/1") && [ -f "$f" ] && { LOGF=$f WRITER=$p HOW=stdout; return 0; }
  done
  [ -n "${2-}" ] || return 1
  for p in "$1" "${DESC[@]}"; do
    written_file_under_into f "$p" "$2" && { LOGF=$f WRITER=$p HOW=open; return 0; }
  done
  return 1
}
