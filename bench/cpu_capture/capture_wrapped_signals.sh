#!/usr/bin/env bash
# Capture the fixtures of a trainer killed by a signal inside a wrapper script that goes on and exits 0
# (`bash start.sh`, start.sh = `python train.py` then `echo ...`): bash's own job-status line for its killed child is
# the only witness in the log. Into tests/fixtures/logs/cpu/ (see PROVENANCE.md there). Run on the 2-core CPU box.
# Usage: bash bench/cpu_capture/capture_wrapped_signals.sh [OUTDIR]
# Each wrapper runs as relaunch's supervisor runs a launch command: PATH=$VENV_BIN:$PATH bash -o pipefail -c CMD >> LOG
# 2>&1 < /dev/null, exit code read as $? straight after; codes go to OUTDIR/exit_codes_wrapped.tsv. A helper in the
# background waits for 4 step lines and signals the PID the trainer wrote (its own, never a name pattern).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=$(realpath -m "${1:-$REPO/tests/fixtures/logs/cpu}")
VENV_BIN=${VENV_BIN:-$REPO/.venv/bin}
mkdir -p "$OUT"; cd "$HERE" || exit 1
TSV=$OUT/exit_codes_wrapped.tsv
printf 'file\texit_code\n' > "$TSV"
PIDS=$(mktemp -d /tmp/relaunch-pids.XXXXXX)
WRAP=$(mktemp -d /tmp/relaunch-wrap.XXXXXX)
wait_for() { until [ "$(grep -c -- "$3" "$1" 2>/dev/null)" -ge "$2" ]; do sleep 0.1; done; }
for sig in KILL TERM SEGV ABRT; do
  name=wrapped_sig$(echo "$sig" | tr '[:upper:]' '[:lower:]')
  # The wrapper as people write one: the trainer, then a line that runs whatever became of it.
  printf '#!/bin/bash\ncd %q\npython -u signal_trainer.py %q 100\necho "start.sh: training script ended"\n' "$HERE" "$PIDS/$name" > "$WRAP/start.sh"
  : > "$OUT/$name.log"
  (wait_for "$OUT/$name.log" 4 "step=" && kill "-$sig" "$(cat "$PIDS/$name")") &
  helper=$!
  PATH="$VENV_BIN:$PATH" bash -o pipefail -c "bash $WRAP/start.sh" >> "$OUT/$name.log" 2>&1 < /dev/null
  rc=$?
  wait "$helper"
  printf '%s\t%s\n' "$name.log" "$rc" >> "$TSV"
  echo "$name.log rc=$rc" >&2
done
rm -rf "$PIDS" "$WRAP"
