#!/usr/bin/env bash
# relaunch's whole flow on a 2-GPU machine: bench/gpu_multirank/scenario.py with --device cuda (nccl).
# From the repo root, with the wheels of Prefect and all its dependencies (Python 3.12, manylinux x86_64),
# py-spy's, and uv's and git's binaries (xz, used only where missing), carried in .whl/ (see tests/fixtures/logs/gpu/PROVENANCE.md for how they were fetched):
#   [RELAUNCH_SRC=DIR] [ALSO_HUNG_PATCH=FILE] bash bench/gpu_multirank/run.sh OUTDIR
# RELAUNCH_SRC: another relaunch to run, e.g. one commit plus the new files, made here with
#   git archive COMMIT relaunch tasks flows demo tests pyproject.toml | tar -x -C .gpu_src (and `.gpu_src/` in .git/info/exclude,
#   then carried); a SOURCE file in it says what it is.
# Writes OUTDIR/gpu_multirank.tar: env.txt, scenario.txt (all output), and scenario.py's files.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
final=${1:?usage: run.sh OUTDIR}
# Which relaunch to run: this checkout, or a copy of one commit carried beside it (RELAUNCH_SRC, with a SOURCE note).
src=$(cd "${RELAUNCH_SRC:-.}" && pwd)
w=$(mktemp -d)
{
  date -u +%FT%TZ
  uname -r; nproc
  nvidia-smi -L
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
  echo "python3=$(command -v python3) torchrun=$(command -v torchrun) tmux=$(command -v tmux) uv=$(command -v uv)"
  env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)_' | sort
  echo "relaunch source: $src"; cat "$src/SOURCE" 2>/dev/null
} > "$w/env.txt" 2>&1
# shellcheck source=bench/carried_wheels.sh
source bench/carried_wheels.sh
install_carried_wheels "$w" || exit 3
export PYTHONPATH="/tmp/site:$src"
timeout -k 10 "${SCENARIO_LIMIT_S:-420}" python3 "$src/bench/gpu_multirank/scenario.py" "$w" --device cuda --find-links "$PWD/.whl" 2>&1 | tee "$w/scenario.txt"
rc=${PIPESTATUS[0]}
echo "scenario.py exit code $rc at $(date -u +%FT%TZ)" | tee -a "$w/scenario.txt"
# Optionally the hung scenario once more, against the same relaunch with a proposed fix applied (ALSO_HUNG_PATCH,
# a patch from the repo root), into $w/also/.
if [ -n "${ALSO_HUNG_PATCH:-}" ]; then
  patch_file=$(cd "$(dirname "$ALSO_HUNG_PATCH")" && pwd)/$(basename "$ALSO_HUNG_PATCH")
  also=/tmp/gpu_multirank_also_src; rm -rf "$also"; cp -r "$src" "$also"; mkdir -p "$w/also"
  (cd "$also" && git apply "$patch_file") || echo "cannot apply $patch_file"
  { cat "$src/SOURCE" 2>/dev/null; echo "with $ALSO_HUNG_PATCH applied"; } > "$also/SOURCE"; cp "$also/SOURCE" "$w/also/SOURCE"
  PYTHONPATH="/tmp/site:$also" timeout -k 10 "${SCENARIO_LIMIT_S:-420}" python3 "$also/bench/gpu_multirank/scenario.py" "$w/also" --device cuda \
    --scenario hung --find-links "$PWD/.whl" 2>&1 | tee "$w/also/scenario.txt"
  echo "scenario.py (also) exit code ${PIPESTATUS[0]} at $(date -u +%FT%TZ)" | tee -a "$w/also/scenario.txt"
fi
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader > "$w/apps_at_end.csv" 2>&1
tar -C "$w" -cf "$final/gpu_multirank.tar" .
exit "$rc"
