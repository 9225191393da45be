#!/usr/bin/env bash
# Re-capture every fixture in tests/fixtures/logs/cpu/ (run as root on the 2-core CPU box).
# Usage: bash bench/cpu_capture/capture_all.sh [OUTDIR]
# Each case: `cmd > NAME.log 2>&1; echo $?` -> exit code appended to OUTDIR/exit_codes.tsv.
# Where a child dies by signal, the parent bash's job notice (its own stderr) goes to NAME.shell_stderr.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(realpath -m "${1:-$HERE/../../tests/fixtures/logs/cpu}")
PY=${PY:-$HERE/../../.venv/bin/python}
TFPY=${TFPY:-/tmp/tfvenv/bin/python}   # venv with torch 2.13.0+cpu + transformers, no accelerate
mkdir -p "$OUT"; cd "$HERE"
printf 'file\texit_code\n' > "$OUT/exit_codes.tsv"
rec() { printf '%s\t%s\n' "$1" "$2" >> "$OUT/exit_codes.tsv"; echo "$1 rc=$2" >&2; }

# 1. host OOM kill in a 200 MiB memory cgroup (cgroup v1 memory controller here), no swap
CG=/sys/fs/cgroup/memory/relaunch-oom
mkdir -p "$CG"
echo 200M > "$CG/memory.limit_in_bytes"
echo 200M > "$CG/memory.memsw.limit_in_bytes" 2>/dev/null || true
N0=$(dmesg | wc -l)
{ sh -c "echo \$\$ > $CG/cgroup.procs; exec $PY -u oom_trainer.py" > "$OUT/host_oom_killed.log" 2>&1; rc=$?; } 2> "$OUT/host_oom_killed.shell_stderr"
rec host_oom_killed.log "$rc"
sleep 1
# kernel report for this kill: from "invoked oom-killer" to "Killed process"
dmesg | tail -n +$((N0 + 1)) | sed -n '/invoked oom-killer/,/Killed process/p' > "$OUT/host_oom_killed.dmesg"
cat "$CG/memory.oom_control" > "$OUT/host_oom_killed.memory_oom_control"
rmdir "$CG"

# 1b. same trainer under `ulimit -v` -> Python MemoryError (not a kernel kill)
( ulimit -v 300000; exec "$PY" -u oom_trainer.py 1312 ) > "$OUT/python_memoryerror.log" 2>&1
rec python_memoryerror.log $?

# 2. inductor C++ compile failures, fresh cache dir each
export TORCHINDUCTOR_CACHE_DIR; TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)
PATH="$HERE/broken_cxx:$PATH" "$PY" -u compile_trainer.py > "$OUT/compile_error.log" 2>&1
rec compile_error.log $?
rm -rf "$TORCHINDUCTOR_CACHE_DIR"; TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)
CXX=/bin/false "$PY" -u compile_trainer.py > "$OUT/compile_error_invalid_cxx.log" 2>&1
rec compile_error_invalid_cxx.log $?
rm -rf "$TORCHINDUCTOR_CACHE_DIR"; unset TORCHINDUCTOR_CACHE_DIR

# 3. generic Python error from the data pipeline mid-training
"$PY" -u generic_error_trainer.py > "$OUT/generic_error.log" 2>&1
rec generic_error.log $?

# 4. killed from outside after a few step lines
for sig in TERM KILL; do
  [ "$sig" = TERM ] && start=4410 || start=7023
  name=sig${sig,,}; pidf=$(mktemp); : > "$pidf"; log="$OUT/$name.log"
  ( until [ -s "$pidf" ] && [ "$(grep -c '^step=' "$log" 2>/dev/null)" -ge 4 ]; do sleep 0.1; done
    kill -"$sig" "$(cat "$pidf")" ) &
  { "$PY" -u signal_trainer.py "$pidf" "$start" > "$log" 2>&1; rc=$?; } 2> "$OUT/$name.shell_stderr"
  rec "$name.log" "$rc"
  wait; rm -f "$pidf"
done

# 5. missing dependencies
HF_HUB_OFFLINE=1 "$TFPY" -u missing_dep_library.py > "$OUT/missing_dependency_library.log" 2>&1
rec missing_dependency_library.log $?
"$PY" -u missing_dep_dotted.py > "$OUT/missing_dependency_dotted.log" 2>&1
rec missing_dependency_dotted.log $?
