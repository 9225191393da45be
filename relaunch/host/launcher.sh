#!/usr/bin/env bash
# shellcheck shell=bash
# relaunch launcher. The pane shows the log; the log is the record. $1: the run folder.
# shellcheck source=lib.sh
. ./lib.sh
run=$1
state=${run%/runs/*}
setsid -f bash "$run/supervisor.sh" "$run" < /dev/null > /dev/null 2>&1
log=$(cat "$run/log_path")
touch -- "$log"
# `tmux kill-session` (or kill-server, or the server's end) hangs the pane up. A person ending the session ends the
# run it holds, as it ends a run started by hand in a pane: the trainer (the supervisor's process group, and the
# run's marked processes in sessions of their own) gets the SIGHUP a pane's program gets, so a trainer that saves on
# it saves, and one that ignores it (nohup) lives on, as by hand. Recorded as a deliberate stop (STATE/stopped, and
# STATE/stopped_how), so that no check relaunches what a person ended. A stop by relaunch closes this pane only once
# its trainer is gone: nothing is left to end then, and nothing is recorded here.
hung_up() {
  local pid='' pstart='' spid='' sstart='' us p
  trap '' HUP TERM
  # The next launch closed this pane (its trainer gone): nothing was stopped.
  [ -e "$run/pane_closed_by_launch" ] && exit 0
  read_pid "$run/pid" pid pstart
  # A trainer already dying (SIGKILLed with its group a moment before the session was ended) was not stopped by it.
  if alive "$pid" "$pstart" && ! dying "$pid"; then
    now_us us
    printf '%d.%06d\n' "$((us / 1000000))" "$((us % 1000000))" > "$state/stopped.tmp" && mv -f "$state/stopped.tmp" "$state/stopped"
    printf 'tmux session ended (tmux kill-session, kill-server or the tmux server gone)\n' > "$state/stopped_how"
    { printf '[relaunch] %s: the tmux session was ended: SIGHUP to its trainer (PID %s: %s), recorded as a deliberate stop\n' \
      "$(date -u +%FT%TZ)" "$pid" "$(tr '\0' ' ' < "/proc/$pid/cmdline" | cut -c1-120)" >> "$log"; } 2> /dev/null
    read_pid "$run/supervisor_pid" spid sstart
    alive "$spid" "$sstart" && kill -HUP -- "-$spid" 2> /dev/null
    for p in $(marked_pids "$run"); do kill -HUP "$p" 2> /dev/null; done
  fi
  exit 129
}
trap hung_up HUP
# The pane lives as long as the supervisor. A supervisor slow to record itself (a loaded host) must not end the
# pane, and with it the tmux session, under a trainer that runs on: without its PID the pane follows the log
# until the session is stopped. `tail` runs as a child, not exec'd, so that this shell is there to hear the hangup.
spid=''
for _ in $(seq 2400); do [ -s "$run/supervisor_pid" ] && read -r spid _ < "$run/supervisor_pid" && break; nap 0.05; done
if [ -n "$spid" ]; then
  tail -n +1 -F --pid="$spid" -- "$log" 2> /dev/null &
else
  echo "[relaunch] the supervisor did not record its PID within 120 s; following the log" >> "$log"
  tail -n +1 -F -- "$log" 2> /dev/null &
fi
follower=$!
# `wait` returns early for a trapped signal (the handler runs then): wait again until the follower has ended.
while kill -0 "$follower" 2> /dev/null; do wait "$follower"; done
