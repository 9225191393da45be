#!/usr/bin/env bash
# The demo on a GPU machine, --device cuda: every demo scenario through relaunch's whole recover-training flow
# (bench/recover_breakdown.py, timed per phase), the CLI as typed (`relaunch demo --device cuda`), and the warm-up
# efficacy benchmark (bench/warmup_efficacy.py). From the repo root, with .whl/ carried (bench/carried_wheels.sh):
#   [PARTS="breakdown cli warmup"] [SCENARIOS="healthy fx-race ..."] [TAG=NAME] bash bench/gpu_demo/run.sh OUTDIR
# PARTS: which parts, in order (default all three; warmup-threads1: the benchmark with the trainer's
# TORCHINDUCTOR_COMPILE_THREADS=1); SCENARIOS: the breakdown's scenarios (default all seven);
# PART_LIMIT_S: each part's time limit (default 560 s); TRIALS: the warm-up benchmark's trials (default 3).
# Writes OUTDIR/gpu_demo[-TAG].tar: env.txt, pip.txt, PART.txt (each part's output), PART.json (bench/record.py's
# record, for breakdown and warmup), logs/SCENARIO/*.log (the trainer's logs: the broken run, then every attempt).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
final=${1:?usage: run.sh OUTDIR}
w=$(mktemp -d)
{
  date -u +%FT%TZ
  uname -r; nproc
  nvidia-smi -L
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import sys, torch, triton; print(sys.executable, sys.prefix, sys.base_prefix, sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "gpus", torch.cuda.device_count())'
  echo "tmux=$(command -v tmux) uv=$(command -v uv) git=$(command -v git)"
  env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)_' | sort
} > "$w/env.txt" 2>&1
# shellcheck source=bench/carried_wheels.sh
source bench/carried_wheels.sh
install_carried_wheels "$w" || exit 3
installed_layout "$PWD" /tmp/relaunch_src || exit 3
export PYTHONPATH="/tmp/site:/tmp/relaunch_src:$PWD"
scenario_args=()
for s in ${SCENARIOS:-}; do scenario_args+=(--scenario "$s"); done
rc=0
for part in ${PARTS:-breakdown cli warmup}; do
  echo "== $part at $(date -u +%T)"
  record=""
  limit=(timeout -k 10 "${PART_LIMIT_S:-560}")
  case $part in
    breakdown) record=recover_breakdown_gpu
      "${limit[@]}" python3 bench/record.py "$record" -- python3 bench/recover_breakdown.py --device cuda --logs "$w/logs" "${scenario_args[@]}" ;;
    cli) "${limit[@]}" python3 -m relaunch.cli demo --device cuda --scenario healthy --workdir /tmp/gpu_demo_cli ;;
    warmup) record=warmup_efficacy_gpu
      "${limit[@]}" python3 bench/record.py "$record" -- python3 bench/warmup_efficacy.py --device cuda --trials "${TRIALS:-3}" ;;
    warmup-threads1) record=warmup_efficacy_gpu_compile_threads_1  # the trainer compiling in-process, no worker pool
      "${limit[@]}" python3 bench/record.py "$record" -- python3 bench/warmup_efficacy.py --device cuda --trials "${TRIALS:-3}" \
        --trainer-env TORCHINDUCTOR_COMPILE_THREADS=1 ;;
    *) echo "unknown part $part"; false ;;
  esac > "$w/$part.txt" 2>&1
  code=$?
  tail -n 25 "$w/$part.txt"
  echo "== $part exit code $code at $(date -u +%T)" | tee -a "$w/$part.txt"
  [ "$code" = 0 ] || rc=1
  if [ -n "$record" ] && [ -f "bench/results/$record.json" ]; then cp "bench/results/$record.json" "$w/$part.json"; fi
  # After each part: a call cut short still brings back what the finished parts wrote.
  tar -C "$w" -cf "$final/gpu_demo${TAG:+-$TAG}.tar" .
done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader > "$w/apps_at_end.csv" 2>&1
tar -C "$w" -cf "$final/gpu_demo${TAG:+-$TAG}.tar" .
exit "$rc"
