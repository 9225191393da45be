#!/usr/bin/env bash
# One command for a local relaunch control plane (`make serve`):
#   Prefect server (SQLite under PREFECT_HOME) -> process work pool `relaunch` -> the automations of
#   automations.yaml (scripts/automations.py) -> a worker. Your targets: `relaunch deploy TARGET.yaml` against it.
#   With SERVE_DEMO=1 (`make serve-demo`) also: one global concurrency limit per host named in prefect.yaml -> the demo
#   target prepared -> `prefect deploy --all` (the demo deployments of prefect.yaml, one of them nightly).
# Ctrl-C, SIGTERM or SIGHUP stops worker, demo trainer (if launched) and server, in that order: docs/operations.md,
# "Stopping make serve".
#
# Settings (environment):
#   SERVE_DEMO              default 0: no demo deployments; 1: prefect.yaml's demo deployments and their target
#   PREFECT_HOME            default .cache/prefect-home (the server's SQLite database lives there)
#   RELAUNCH_SERVE_HOST     default 127.0.0.1
#   RELAUNCH_SERVE_PORT     default 4200
#   RELAUNCH_DEMO_DIR       default .cache/serve/demo: the demo target's work folder
#   RELAUNCH_SERVE_PREPARE  default 1: (re)build the demo target there, never launched; 0 keeps the folder as is
#   RELAUNCH_SERVE_KEEP_TRAINER  default 0: 1 leaves a demo trainer the deployments launched running at exit
#   RELAUNCH_WHEELHOUSE     default .cache/wheelhouse (filled by `make setup`)
#   PREFECT_SERVER_UI_ENABLED=false  runs without the UI
#   RELAUNCH_NOTIFY_URL     unset: automations.yaml's automations notify nobody; set: a webhook block
#                           `relaunch-notify` POSTs their messages there as JSON (docs/operations.md, Notifications)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export PATH="$ROOT/.venv/bin:$PATH"
export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_CLI_PROMPT=false
PREFECT_HOME=$(realpath -m "${PREFECT_HOME:-$ROOT/.cache/prefect-home}")
export PREFECT_HOME
export PREFECT_WORKER_QUERY_SECONDS=${PREFECT_WORKER_QUERY_SECONDS:-5}
HOST=${RELAUNCH_SERVE_HOST:-127.0.0.1}
PORT=${RELAUNCH_SERVE_PORT:-4200}
# Absolute: they become the deployed target's paths.
RELAUNCH_DEMO_DIR=$(realpath -m "${RELAUNCH_DEMO_DIR:-$ROOT/.cache/serve/demo}")
RELAUNCH_WHEELHOUSE=$(realpath -m "${RELAUNCH_WHEELHOUSE:-$ROOT/.cache/wheelhouse}")
export RELAUNCH_DEMO_DIR RELAUNCH_WHEELHOUSE
RELAUNCH_DEMO_PYTHON=$(python -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
export RELAUNCH_DEMO_PYTHON
export PREFECT_API_URL="http://$HOST:$PORT/api"
DEMO=${SERVE_DEMO:-0}
PREPARE=${RELAUNCH_SERVE_PREPARE:-1}
[ "$DEMO" = 1 ] || PREPARE=0
KEEP_TRAINER=${RELAUNCH_SERVE_KEEP_TRAINER:-0}
mkdir -p "$PREFECT_HOME/logs" "$(dirname "$RELAUNCH_DEMO_DIR")"
LOGS="$PREFECT_HOME/logs" STATE="$RELAUNCH_DEMO_DIR/state" WORKER_NAME="make-serve-$$-$EPOCHSECONDS"
SERVE_PID="$PREFECT_HOME/serve.pid" WORKER_PID="$PREFECT_HOME/serve-worker.pid" SERVER_PID="$PREFECT_HOME/server.pid"
# Without the demo, a demo trainer an earlier `make serve-demo` left is not this one's to stop.
[ "$DEMO" = 1 ] || STATE=""
TTY_OWNER=${1:-} server_pid="" worker_pid="" helper="" hurry="" trainer_left="" last_signal=0
tty=$({ : </dev/tty; } 2>/dev/null && echo 1 || true)

say() { printf '[serve] %s\n' "$*"; }
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }
# The PID a file records, if that process still runs what it was recorded for (PIDs get reused).
recorded() { local p; p=$(cat "$1" 2>/dev/null) && alive "$p" && tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q -- "$2" && echo "$p" || true; }
# A closed terminal fails every write: what is said from then on goes to the log.
hung_up() { [ -n "$tty" ] && ! { : </dev/tty; } 2>/dev/null; }
# Wait (bounded) for a process to exit; true if it did.
wait_exit() { local i; for ((i = 0; i < $2 * 5; i++)); do alive "$1" || { wait "$1" 2>/dev/null; return 0; }; sleep 0.2; done; return 1; }
# A Prefect worker makes its first interrupt a SIGINT to itself (lost if it inherited SIGINT ignored: it starts with it
# restored) and its second a SIGKILL of itself: so one, a bounded wait, the second; then the rest of its process group.
stop_worker() {
  alive "$1" || return 0
  kill -INT "$1" 2>/dev/null && wait_exit "$1" 3 || { kill -INT "$1" 2>/dev/null; wait_exit "$1" 10; }
  kill -TERM -- "-$1" 2>/dev/null && sleep 1 && kill -KILL -- "-$1" 2>/dev/null
  say "worker $1 stopped"
}
stop_server() { alive "$1" || return 0; kill -TERM "$1"; wait_exit "$1" 30 || kill -KILL -- "-$1"; say "server $1 stopped"; } 2>/dev/null

# The demo trainer a deployment launched (tmux session relaunch-demo), stopped by its records with relaunch's own host
# script (SIGKILL after 20 s; at once in a hurry), in a session of its own: a Ctrl-C in the terminal does not cut it short.
stop_demo_trainer() {
  [ -d "$STATE" ] || return 0
  local seconds=${hurry:+0}
  (cd relaunch/host && exec setsid bash stop.sh "$STATE" relaunch-demo "${seconds:-20}") >"$LOGS/serve-trainer-stop.log" 2>&1 &
  helper=$!
  while alive "$helper"; do wait "$helper" || true; done && helper="" # a signal ends `wait` early: its trap runs first
  say "demo trainer: $(tail -n 1 "$LOGS/serve-trainer-stop.log")"
  if [ -n "$hurry" ] && [ -z "$seconds" ]; then stop_demo_trainer; fi
}
left() { local l=""; alive "$worker_pid" && l+="worker, "; [ -z "$trainer_left" ] || l+="trainer, "; alive "$server_pid" && l+="server, "; echo "${l%, }"; }

# A signal during the stop: the stop goes on, in order; a Ctrl-C or SIGTERM within 2 s of the last kills the rest now.
again() {
  local now=${EPOCHREALTIME//[!0-9]/} pid
  if [ "$1" = 129 ]; then ! hung_up || exec >>"$LOGS/serve.log" 2>&1 </dev/null; return; fi
  ((now - last_signal < 2000000)) || { last_signal=$now && say "still stopping ($(left)); press Ctrl-C again within 2 s to kill them now" && return; }
  hurry=1 && say "killing $(left) now"
  for pid in "$worker_pid" "$helper" "$server_pid"; do [ -z "$pid" ] || kill -KILL -- "-$pid" "$pid" 2>/dev/null; done
}

cleanup() {
  local rc=$? f
  set +e
  trap 'again 130' INT && trap 'again 143' TERM && trap 'again 129' HUP
  hung_up && exec >>"$LOGS/serve.log" 2>&1 </dev/null
  [ "$KEEP_TRAINER" != 1 ] && [ -d "$STATE" ] && trainer_left=1
  say "stopping ($(left))"
  stop_worker "$worker_pid"
  if [ "$KEEP_TRAINER" = 1 ]; then say "leaving the demo trainer (if any) running: tmux attach -t relaunch-demo"; else stop_demo_trainer; fi; trainer_left=""
  stop_server "$server_pid"
  jobs -pr | xargs -r kill 2>/dev/null # anything else started here and still running (a `prefect server status --wait`)
  for f in "$SERVE_PID:$$" "$WORKER_PID:$worker_pid" "$SERVER_PID:$server_pid"; do [ "$(cat "${f%:*}")" != "${f##*:}" ] || rm -f "${f%:*}"; done 2>/dev/null
  [ -z "$TTY_OWNER" ] || python -S -c 'import os, signal as s, sys; s.signal(s.SIGTTOU, s.SIG_IGN)
os.tcsetpgrp(os.open("/dev/tty", os.O_RDWR), int(sys.argv[1]))' "$TTY_OWNER" 2>/dev/null
  exit "$rc"
}

pid=$(recorded "$SERVE_PID" serve.sh)
[ -z "$pid" ] || { say "make serve already runs on PREFECT_HOME=$PREFECT_HOME (pid $pid): Ctrl-C in its terminal, or kill $pid"; exit 1; }
# Under make, Ctrl-C reaches make too, which dies at the second (the shell takes the terminal back mid-stop). So, as a
# shell does for a job, this takes the terminal for a process group of its own (same PID: make waits; given back at the
# end); Ctrl-Z is ignored.
read -r pgid tpgid < <(ps -o pgid=,tpgid= -p $$)
if [ "$tpgid" = "$pgid" ] && [ "$pgid" != $$ ]; then
  exec python -S -c 'import os, signal as s, sys; os.setpgid(0, 0); s.signal(s.SIGTTOU, s.SIG_IGN); s.signal(s.SIGTSTP, s.SIG_IGN)
os.tcsetpgrp(os.open("/dev/tty", os.O_RDWR), os.getpgrp()); s.signal(s.SIGTTOU, s.SIG_DFL); os.execvp("bash", ["bash", *sys.argv[1:]])' "$ROOT/scripts/serve.sh" "$pgid"
fi
echo $$ >"$SERVE_PID"
trap 'exit 130' INT && trap 'exit 143' TERM && trap 'exit 129' HUP && trap cleanup EXIT
# What an earlier `make serve` on this PREFECT_HOME left running (it was killed, or lost its terminal mid-stop).
worker_pid=$(recorded "$WORKER_PID" "worker start") server_pid=$(recorded "$SERVER_PID" "server start")
[ -z "$worker_pid$server_pid" ] || say "an earlier make serve left ${worker_pid:+worker $worker_pid }${server_pid:+server $server_pid }running: stopping it"
stop_worker "$worker_pid" || true; stop_server "$server_pid" || true
if curl -s -o /dev/null "http://$HOST:$PORT/api/health"; then
  pid=$(ss -Hltnp "sport = :$PORT" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2)
  say "something else answers on $HOST:$PORT${pid:+ (pid $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" | cut -c1-100))}: stop it, or set RELAUNCH_SERVE_PORT"
  exit 1
fi

say "starting the Prefect server on $HOST:$PORT (PREFECT_HOME=$PREFECT_HOME, log: $LOGS/serve-server.log)"
# Not `prefect server start --background`: 3.9.1 gives the server pipes to the CLI, which exits (its log is lost), and the
# terminal's Ctrl-C. So: a session of its own, a log file, and its PID in Prefect's server.pid (for `prefect server stop`).
# Concurrency leases (the per-host slots, the nightly deployment's slot) on disk under PREFECT_HOME, not in
# the server's memory: a server restart then neither strands a held slot nor fails its holder's renewal.
PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE=${PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE:-prefect.server.concurrency.lease_storage.filesystem} \
  setsid prefect server start --host "$HOST" --port "$PORT" >"$LOGS/serve-server.log" 2>&1 &
server_pid=$! && echo "$server_pid" >"$SERVER_PID" && say "server pid $server_pid"
prefect server status --wait --timeout 180 >/dev/null 2>&1 & checker=$!
if [ "$PREPARE" = 1 ]; then stop_demo_trainer; fi
# While the server starts: the demo target prepared (on stderr); the limit name of each host prefect.yaml names (fd 3).
limits=$([ "$DEMO" != 1 ] || python - "$PREPARE" 3>&1 1>&2 <<'EOF'
import os, sys, types, yaml
from relaunch.flows.recover import host_limit_name
from relaunch.config import Host
if sys.argv[1] == "1":
    __import__("relaunch.demo.scenarios").demo.scenarios.prepare("healthy", __import__("pathlib").Path(os.environ["RELAUNCH_DEMO_DIR"]))
params = [d.get("parameters") or {} for d in yaml.safe_load(open("prefect.yaml")).get("deployments") or []]
targets = [t for p in params for t in [p.get("target"), *(p.get("targets") or [])] if isinstance(t, dict)]
names = {host_limit_name(types.SimpleNamespace(host=Host.model_validate(t.get("host") or {}))) for t in targets}
os.write(3, " ".join(sorted(names)).encode())
EOF
)
# Whichever ends first: `status --wait` would not notice a server that exits.
if ! wait -n "$server_pid" "$checker" || ! alive "$server_pid"; then
  alive "$server_pid" && say "the server did not answer within 180 s" || { say "the server exited:"; tail -n 20 "$LOGS/serve-server.log"; }
  exit 1
fi
say "server healthy"
# Not `--overwrite`: on an existing pool 3.9.1 resets every field, which resumes a paused pool and clears a limit set
# with `prefect work-pool set-concurrency-limit`. An existing pool is left as it is.
out=$(prefect work-pool create relaunch --type process 2>&1) || grep -q "already exists" <<<"$out" || { echo "$out"; exit 1; }
say "work pool 'relaunch' (process) $(grep -q "already exists" <<<"$out" && echo exists || echo created)"
for name in $limits; do
  prefect gcl update "$name" --limit 1 >/dev/null 2>&1 || prefect gcl create "$name" --limit 1 >/dev/null; say "concurrency limit $name = 1"
done

if [ "$DEMO" = 1 ]; then
  say "deploying prefect.yaml (the demo)"
  # `prefect deploy` resumes a deployment paused as a whole: note what is paused now, pause it again after.
  python scripts/automations.py save-paused | sed 's/^/[serve] /'
  prefect deploy --all >"$LOGS/serve-deploy.log" 2>&1 || { tail -n 30 "$LOGS/serve-deploy.log"; exit 1; }
  grep -o "Deployment '[^']*' successfully created" "$LOGS/serve-deploy.log" | sed 's/^/[serve] /'
else
  say "no demo deployments (make serve-demo, or SERVE_DEMO=1, adds them)"
fi
# Re-pause, then the notification block (RELAUNCH_NOTIFY_URL) and the automations of automations.yaml.
python scripts/automations.py sync | sed 's/^/[serve] /'

say "starting a worker on pool 'relaunch' (log: $LOGS/serve-worker.log)"
setsid env --default-signal=INT prefect worker start --pool relaunch --type process --name "$WORKER_NAME" >"$LOGS/serve-worker.log" 2>&1 &
worker_pid=$! && echo "$worker_pid" >"$WORKER_PID" && say "worker pid $worker_pid"
# No CLI command waits for a worker: ask the API until it lists this one (an earlier run's can still show ONLINE).
for ((i = 0; i < 600; i++)); do
  curl -sf -X POST -H 'Content-Type: application/json' -d '{}' "$PREFECT_API_URL/work_pools/relaunch/workers/filter" 2>/dev/null | grep -q "\"name\":\"$WORKER_NAME\"" && break
  alive "$worker_pid" || { say "the worker exited:"; tail -n 20 "$LOGS/serve-worker.log"; exit 1; }
  sleep 0.2
done

ui="http://$HOST:$PORT"
[ "${PREFECT_SERVER_UI_ENABLED:-true}" = false ] && ui="(UI disabled)"
say "ready: UI $ui   API $PREFECT_API_URL"
say "  export PREFECT_API_URL=$PREFECT_API_URL"
if [ "$DEMO" = 1 ]; then
  say "  prefect deployment run 'recover-training/demo' --watch"
  say "  prefect deployment run 'check-training/nightly-demo' --watch     (also every night at 03:00 UTC)"
else
  say "  relaunch deploy TARGET.yaml        (its nightly check and its recovery, on this server)"
fi
say "  worker log: tail -f $LOGS/serve-worker.log"
say "Ctrl-C stops worker${STATE:+, demo trainer} and server, in that order"

# Until a signal, the server or the worker exiting, or the terminal closing: that signals only its session's leader
# (a shell passes it on to make's process group, not this one; make passes nothing on).
while alive "$server_pid" && alive "$worker_pid"; do hung_up && exit 129; sleep 1; done
say "$(alive "$server_pid" && echo worker || echo server) exited on its own"
exit 1
