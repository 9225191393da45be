#!/usr/bin/env bash
# A real CUDA hang found from the progress record and recovered (bench/gpu_hang/scenario.py), on a GPU machine.
# From the repo root, with Prefect's wheels, py-spy's and the rest carried in .whl/ (bench/carried_wheels.sh):
#   [PARTS="check recover watch"] [FLOOR=20] [LIMIT_S=540] bash bench/gpu_hang/run.sh OUTDIR
# Writes OUTDIR/gpu_hang.tar: env.txt, scenario.txt (all output), and the scenario's files.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
final=${1:?usage: run.sh OUTDIR}
w=$(mktemp -d)
{
  date -u +%FT%TZ
  uname -r; nproc
  nvidia-smi -L
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, "gpus", torch.cuda.device_count())'
  echo "python3=$(command -v python3) tmux=$(command -v tmux) uv=$(command -v uv) git=$(command -v git)"
  git -C . log -1 --format='relaunch %H %s' 2> /dev/null
  env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)_' | sort
} > "$w/env.txt" 2>&1
# shellcheck source=bench/carried_wheels.sh
source bench/carried_wheels.sh
install_carried_wheels "$w" || exit 3
installed_layout "$PWD" /tmp/relaunch_src || exit 3
export PYTHONPATH="/tmp/site:/tmp/relaunch_src:$PWD"
parts=()
for p in ${PARTS:-check recover watch}; do parts+=(--part "$p"); done
timeout -k 10 "${LIMIT_S:-540}" python3 bench/gpu_hang/scenario.py "$w/out" --floor "${FLOOR:-20}" "${parts[@]}" > "$w/scenario.txt" 2>&1
rc=$?
echo "scenario.py exit code $rc at $(date -u +%FT%TZ)" >> "$w/scenario.txt"
tail -n 60 "$w/scenario.txt"
{ nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; tmux ls; } >> "$w/env.txt" 2>&1
tmux kill-server 2> /dev/null
tar -C "$w" -cf "$final/gpu_hang.tar" .
exit "$rc"
