#!/usr/bin/env bash
# Capture real GPU-fleet failures (NaN loss, device-side assert, illegal memory access, NCCL watchdog
# timeout, a SIGKILLed torchrun rank) and the host's ECC / kernel-log view into OUTDIR/issue9.tar.
# Usage (repo root, on a 2-GPU machine): bash bench/gpu_capture/capture_issue9.sh OUTDIR
# Logs are merged stdout+stderr; the tar is rewritten after every capture so partial results survive.
set -u
OUTDIR=${1:?outdir}; HERE=$(cd "$(dirname "$0")" && pwd)
L=/tmp/issue9; rm -rf "$L" /tmp/issue9_ckpt; mkdir -p "$L"
PY=${PY:-python3}
TORCHRUN=${TORCHRUN:-$(command -v torchrun || echo "$PY -m torch.distributed.run")}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
now() { date -u +%FT%TZ; }
pack() { tar -C "$L" -cf "$OUTDIR/issue9.tar" . ; }
# cap NAME LIMIT_S CMD... : run CMD in bench/gpu_capture, log NAME.log, record rc
cap() {
  local name=$1 lim=$2; shift 2
  local t0; t0=$(now)
  (cd "$HERE" && timeout -k 10 "$lim" "$@") > "$L/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc start=$t0 end=$(now) cmd=cd bench/gpu_capture && $*" >> "$L/rcs.txt"
  echo "== $name rc=$rc"; pack
}

{ echo "date_utc=$(now)"; echo "repo=$(cd "$HERE/../.." && pwd)"; uname -a
  $PY -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'
  $PY -c 'import triton; print("triton", triton.__version__)'
  echo "torchrun=$TORCHRUN"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv; } > "$L/env.txt" 2>&1
pack

cap nan_loss 120 $PY -u nan_loss.py --checkpoint-dir /tmp/issue9_ckpt
ls -l /tmp/issue9_ckpt >> "$L/rcs.txt" 2>&1
cap device_side_assert 90 $PY -u device_assert.py
cap illegal_memory_access 120 $PY -u illegal_access.py
cap nccl_watchdog_timeout 100 env TORCH_NCCL_ASYNC_ERROR_HANDLING=1 $TORCHRUN --nproc-per-node 2 --master-port 29531 nccl_timeout.py --timeout 10 --sleep 60
cap torchrun_rank_killed 100 $TORCHRUN --nproc-per-node 2 --master-port 29532 rank_killed.py

# the host's view: ECC, retired pages, row remapping; then whether the kernel log can be read
nvidia-smi -q > "$L/nvidia_smi_q.txt" 2>&1; echo "nvidia-smi -q rc=$?" >> "$L/rcs.txt"
nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER > "$L/nvidia_smi_ecc.txt" 2>&1; echo "nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER rc=$?" >> "$L/rcs.txt"
nvidia-smi --help-query-gpu > "$L/nvidia_smi_help_query_gpu.txt" 2>&1; echo "nvidia-smi --help-query-gpu rc=$?" >> "$L/rcs.txt"
Q=index,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure
nvidia-smi --query-gpu=$Q --format=csv,noheader > "$L/nvidia_smi_query_ecc.csv" 2> "$L/nvidia_smi_query_ecc.stderr"
echo "nvidia-smi --query-gpu=$Q --format=csv,noheader rc=$?" >> "$L/rcs.txt"
# the same fields with a header, and every ECC / retirement / remapping field the help lists
nvidia-smi --query-gpu=$Q --format=csv > "$L/nvidia_smi_query_ecc_header.csv" 2>&1
ALL=$(grep -oE '^"(ecc\.[a-z_.]+|retired_pages\.[a-z_.]+|remapped_rows\.[a-z_.]+)"' "$L/nvidia_smi_help_query_gpu.txt" | tr -d '"' | paste -sd, -)
nvidia-smi --query-gpu=index,$ALL --format=csv > "$L/nvidia_smi_query_ecc_all.csv" 2>&1; echo "nvidia-smi --query-gpu=index,<all ecc/retired/remapped fields> rc=$?" >> "$L/rcs.txt"
{ echo "\$ id -u; cat /proc/sys/kernel/dmesg_restrict; ls -l /dev/kmsg"; id -u; cat /proc/sys/kernel/dmesg_restrict 2>&1; ls -l /dev/kmsg 2>&1
  echo; echo "\$ dmesg | tail -50"; dmesg 2>&1 | tail -50; echo "[exit codes: dmesg=${PIPESTATUS[0]} tail=${PIPESTATUS[1]}]"
  echo; echo "\$ dmesg | grep -iE 'NVRM|Xid'"; dmesg 2>&1 | grep -iE 'NVRM|Xid'; echo "[exit codes: dmesg=${PIPESTATUS[0]} grep=${PIPESTATUS[1]}]"
  echo; echo "\$ timeout 3 cat /dev/kmsg | tail -50"; timeout 3 cat /dev/kmsg 2>&1 | tail -50; echo "[exit codes: timeout/cat=${PIPESTATUS[0]} tail=${PIPESTATUS[1]}]"
} > "$L/dmesg_attempt.txt" 2>&1
pack
echo ISSUE9_DONE
