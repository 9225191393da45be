#!/usr/bin/env bash
# Re-capture the colour and `\r` fixtures in tests/fixtures/logs/ (see PROVENANCE.md there).
# Usage: bash bench/cpu_capture/capture_text_fixtures.sh [OUTDIR]
# TQDM_SITE: a folder holding tqdm (`pip install --target DIR tqdm==4.70.1`); the project venv has none.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=$(realpath -m "${1:-$REPO/tests/fixtures/logs}")
PY=${PY:-$REPO/.venv/bin/python}
TQDM_SITE=${TQDM_SITE:-/tmp/tqdm-site}
mkdir -p "$OUT"; cd "$HERE"

# 1. rich-coloured step lines, then a real torch RuntimeError drawn by rich.traceback in colour.
"$PY" -u ansi_trainer.py > "$OUT/ansi_colored_traceback.log" 2>&1
echo "ansi_colored_traceback.log rc=$?" >&2

# 2. a tqdm bar redrawn with `\r`, copied while the trainer runs (as a health poll sees it), then stopped.
work=$(mktemp -d)
PYTHONPATH="$TQDM_SITE" "$PY" -u progress_trainer.py 1000 > "$work/train.log" 2>&1 &
pid=$!
until [ "$(grep -ao 'step=[0-9]*' "$work/train.log" | tail -n 1 | cut -d= -f2)" -ge 164 ] 2>/dev/null; do sleep 0.05; done
cp "$work/train.log" "$OUT/carriage_return_progress.log"
kill -TERM "$pid"; wait "$pid"
echo "carriage_return_progress.log trainer stopped, rc=$?" >&2
rm -rf "$work"

# The checkout's own path is written /repo/, as in the other fixtures.
sed -i "s|$REPO/|/repo/|g" "$OUT/ansi_colored_traceback.log" "$OUT/carriage_return_progress.log"
