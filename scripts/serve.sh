#!/usr/bin/env bash
# One command for a local relaunch control plane (`make serve`):
#   Prefect server (SQLite under PREFECT_HOME) -> process work pool `relaunch` -> one global concurrency
#   limit per host named in prefect.yaml -> the demo target prepared -> `prefect deploy --all` -> the automations of
#   automations.yaml (scripts/automations.py) -> a worker.
# Ctrl-C or SIGTERM stops the worker, the demo trainer (if one was launched) and the server, in that order.
#
# Settings (environment):
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
PREPARE=${RELAUNCH_SERVE_PREPARE:-1}
KEEP_TRAINER=${RELAUNCH_SERVE_KEEP_TRAINER:-0}
mkdir -p "$PREFECT_HOME/logs" "$(dirname "$RELAUNCH_DEMO_DIR")"
SERVER_LOG="$PREFECT_HOME/logs/serve-server.log"
WORKER_LOG="$PREFECT_HOME/logs/serve-worker.log"
server_pid="" worker_pid=""

say() { printf '[serve] %s\n' "$*"; }

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# Wait (bounded) for a process we started to exit; true if it did.
wait_exit() {
  local pid=$1 seconds=$2 i
  for ((i = 0; i < seconds * 5; i++)); do alive "$pid" || { wait "$pid" 2>/dev/null || true; return 0; }; sleep 0.2; done
  return 1
}

# The demo trainer a deployment launched (tmux session relaunch-demo), stopped by its records.
stop_demo_trainer() {
  [ -d "$RELAUNCH_DEMO_DIR/logs/.relaunch" ] || return 0
  python - <<'EOF' || true
import os
from relaunch.config import Target
from relaunch.transport import run, transport_for
from tasks.stop import plan_stop

d = os.environ["RELAUNCH_DEMO_DIR"]
target = Target(name="relaunch-demo", tmux_session="relaunch-demo", repo_dir=f"{d}/repo", venv_dir=f"{d}/venv", lock_file="x", launch_command="true", log_dir=f"{d}/logs")
result = run(transport_for(target.host), plan_stop(target, 20), check=False)
print("[serve] demo trainer:", (result.stdout.strip().splitlines() or ["nothing to stop"])[-1])
EOF
}

cleanup() {
  local rc=$?
  trap - INT TERM EXIT
  say "stopping"
  if alive "$worker_pid"; then
    # A Prefect worker makes its first interrupt a SIGINT to itself (lost if it inherited SIGINT ignored)
    # and its second a SIGKILL of itself: so one, a bounded wait, then the second.
    kill -INT "$worker_pid" 2>/dev/null || true
    if ! wait_exit "$worker_pid" 3; then
      kill -INT "$worker_pid" 2>/dev/null || true
      wait_exit "$worker_pid" 10 || kill -KILL "$worker_pid" 2>/dev/null || true
    fi
    say "worker $worker_pid stopped"
  fi
  if [ "$KEEP_TRAINER" = 1 ]; then say "leaving the demo trainer (if any) running: tmux attach -t relaunch-demo"; else stop_demo_trainer; fi
  if alive "$server_pid"; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait_exit "$server_pid" 30 || kill -KILL "$server_pid" 2>/dev/null || true
    say "server $server_pid stopped"
  fi
  exit "$rc"
}
trap 'exit 130' INT
trap 'exit 143' TERM
trap cleanup EXIT

if curl -s -o /dev/null "http://$HOST:$PORT/api/health"; then
  say "something already answers on $HOST:$PORT; set RELAUNCH_SERVE_PORT to another port"
  exit 1
fi

# Own sessions: a Ctrl-C in the terminal reaches only this script, which stops the rest in order.
say "starting the Prefect server on $HOST:$PORT (PREFECT_HOME=$PREFECT_HOME, log: $SERVER_LOG)"
# Concurrency leases (the per-host slots, the nightly deployment's slot) on disk under PREFECT_HOME, not in
# the server's memory: a server restart then neither strands a held slot nor fails its holder's renewal.
PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE=${PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE:-prefect.server.concurrency.lease_storage.filesystem} \
  setsid prefect server start --host "$HOST" --port "$PORT" >"$SERVER_LOG" 2>&1 &
server_pid=$!
say "server pid $server_pid"
for ((i = 0; i < 900; i++)); do
  curl -sf "$PREFECT_API_URL/health" >/dev/null 2>&1 && break
  alive "$server_pid" || { say "the server exited:"; tail -n 20 "$SERVER_LOG"; exit 1; }
  sleep 0.2
done
curl -sf "$PREFECT_API_URL/health" >/dev/null || { say "the server did not answer within 180 s"; exit 1; }
say "server healthy"

if [ "$PREPARE" = 1 ]; then stop_demo_trainer; fi

# Work pool, one concurrency limit per host named in prefect.yaml, the demo target: one Python process.
RELAUNCH_SERVE_PREPARE=$PREPARE python - <<'EOF'
import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, WorkPoolCreate
from prefect.exceptions import ObjectAlreadyExists
from prefect.workers.process import ProcessWorker

from flows.recover import host_limit_name
from relaunch.config import Host


def hosts() -> set[str]:
    """Every host a deployment in prefect.yaml names (a target's or a fleet's targets')."""
    spec = yaml.safe_load(Path("prefect.yaml").read_text())
    names = set()
    for dep in spec.get("deployments") or []:
        params = dep.get("parameters") or {}
        for target in [params.get("target")] + list(params.get("targets") or []):
            if isinstance(target, dict):
                names.add(host_limit_name(SimpleNamespace(host=Host.model_validate(target.get("host") or {}))))
    return names


async def setup() -> None:
    async with get_client() as client:
        try:
            await client.create_work_pool(WorkPoolCreate(name="relaunch", type="process", base_job_template=ProcessWorker.get_default_base_job_template()))
            print("[serve] work pool 'relaunch' (process) created")
        except ObjectAlreadyExists:
            print("[serve] work pool 'relaunch' exists")
        for name in sorted(hosts()):
            try:
                await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
                print(f"[serve] concurrency limit {name} = 1 created")
            except ObjectAlreadyExists:
                print(f"[serve] concurrency limit {name} exists")


if os.environ["RELAUNCH_SERVE_PREPARE"] == "1":
    from demo.scenarios import prepare

    prepare("healthy", Path(os.environ["RELAUNCH_DEMO_DIR"]))
asyncio.run(setup())
EOF

say "deploying prefect.yaml"
# `prefect deploy` resumes a deployment paused as a whole: note what is paused now, pause it again after.
python scripts/automations.py save-paused | sed 's/^/[serve] /'
prefect deploy --all >"$PREFECT_HOME/logs/serve-deploy.log" 2>&1 || { tail -n 30 "$PREFECT_HOME/logs/serve-deploy.log"; exit 1; }
grep -o "Deployment '[^']*' successfully created" "$PREFECT_HOME/logs/serve-deploy.log" | sed 's/^/[serve] /'
# Re-pause, then the notification block (RELAUNCH_NOTIFY_URL) and the automations of automations.yaml.
python scripts/automations.py sync | sed 's/^/[serve] /'

say "starting a worker on pool 'relaunch' (log: $WORKER_LOG)"
setsid prefect worker start --pool relaunch --type process >"$WORKER_LOG" 2>&1 &
worker_pid=$!
say "worker pid $worker_pid"
for ((i = 0; i < 600; i++)); do
  curl -sf -X POST -H 'Content-Type: application/json' -d '{}' "$PREFECT_API_URL/work_pools/relaunch/workers/filter" 2>/dev/null | grep -q '"status":"ONLINE"' && break
  alive "$worker_pid" || { say "the worker exited:"; tail -n 20 "$WORKER_LOG"; exit 1; }
  sleep 0.2
done

ui="http://$HOST:$PORT"
[ "${PREFECT_SERVER_UI_ENABLED:-true}" = false ] && ui="(UI disabled)"
cat <<EOF
[serve] ready: UI $ui   API $PREFECT_API_URL
[serve]   export PREFECT_API_URL=$PREFECT_API_URL
[serve]   prefect deployment run 'recover-training/demo' --watch
[serve]   prefect deployment run 'check-training/nightly-demo' --watch     (also every night at 03:00 UTC)
[serve]   worker log: tail -f $WORKER_LOG
[serve] Ctrl-C stops worker, demo trainer and server
EOF

# Until a signal, or until the server or the worker dies on its own.
set +e
wait -n "$server_pid" "$worker_pid"
say "$(alive "$server_pid" && echo worker || echo server) exited on its own"
exit 1
