#!/usr/bin/env bash
# Capture the issue-48 fixtures (a wrapper's exit 0 over a trainer's traceback, a checkpoint whose pickled class a
# refactor moved, numpy's short write to a full disk, a monitored barrier a rank never reached) into
# tests/fixtures/logs/cpu/ (see PROVENANCE.md there). Run as root on the 2-core CPU box (tmpfs mounts).
# Usage: [NPPY=/tmp/npvenv/bin/python] bash bench/cpu_capture/capture_issue48.sh [OUTDIR]
# Each trainer runs as relaunch's supervisor runs a launch command: PATH=$VENV_BIN:$PATH bash -o pipefail -c CMD >> LOG
# 2>&1 < /dev/null, exit code read as $? straight after; codes go to OUTDIR/exit_codes_issue48.tsv. Where a person's shell
# is the shape (a pipe typed into tmux, no pipefail) it is `bash -c` with the log the pipe's tee writes.
# NPPY: a Python with numpy (the repo's venv has none): python3 -m venv /tmp/npvenv && /tmp/npvenv/bin/pip install numpy
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=$(realpath -m "${1:-$REPO/tests/fixtures/logs/cpu}")
VENV_BIN=${VENV_BIN:-$REPO/.venv/bin}
NPPY=${NPPY:-/tmp/npvenv/bin/python}
mkdir -p "$OUT"; cd "$HERE" || exit 1
TSV=$OUT/exit_codes_issue48.tsv
printf 'file\texit_code\n' > "$TSV"
NAMES=()
rec() { printf '%s\t%s\n' "$1" "$2" >> "$TSV"; echo "$1 rc=$2" >&2; }
# run NAME CMD [KEY=VALUE...]: the supervisor's invocation into a fresh NAME.log. A function named in $MEANWHILE runs
# in the background meanwhile (another rank).
run() {
  local name=$1 cmd=$2 helper=; shift 2
  NAMES+=("$name")
  : > "$OUT/$name.log"
  if [ -n "${MEANWHILE:-}" ]; then "$MEANWHILE" & helper=$!; fi
  PATH="$VENV_BIN:$PATH" env -- "$@" bash -o pipefail -c "$cmd" >> "$OUT/$name.log" 2>&1 < /dev/null
  rc=$?
  [ -n "$helper" ] && wait "$helper"
  rec "$name.log" "$rc"
}
TMPD=$(mktemp -d /tmp/relaunch-i48.XXXXXX)

# 1. A wrapper's exit 0 over a trainer's uncaught FileNotFoundError: the shard list names shard_00003.bin, which a
# clean-up removed. Data: 64 shards of 64x64 float32 for one rank, rank1/ and rank0/ for two.
shards() { mkdir -p "$1"; for i in $(seq 0 63); do head -c 16384 /dev/urandom > "$(printf '%s/shard_%05d.bin' "$1" "$i")"; done; rm -f "$1/shard_00003.bin"; }
shards "$TMPD/data"
# 1a. a pipe typed into a shell, no pipefail (the shape relaunch adopts from a tmux pane): the log is tee's file.
NAMES+=(tee_traceback)
PATH="$VENV_BIN:$PATH" bash -c "python -u shard_trainer.py $TMPD/data 2>&1 | tee $OUT/tee_traceback.log" > /dev/null 2>&1 < /dev/null
rec tee_traceback.log "$?"
# 1b. launch_command `bash start.sh`, start.sh piping the trainer to tee: the supervisor's pipefail does not reach it.
printf '#!/bin/bash\ncd %q\npython -u shard_trainer.py %q 2>&1 | tee -a %q\n' "$HERE" "$TMPD/data" "$TMPD/train.log" > "$TMPD/start.sh"
run wrapped_tee_traceback "bash $TMPD/start.sh"
# 1c. start.sh running the trainer, then a line of its own: the script's status is its echo's.
printf '#!/bin/bash\ncd %q\npython -u shard_trainer.py %q\necho "start.sh: training script ended"\n' "$HERE" "$TMPD/data" > "$TMPD/start_echo.sh"
run wrapped_traceback_echo "bash $TMPD/start_echo.sh"
# 1d. torchrun piped to tee in a shell, no pipefail: rank 1's shard is missing, rank 0's are all there.
shards "$TMPD/ddp/rank1"; mkdir -p "$TMPD/ddp/rank0"; cp "$TMPD/ddp/rank1"/* "$TMPD/ddp/rank0/"; cp "$TMPD/data/shard_00000.bin" "$TMPD/ddp/rank0/shard_00003.bin"
NAMES+=(torchrun_tee_traceback)
PATH="$VENV_BIN:$PATH" bash -c "torchrun --standalone --nproc-per-node 2 shard_trainer.py $TMPD/ddp 2>&1 | tee $OUT/torchrun_tee_traceback.log" > /dev/null 2>&1 < /dev/null
rec torchrun_tee_traceback.log "$?"

# 1e. exits 0 that are the trainer's own beside a traceback at the log's end: a background thread's, a child process's.
run background_thread_traceback "python -u background_failure_trainer.py thread"
run background_process_traceback "python -u background_failure_trainer.py process"

# 2. A checkpoint whose pickled config class a refactor moved: saved with trainlib/config.py's TrainConfig, then the
# module moved (trainlib/config.py -> trainlib/configs.py: ModuleNotFoundError) or the class renamed in place
# (TrainConfig -> RunConfig: AttributeError); and the same file loaded with the code that wrote it, put back.
LIB=$TMPD/lib
mkdir -p "$LIB/trainlib"
: > "$LIB/trainlib/__init__.py"
printf 'from dataclasses import dataclass\n\n\n@dataclass\nclass TrainConfig:\n    lr: float\n    batch_size: int\n' > "$LIB/trainlib/config.py"
CK=$TMPD/ckpt/step_800/model.pt
PYTHONPATH=$LIB PATH="$VENV_BIN:$PATH" python -u moved_class_checkpoint.py save "$CK" > /dev/null 2>&1 < /dev/null
mv "$LIB/trainlib/config.py" "$LIB/trainlib/configs.py"
run checkpoint_class_moved "python -u moved_class_checkpoint.py resume $CK" PYTHONPATH="$LIB"
mv "$LIB/trainlib/configs.py" "$LIB/trainlib/config.py"
sed -i 's/class TrainConfig:/class RunConfig:/' "$LIB/trainlib/config.py"
run checkpoint_class_renamed "python -u moved_class_checkpoint.py resume $CK" PYTHONPATH="$LIB"
sed -i 's/class RunConfig:/class TrainConfig:/' "$LIB/trainlib/config.py"
run checkpoint_class_restored "python -u moved_class_checkpoint.py resume $CK" PYTHONPATH="$LIB"

# 3. numpy's short write: np.save of 800 kB onto a 64 KiB tmpfs; df of it afterwards, as the poll reads free space.
MNT=$TMPD/mnt
mkdir -p "$MNT"
mount -t tmpfs -o size=64k tmpfs "$MNT"
run numpy_short_write "$NPPY -u short_write_trainer.py $MNT"
df -B1 --output=target,size,avail "$MNT" > "$OUT/numpy_short_write.df"
ls -l "$MNT" >&2
umount "$MNT"

# 4. A monitored barrier a rank never reached: after 4 steps rank 1 (loading its next shard) sleeps past the barrier's
# 30 s timeout. Two bare ranks (rank 0's log kept, and rank 1's), torchrun with 2, torchrun with 3 and
# wait_all_ranks=True, ranks 1 and 2 late.
NAMES+=(monitored_barrier_timeout_rank1)
bare_rank1() {
  PATH="$VENV_BIN:$PATH" RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29748 python -u barrier_trainer.py --late-s 45 \
    > "$OUT/monitored_barrier_timeout_rank1.log" 2>&1 < /dev/null
  echo $? > "$TMPD/rank1.rc"
}
MEANWHILE=bare_rank1 run monitored_barrier_timeout "python -u barrier_trainer.py --late-s 45" RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29748
rec monitored_barrier_timeout_rank1.log "$(cat "$TMPD/rank1.rc")"
unset MEANWHILE
run monitored_barrier_torchrun "torchrun --standalone --nproc-per-node 2 barrier_trainer.py"
run monitored_barrier_all_ranks_torchrun "torchrun --standalone --nproc-per-node 3 barrier_trainer.py --late 1 2 --wait-all-ranks"
rm -rf "$TMPD"

# The checkout's own path is written /repo/, as in the other fixtures.
for n in "${NAMES[@]}"; do
  [ -e "$OUT/$n.log" ] && sed -i "s|$REPO/|/repo/|g" "$OUT/$n.log"
done
