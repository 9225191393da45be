#!/usr/bin/env bash
# Capture the issue-35 fixtures (a rank's own error beside its peers' lost collectives, a collective mismatch that
# aborts, Ctrl-C, the kernel's OOM killer with the trainer's pid and start time recorded) into tests/fixtures/logs/cpu/
# (see PROVENANCE.md there). Run as root on the 2-core CPU box (memory cgroup v1 at /sys/fs/cgroup/memory, dmesg readable).
# Usage: bash bench/cpu_capture/capture_issue35.sh [OUTDIR]
# Each trainer runs as relaunch's supervisor runs one: PATH=$VENV_BIN:$PATH bash -c CMD >> LOG 2>&1 < /dev/null,
# exit code read as $? straight after; codes go to OUTDIR/exit_codes_issue35.tsv. The trainer runs in the foreground
# of this script (a non-interactive shell starts background jobs with SIGINT ignored, and Python would never raise
# KeyboardInterrupt); a helper in the background waits for step lines and signals the pid a trainer wrote.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=$(realpath -m "${1:-$REPO/tests/fixtures/logs/cpu}")
VENV_BIN=${VENV_BIN:-$REPO/.venv/bin}
mkdir -p "$OUT"; cd "$HERE" || exit 1
TSV=$OUT/exit_codes_issue35.tsv
printf 'file\texit_code\n' > "$TSV"
NAMES=()
rec() { printf '%s\t%s\n' "$1" "$2" >> "$TSV"; echo "$1 rc=$2" >&2; }
run() {
  local name=$1 cmd=$2 helper=; shift 2
  NAMES+=("$name")
  : > "$OUT/$name.log"
  if [ -n "${MEANWHILE:-}" ]; then "$MEANWHILE" "$OUT/$name.log" & helper=$!; fi
  { PATH="$VENV_BIN:$PATH" env -- "$@" bash -c "$cmd" >> "$OUT/$name.log" 2>&1 < /dev/null; rc=$?; } 2> "$OUT/$name.shell_stderr"
  [ -s "$OUT/$name.shell_stderr" ] || rm -f "$OUT/$name.shell_stderr"
  [ -n "$helper" ] && wait "$helper"
  rec "$name.log" "$rc"
}
wait_for() { until [ "$(grep -c -- "$3" "$1" 2>/dev/null)" -ge "$2" ]; do sleep 0.1; done; }
PIDS=$(mktemp -d /tmp/relaunch-pids.XXXXXX)

# 1. one rank's own exception: rank 1 looks up a token id past its embedding after 4 steps; rank 0 loses its peer in
# the all_reduce; torchrun with its default monitor interval.
run rank_error_torchrun "torchrun --standalone --nproc-per-node 2 rank_fault_trainer.py index"

# the same with rank 1 dying of its own SIGSEGV (it prints nothing), torchrun polling its workers every 5 s so that
# rank 0 meets the lost peer before torchrun stops it
run rank_segv_torchrun "torchrun --standalone --monitor-interval 5 --nproc-per-node 2 rank_fault_trainer.py segv"

# 2. a collective mismatch: rank 1's flattened gradient grows after 4 steps. Under torchrun, then as two bare ranks
# (rank 0's log kept as collective_mismatch.log, rank 1's as collective_mismatch_rank1.log, its code in the tsv).
run collective_mismatch_torchrun "torchrun --standalone --nproc-per-node 2 rank_fault_trainer.py mismatch"
NAMES+=(collective_mismatch_rank1)
bare_rank1() {
  PATH="$VENV_BIN:$PATH" RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29735 python -u rank_fault_trainer.py mismatch \
    > "$OUT/collective_mismatch_rank1.log" 2>&1 < /dev/null
  echo $? > "$PIDS/rank1.rc"
}
MEANWHILE=bare_rank1 run collective_mismatch "python -u rank_fault_trainer.py mismatch" RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29735
rec collective_mismatch_rank1.log "$(cat "$PIDS/rank1.rc")"
unset MEANWHILE

# 3. Ctrl-C: SIGINT to the trainer after 4 step lines; then as a terminal sends it, to the trainer's whole process group
# (setsid: the trainer leads a group of its own, its two DataLoader workers in it); then to torchrun.
interrupt() { until [ -s "$PIDS/trainer" ]; do sleep 0.1; done; wait_for "$1" 4 '^step='; kill -INT "$(cat "$PIDS/trainer")"; }
MEANWHILE=interrupt run keyboard_interrupt "python -u interrupt_trainer.py $PIDS/trainer"
rm -f "$PIDS/trainer"
interrupt_group() { until [ -s "$PIDS/trainer" ]; do sleep 0.1; done; wait_for "$1" 4 '^step='; kill -INT -- "-$(cat "$PIDS/trainer")"; }
MEANWHILE=interrupt_group run keyboard_interrupt_dataloader "exec setsid python -u interrupt_trainer.py $PIDS/trainer 2"
rm -f "$PIDS/trainer"
interrupt_torchrun() { until [ -s "$PIDS/torchrun" ]; do sleep 0.1; done; wait_for "$1" 4 '^step='; kill -INT "$(cat "$PIDS/torchrun")"; }
MEANWHILE=interrupt_torchrun run torchrun_sigint "echo \$\$ > $PIDS/torchrun; exec torchrun --standalone --nproc-per-node 2 dist_trainer.py"
rm -f "$PIDS/torchrun"
# SIGHUP (the terminal that started it closed): no handler, no traceback
hangup() { until [ -s "$PIDS/trainer" ]; do sleep 0.1; done; wait_for "$1" 4 '^step='; kill -HUP "$(cat "$PIDS/trainer")"; }
MEANWHILE=hangup run sighup "python -u interrupt_trainer.py $PIDS/trainer"
rm -f "$PIDS/trainer"; unset MEANWHILE

# 4. the kernel's OOM killer in a 300 MiB memory cgroup (cgroup v1), no swap; the trainer's pid and its start time
# (UTC, epoch seconds) recorded as relaunch's run record has them. dmesg kept twice: as dmesg prints it (seconds since
# boot) and with --time-format iso (wall clock).
CG=/sys/fs/cgroup/memory/relaunch-oom35
mkdir -p "$CG"
echo 300M > "$CG/memory.limit_in_bytes"
echo 300M > "$CG/memory.memsw.limit_in_bytes" 2>/dev/null || true
N0=$(dmesg | wc -l)
date -u +%s.%N > "$OUT/oom_killed_trainer.started_at"
run oom_killed_trainer "sh -c 'echo \$\$ > $CG/cgroup.procs; echo \$\$ > $OUT/oom_killed_trainer.pid; exec python -u oom_trainer.py 3500'"
dmesg | tail -n +$((N0 + 1)) | sed -n '/invoked oom-killer/,/Killed process/p' > "$OUT/oom_killed_trainer.dmesg"
dmesg --time-format iso | tail -n +$((N0 + 1)) | sed -n '/invoked oom-killer/,/Killed process/p' > "$OUT/oom_killed_trainer.dmesg_iso"
cat "$CG/memory.oom_control" > "$OUT/oom_killed_trainer.memory_oom_control"
rmdir "$CG"
rm -rf "$PIDS"

# The checkout's own path is written /repo/, as in the other fixtures.
for n in "${NAMES[@]}"; do
  for f in "$OUT/$n.log" "$OUT/$n.shell_stderr"; do [ -e "$f" ] && sed -i "s|$REPO/|/repo/|g" "$f"; done
done
