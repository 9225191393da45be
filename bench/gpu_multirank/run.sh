#!/usr/bin/env bash
# relaunch's whole flow on a 2-GPU machine: bench/gpu_multirank/scenario.py with --device cuda (nccl).
# From the repo root, with the wheels of Prefect and all its dependencies (Python 3.12, manylinux x86_64),
# uv's and py-spy's, carried in .whl/ (see tests/fixtures/logs/gpu/PROVENANCE.md for how they were fetched):
#   bash bench/gpu_multirank/run.sh OUTDIR
# Writes OUTDIR/gpu_multirank.tar: env.txt, scenario.txt (all output), and scenario.py's files.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
final=${1:?usage: run.sh OUTDIR}
w=$(mktemp -d)
{
  date -u +%FT%TZ
  uname -r; nproc
  nvidia-smi -L
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
  echo "python3=$(command -v python3) torchrun=$(command -v torchrun) tmux=$(command -v tmux) uv=$(command -v uv)"
  env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)_' | sort
} > "$w/env.txt" 2>&1
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$w/pip.txt" 2>&1 || { cat "$w/pip.txt"; exit 3; }
export PYTHONPATH="/tmp/site:$PWD"
command -v uv > /dev/null || export PATH="$PATH:/tmp/site/bin"
command -v py-spy > /dev/null || export PATH="$PATH:/tmp/site/bin"
echo "wheels installed in $(( $(date +%s) - t0 )) s; uv=$(command -v uv) py-spy=$(command -v py-spy)" | tee -a "$w/env.txt"
timeout -k 10 "${SCENARIO_LIMIT_S:-420}" python3 bench/gpu_multirank/scenario.py "$w" --device cuda --find-links "$PWD/.whl" 2>&1 | tee "$w/scenario.txt"
rc=${PIPESTATUS[0]}
echo "scenario.py exit code $rc at $(date -u +%FT%TZ)" | tee -a "$w/scenario.txt"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader > "$w/apps_at_end.csv" 2>&1
tar -C "$w" -cf "$final/gpu_multirank.tar" .
exit "$rc"
