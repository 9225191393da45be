#!/usr/bin/env bash
# Capture real GPU failure logs (stdout+stderr merged) into OUTDIR/gpu_fixtures.tar.
# Usage (repo root, on the GPU machine): bash bench/gpu_capture/capture_all.sh OUTDIR
# The tar is rewritten after every capture so partial results survive a time-out.
set -u
OUTDIR=${1:?outdir}; HERE=$(cd "$(dirname "$0")" && pwd)
L=/tmp/gpu_fixtures; rm -rf "$L"; mkdir -p "$L"
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
now() { date -u +%FT%TZ; }
pack() { tar -C "$L" -cf "$OUTDIR/gpu_fixtures.tar" . ; }
# cap NAME LIMIT_S CMD... : run CMD in bench/gpu_capture, log NAME.log, record rc
cap() {
  local name=$1 lim=$2; shift 2
  local t0; t0=$(now)
  (cd "$HERE" && timeout "$lim" "$@") > "$L/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc start=$t0 end=$(now) cmd=cd bench/gpu_capture && $*" >> "$L/rcs.txt"
  echo "== $name rc=$rc"; pack
}

# environment
{ echo "date_utc=$(now)"; uname -a; } > "$L/env.txt"
nvidia-smi > "$L/nvidia_smi.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$L/nvidia_smi.txt" 2>&1
$PY -c 'import torch; print(torch.__version__)' > "$L/torch_version.txt" 2>&1
$PY -c 'import sys, torch; print(sys.version); print("cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))' >> "$L/env.txt" 2>&1
pack

cap cuda_oom 60 $PY -u cuda_oom.py
cap flex_uncompiled 150 $PY -u flex_bench.py --steps 20 --log-every 1 --summary "$L/flex_uncompiled_summary.json"

# compiled flex, with nvidia-smi samples while its step loop runs, then after it is gone
t0=$(now)
(cd "$HERE" && timeout 240 $PY -u flex_bench.py --compile --steps 2000 --log-every 100 --summary "$L/flex_compiled_summary.json") > "$L/flex_compiled.log" 2>&1 &
P=$!
while kill -0 $P 2>/dev/null && ! grep -q '^step=' "$L/flex_compiled.log"; do sleep 0.2; done
for i in 1 2 3 4 5 6; do
  kill -0 $P 2>/dev/null || break
  echo "sample $i $(date -u +%T.%N)" >> "$L/nvidia_smi_sample_times.txt"
  nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader >> "$L/nvidia_smi_busy_gpu.csv" 2>&1
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader >> "$L/nvidia_smi_busy_apps.csv" 2>&1
  sleep 0.5
done
wait $P; rc=$?
echo "flex_compiled rc=$rc start=$t0 end=$(now) cmd=cd bench/gpu_capture && $PY -u flex_bench.py --compile --steps 2000 --log-every 100" >> "$L/rcs.txt"
echo "== flex_compiled rc=$rc"
sleep 2
echo "after $(date -u +%T.%N)" >> "$L/nvidia_smi_sample_times.txt"
nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader > "$L/nvidia_smi_idle_gpu.csv" 2>&1
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader > "$L/nvidia_smi_idle_apps.csv" 2>&1
pack

cap fx_race_cuda 150 $PY -u fx_race.py
cap nccl_failure 90 $PY -u nccl_fail.py --port 29512
cap nccl_then_oom 90 $PY -u nccl_fail.py --knock-on --port 29513
cap nccl_failure_debug_warn 90 env NCCL_DEBUG=WARN $PY -u nccl_fail.py --port 29514
echo ALL_DONE
