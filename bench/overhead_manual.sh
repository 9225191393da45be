#!/usr/bin/env bash
# The demo trainer's recovery as a competent person types it, for bench/overhead.py to time against
# `relaunch recover`. The same steps relaunch takes, no more: no preflight, no lock, no drift report,
# no import check, no patch of the restored files, no run records.
#
#   bench/overhead_manual.sh full|relaunch WORK SESSION PYTHON FIND_LINKS...
#
# full: kill the session, venv from the lock (uv, offline from the wheelhouse: never a torch download),
# git checkout of the model files, rm -rf + single-thread warm-up of the inductor cache, relaunch.
# relaunch: kill the session, relaunch from the newest checkpoint.
# Both then wait, as an `until grep` loop does (once a second), for the same evidence relaunch waits for:
# 5 step lines of the new run (the demo target's healthy_steps). Prints `phase NAME MS` on stderr.
set -euo pipefail

mode=$1 work=$2 session=$3 python=$4
shift 4
links=()
for dir in "$@"; do links+=(--find-links "$dir"); done
repo=$work/repo venv=$work/venv cache=$work/inductor-cache logs=$work/logs ckpt=$work/checkpoints
steps=5
t0=$(date +%s%N)
phase() { echo "phase $1 $(( ($(date +%s%N) - t0) / 1000000 )) ms" >&2; }
step_lines() {
  local n
  n=$(grep -c '^step=' "$log" 2>/dev/null) || true
  echo "${n:-0}"
}

tmux kill-session -t "=$session" 2>/dev/null || true
if [ "$mode" = full ]; then
  rm -rf "$venv"
  uv venv -q --python "$python" "$venv"
  uv pip sync -q --python "$venv/bin/python" --no-index "${links[@]}" "$repo/requirements.lock"
  phase venv
  git -C "$repo" checkout main -- model.py train.py
  phase code
  rm -rf "$cache"
  mkdir -p "$cache"
  (cd "$repo" && PATH="$venv/bin:$PATH" VIRTUAL_ENV=$venv TORCHINDUCTOR_CACHE_DIR=$cache TORCHINDUCTOR_COMPILE_THREADS=1 \
    OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 python warmup.py)
  phase warm
fi

# The newest checkpoint by step number (step_9 < step_10).
shopt -s nullglob
checkpoints=("$ckpt"/step_*.pt)
resume=''
if [ ${#checkpoints[@]} -gt 0 ]; then
  resume="--resume $(printf '%s\n' "${checkpoints[@]}" | sort -V | tail -n 1)"
fi
log=$logs/manual-$(date +%Y%m%dT%H%M%S.%N).log
mkdir -p "$logs"
# The trainer's environment as relaunch gives it (the warmed cache, the venv first on PATH, the target's env).
tmux new-session -d -s "$session" \
  "cd $repo && PATH=$venv/bin:\$PATH VIRTUAL_ENV=$venv TORCHINDUCTOR_CACHE_DIR=$cache OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 \
   exec python train.py --checkpoint-dir $ckpt --checkpoint-every 10 $resume >> $log 2>&1"
phase launch

until [ "$(step_lines)" -ge "$steps" ]; do
  if ! tmux has-session -t "=$session" 2>/dev/null; then
    echo "the trainer died:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  sleep 1
done
phase healthy
echo "$log"
