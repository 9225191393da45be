#!/usr/bin/env bash
# bench/watch_recovery.py on a GPU machine, --device cuda: the demo trainer started by hand against the same trainer
# SIGKILLed under relaunch's watch and recovered (one run, one warm compile cache). From the repo root, .whl/ carried
# (bench/carried_wheels.sh):
#   [KILLS=3] [HAND_RUNS=2] [HAND_AFTER=1] [LIMIT_S=480] bash bench/gpu_watch/run.sh OUTDIR
# Writes to OUTDIR as it goes (a call cut short still brings back what was measured): env.txt, pip.txt,
# progress.jsonl (each sample as it comes), watch_recovery.txt (the benchmark's stderr and stdout),
# watch_recovery_gpu.json (bench/record.py's record), logs.tar (the trainer's logs: warm-up, by hand, each relaunch).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_HOME=/tmp/gpu_watch_prefect
out=${1:?usage: run.sh OUTDIR}
work=/tmp/gpu_watch
mkdir -p "$out" "$PREFECT_HOME"
{
  date -u +%FT%TZ
  uname -r; nproc
  nvidia-smi -L
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import sys, torch, triton; print(sys.executable, sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "gpus", torch.cuda.device_count())'
  echo "tmux=$(command -v tmux) ($(tmux -V)) uv=$(command -v uv) git=$(command -v git)"
  env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)_' | sort
  uptime
} > "$out/env.txt" 2>&1
# shellcheck source=bench/carried_wheels.sh
source bench/carried_wheels.sh
install_carried_wheels "$out" || exit 3
installed_layout "$PWD" /tmp/relaunch_src || exit 3
export PYTHONPATH="/tmp/site:/tmp/relaunch_src:$PWD"
echo "== watch_recovery at $(date -u +%T)"
timeout -k 10 "${LIMIT_S:-480}" python3 bench/record.py watch_recovery_gpu -- python3 bench/watch_recovery.py --device cuda \
  --kills "${KILLS:-3}" --hand-runs "${HAND_RUNS:-2}" --hand-runs-after "${HAND_AFTER:-1}" --workdir "$work" --progress "$out/progress.jsonl" > "$out/watch_recovery.txt" 2>&1
rc=$?
echo "== watch_recovery exit code $rc at $(date -u +%T)" | tee -a "$out/watch_recovery.txt"
tail -n 30 "$out/watch_recovery.txt"
[ -f bench/results/watch_recovery_gpu.json ] && cp bench/results/watch_recovery_gpu.json "$out/"
tar -C "$work/healthy" -cf "$out/logs.tar" logs 2> /dev/null
tmux kill-server 2> /dev/null  # this machine's tmux, started by this run alone: no trainer outlives it
{ uptime; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; tmux ls; } >> "$out/env.txt" 2>&1
exit "$rc"
