#!/usr/bin/env bash
# Capture the issue-26 fixtures (distributed failures on gloo, preemption, checkpoints intact but unloadable, a
# DataLoader worker taken by the OOM killer, a damaged inductor cache) into tests/fixtures/logs/cpu/ (see PROVENANCE.md
# there). Run as root on the 2-core CPU box (memory cgroup v1 at /sys/fs/cgroup/memory, dmesg readable).
# Usage: [ONLY=cache] bash bench/cpu_capture/capture_issue26.sh [OUTDIR]   (ONLY=cache: step 8 alone, the damaged caches)
# Each trainer runs as relaunch's supervisor runs one: PATH=$VENV_BIN:$PATH bash -c CMD >> LOG 2>&1 < /dev/null,
# exit code read as $? straight after; codes go to OUTDIR/exit_codes_issue26.tsv.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=$(realpath -m "${1:-$REPO/tests/fixtures/logs/cpu}")
VENV_BIN=${VENV_BIN:-$REPO/.venv/bin}
mkdir -p "$OUT"; cd "$HERE" || exit 1
TSV=$OUT/exit_codes_issue26.tsv
[ "${ONLY:-}" = cache ] || printf 'file\texit_code\n' > "$TSV"
NAMES=()
rec() { printf '%s\t%s\n' "$1" "$2" >> "$TSV"; echo "$1 rc=$2" >&2; }
# run NAME CMD [KEY=VALUE...]: the supervisor's invocation, fresh log; the parent's own stderr goes to
# NAME.shell_stderr if non-empty. A function named in $MEANWHILE runs in the background with the log's path
# (it waits for lines in the log, then signals a process by the pid a trainer wrote).
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
# wait_for FILE COUNT PATTERN: until FILE holds COUNT lines matching PATTERN (polled: the trainer is another process).
wait_for() { until [ "$(grep -c -- "$3" "$1" 2>/dev/null)" -ge "$2" ]; do sleep 0.1; done; }
PIDS=$(mktemp -d /tmp/relaunch-pids.XXXXXX)
if [ "${ONLY:-}" = cache ]; then
  # The cache rows are replaced: the other rows of the table stay as the full pass wrote them.
  sed -i '/^compile_cache_/d' "$TSV"
else

# 1. rendezvous that never completes: torchrun for 2 nodes, only one started
run rendezvous_timeout_c10d "torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29611 --rdzv-id issue26 --rdzv-conf join_timeout=15 dist_trainer.py --steps 3"
run rendezvous_timeout_static "torchrun --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29612 --rdzv-conf timeout=15 dist_trainer.py --steps 3"
# 2. init_process_group's TCPStore: rank 0 waiting for a rank 1 that never joins; rank 1 with no rank 0 to reach
run tcpstore_rank_never_joins "python -u dist_trainer.py --init-timeout-s 15 --steps 3" RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29613
run tcpstore_no_master "python -u dist_trainer.py --init-timeout-s 15 --steps 3" RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29614

# 3. a peer lost mid-collective: rank 1 SIGKILLed after 4 step lines. First two bare ranks (rank 0's log kept; rank 1
# started by the helper, its output in $PIDS), then under torchrun polling its workers every 5 s, so that rank 0 meets
# the lost peer before torchrun stops it.
bare_rank1() {
  PATH="$VENV_BIN:$PATH" RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29615 python -u dist_trainer.py > "$PIDS/rank1.log" 2>&1 < /dev/null &
  local r1=$!
  wait_for "$1" 4 '^step='
  kill -KILL "$r1"
}
MEANWHILE=bare_rank1 run gloo_peer_lost "python -u dist_trainer.py" RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29615
rm -f "$PIDS"/*
kill_rank1() { # LOG ATTEMPT STEPS
  until [ -s "$PIDS/rank1.attempt$2" ]; do sleep 0.1; done
  wait_for "$1" "$3" '^step='
  kill -KILL "$(cat "$PIDS/rank1.attempt$2")"
}
peer_lost() { kill_rank1 "$1" 0 4; }
MEANWHILE=peer_lost run gloo_peer_lost_torchrun "torchrun --standalone --monitor-interval 5 --nproc-per-node 2 dist_trainer.py --pid-dir $PIDS"
rm -f "$PIDS"/*
# 4. torchrun restarting its worker group: rank 1 SIGKILLed in the first attempt; if the restarted group comes up,
# rank 1 is SIGKILLed again there, so the one restart allowed is spent either way.
restarted() {
  until [ -s "$PIDS/torchrun" ]; do sleep 0.1; done
  kill_rank1 "$1" 0 4
  until [ -s "$PIDS/rank1.attempt1" ] || ! kill -0 "$(cat "$PIDS/torchrun")" 2>/dev/null; do sleep 0.1; done
  if [ -s "$PIDS/rank1.attempt1" ]; then kill_rank1 "$1" 1 8; fi
}
MEANWHILE=restarted run torchrun_restarts_exhausted "echo \$\$ > $PIDS/torchrun; exec torchrun --standalone --nproc-per-node 2 --max-restarts 1 dist_trainer.py --pid-dir $PIDS"
rm -f "$PIDS"/*

# 5. preemption: SIGTERM to torchrun; SIGTERM to a bare trainer that saves a checkpoint on it
term_torchrun() { until [ -s "$PIDS/torchrun" ]; do sleep 0.1; done; wait_for "$1" 4 '^step='; kill -TERM "$(cat "$PIDS/torchrun")"; }
MEANWHILE=term_torchrun run torchrun_sigterm "echo \$\$ > $PIDS/torchrun; exec torchrun --standalone --nproc-per-node 2 dist_trainer.py"
CK=$(mktemp -d /tmp/relaunch-ckpt.XXXXXX)
term_trainer() { until [ -s "$PIDS/trainer" ]; do sleep 0.1; done; wait_for "$1" 4 '^step='; kill -TERM "$(cat "$PIDS/trainer")"; }
MEANWHILE=term_trainer run sigterm_saves_checkpoint "python -u sigterm_checkpoint_trainer.py $PIDS/trainer $CK"
{ echo "# after sigterm_saves_checkpoint: ls -la $CK"; ls -la "$CK"; } >&2
rm -rf "$CK"; unset MEANWHILE

# 6. intact checkpoints this code / this torch cannot load: saved by one process (its log not kept), resumed by another
CK=$(mktemp -d /tmp/relaunch-ckpt.XXXXXX)
PATH="$VENV_BIN:$PATH" python -u incompatible_checkpoint.py save "$CK/args/step_800/model.pt" --with-args > /dev/null 2>&1 < /dev/null
PATH="$VENV_BIN:$PATH" python -u incompatible_checkpoint.py save "$CK/plain/step_800/model.pt" > /dev/null 2>&1 < /dev/null
{ echo "# saved: ls -la $CK/*/step_800"; ls -la "$CK"/*/step_800; } >&2
run checkpoint_weights_only "python -u incompatible_checkpoint.py resume $CK/args/step_800/model.pt"
run checkpoint_state_dict_mismatch "python -u incompatible_checkpoint.py resume $CK/plain/step_800/model.pt --changed"
rm -rf "$CK"

# 7. a DataLoader worker taken by the kernel's OOM killer in a 600 MiB memory cgroup (cgroup v1), no swap
CG=/sys/fs/cgroup/memory/relaunch-oom26
mkdir -p "$CG"
echo 600M > "$CG/memory.limit_in_bytes"
echo 600M > "$CG/memory.memsw.limit_in_bytes" 2>/dev/null || true
N0=$(dmesg | wc -l)
run dataloader_worker_oom_killed "sh -c 'echo \$\$ > $CG/cgroup.procs; exec python -u dataloader_oom_trainer.py'"
# the kernel's report of this kill: from "invoked oom-killer" to "Killed process" (read once the trainer is gone)
dmesg | tail -n +$((N0 + 1)) | sed -n '/invoked oom-killer/,/Killed process/p' > "$OUT/dataloader_worker_oom_killed.dmesg"
cat "$CG/memory.oom_control" > "$OUT/dataloader_worker_oom_killed.memory_oom_control"
rmdir "$CG"

fi

# 8. a damaged inductor cache: warm one (compile_trainer.py), then each damage on its own copy
C=$(mktemp -d /tmp/relaunch-cache.XXXXXX)
PATH="$VENV_BIN:$PATH" TORCHINDUCTOR_CACHE_DIR=$C/warm python -u compile_trainer.py > /dev/null 2>&1 < /dev/null
echo "# warmed $C/warm: rc=$?, $(find "$C/warm" -type f | wc -l) files" >&2
half() { for f in "$@"; do truncate -s $(($(stat -c %s "$f") / 2)) "$f"; done; }
# the fx-graph and AOT-autograd entries cut to half (a kill mid-write), the generated code left whole
cp -a "$C/warm" "$C/entries"; mapfile -t fs < <(find "$C/entries/fxgraph" "$C/entries/aotautograd" -type f); half "${fs[@]}"
run compile_cache_entries_truncated "python -u compile_trainer.py" TORCHINDUCTOR_CACHE_DIR="$C/entries"
# every file of the cache cut to half
cp -a "$C/warm" "$C/all_half"; mapfile -t fs < <(find "$C/all_half" -type f); half "${fs[@]}"
run compile_cache_truncated "python -u compile_trainer.py" TORCHINDUCTOR_CACHE_DIR="$C/all_half"
# every .so overwritten in place with as many random bytes
cp -a "$C/warm" "$C/so"; mapfile -t fs < <(find "$C/so" -name '*.so')
for f in "${fs[@]}"; do n=$(stat -c %s "$f"); head -c "$n" /dev/urandom > "$f.new" && mv "$f.new" "$f"; done
run compile_cache_so_overwritten "python -u compile_trainer.py" TORCHINDUCTOR_CACHE_DIR="$C/so"
# only the generated Python modules (c*.py in the two-character folders) cut to half
cp -a "$C/warm" "$C/py_half"; mapfile -t fs < <(find "$C/py_half" -name 'c*.py'); half "${fs[@]}"
run compile_cache_module_truncated "python -u compile_trainer.py" TORCHINDUCTOR_CACHE_DIR="$C/py_half"
# the generated modules cut to their first 100 bytes (a write stopped early): the cut line is what fails
cp -a "$C/warm" "$C/py_cut"; mapfile -t fs < <(find "$C/py_cut" -name 'c*.py')
for f in "${fs[@]}"; do truncate -s 100 "$f"; done
run compile_cache_module_cut_short "python -u compile_trainer.py" TORCHINDUCTOR_CACHE_DIR="$C/py_cut"
rm -rf "$C" "$PIDS"

# The checkout's own path is written /repo/, as in the other fixtures.
for n in "${NAMES[@]}"; do
  for f in "$OUT/$n.log" "$OUT/$n.shell_stderr"; do [ -e "$f" ] && sed -i "s|$REPO/|/repo/|g" "$f"; done
done
