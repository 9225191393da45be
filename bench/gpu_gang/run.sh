#!/usr/bin/env bash
# A two-node gang on the GPU machine through recover-training (bench/gpu_gang/gang.py says what and why). From the repo
# root, with .whl/ carried (bench/carried_wheels.sh):  bash bench/gpu_gang/run.sh OUTDIR
# Writes OUTDIR/gpu_gang.tar: env.txt, gang.txt (the run's output), gang.json, logs/nodeK/ (each node's trainer logs).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
final=${1:?usage: run.sh OUTDIR}
w=$(mktemp -d)
{
  date -u +%FT%TZ
  nvidia-smi -L
  python3 -c 'import sys, torch; print(sys.executable, sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  echo "tmux=$(command -v tmux) uv=$(command -v uv) git=$(command -v git) torchrun=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")/torchrun"
} > "$w/env.txt" 2>&1
# shellcheck source=bench/carried_wheels.sh
source bench/carried_wheels.sh
install_carried_wheels "$w" || exit 3
installed_layout "$PWD" /tmp/relaunch_src || exit 3
export PYTHONPATH="/tmp/site:/tmp/relaunch_src:$PWD"
timeout -k 10 "${PART_LIMIT_S:-480}" python3 bench/gpu_gang/gang.py "$w" > "$w/gang.txt" 2>&1
rc=$?
tail -n 60 "$w/gang.txt"
echo "== gang exit code $rc"
tar -C "$w" -cf "$final/gpu_gang.tar" .
exit "$rc"
