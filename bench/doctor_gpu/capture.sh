#!/usr/bin/env bash
# The doctor's host script (relaunch/host/doctor.sh, verbatim) on a real GPU host: once expecting the GPUs it has, once
# expecting more. Output into $OUT (default ./doctor-gpu-capture): the raw stdout of each run, exit codes, nvidia-smi -L.
#   bash bench/doctor_gpu/capture.sh
set -u
out=${OUT:-./doctor-gpu-capture}
mkdir -p "$out"
work=$(mktemp -d)
git init -q -b main "$work/repo" && echo 'x = 1' > "$work/repo/model.py" && echo 'packaging==24.2' > "$work/repo/requirements.lock"
git -C "$work/repo" add -A && git -C "$work/repo" -c user.name=c -c user.email=c@c commit -qm good
nvidia-smi -L > "$out/nvidia_smi_L.txt" 2>&1; echo "nvidia-smi -L: $?" > "$out/rcs.txt"
have=$(grep -c '^GPU [0-9]' "$out/nvidia_smi_L.txt")
for expect in "$have" 16; do
  bash relaunch/host/doctor.sh python3 "$work/repo" HEAD "$work/repo/requirements.lock" "$work/venv" "$work/logs" "$work/ckpt" 1048576 "$expect" 0 \
    > "$out/doctor_expect_$expect.txt" 2>&1
  echo "doctor.sh expecting $expect GPU(s): $?" >> "$out/rcs.txt"
done
{ date -u +%FT%TZ; uname -r; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$out/machine.txt" 2>&1
rm -rf "$work"
