#!/usr/bin/env bash
# Capture the issue-9 failure fixtures (disk full, segfault/abort, DataLoader shm, truncated checkpoint)
# into tests/fixtures/logs/cpu/ (see PROVENANCE.md there). Run as root on the 2-core CPU box.
# Usage: bash bench/cpu_capture/capture_failures_issue9.sh [OUTDIR]
# Each trainer runs as relaunch's supervisor runs one: PATH=$VENV_BIN:$PATH bash -c CMD >> LOG 2>&1 < /dev/null,
# exit code read as $? straight after; codes go to OUTDIR/exit_codes_issue9.tsv.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=$(realpath -m "${1:-$REPO/tests/fixtures/logs/cpu}")
VENV_BIN=${VENV_BIN:-$REPO/.venv/bin}
mkdir -p "$OUT"; cd "$HERE"
TSV=$OUT/exit_codes_issue9.tsv
printf 'file\texit_code\n' > "$TSV"
rec() { printf '%s\t%s\n' "$1" "$2" >> "$TSV"; echo "$1 rc=$2" >&2; }
# run NAME CMD [KEY=VALUE...]: the supervisor's invocation, fresh log; the parent's own stderr
# (bash's job notice when the trainer dies by a signal) goes to NAME.shell_stderr if non-empty.
run() {
  local name=$1 cmd=$2; shift 2
  : > "$OUT/$name.log"
  { PATH="$VENV_BIN:$PATH" env -- "$@" bash -c "$cmd" >> "$OUT/$name.log" 2>&1 < /dev/null; rc=$?; } 2> "$OUT/$name.shell_stderr"
  [ -s "$OUT/$name.shell_stderr" ] || rm -f "$OUT/$name.shell_stderr"
  rec "$name.log" "$rc"
}

# 1. disk full: a 2 MiB tmpfs as the output folder
MNT=$(mktemp -d /tmp/relaunch-diskfull.XXXXXX)
mount -t tmpfs -o size=2m tmpfs "$MNT"
run disk_full_torch_save "python -u disk_full_trainer.py ckpt $MNT"
{ echo "# after disk_full_torch_save: df -B1 $MNT; ls -la $MNT $MNT/step_600; stat -c '%n %s' $MNT/step_600/model.pt"
  df -B1 "$MNT"; ls -la "$MNT" "$MNT/step_600"; stat -c '%n %s' "$MNT/step_600/model.pt"; } >&2
umount "$MNT"
mount -t tmpfs -o size=2m tmpfs "$MNT"
run disk_full_log_write "python -u disk_full_trainer.py log $MNT"
{ echo "# after disk_full_log_write: ls -la $MNT"; ls -la "$MNT"; } >&2
umount "$MNT"; rmdir "$MNT"

# 2. native crashes: SIGSEGV without and with faulthandler, SIGABRT
run segfault "python -u segfault_trainer.py segv"
run segfault_faulthandler "python -u segfault_trainer.py segv" PYTHONFAULTHANDLER=1
run abort "python -u segfault_trainer.py abort"

# 3. DataLoader workers with a 1 MiB /dev/shm (private mount namespace, host /dev/shm untouched)
run dataloader_bus_error "unshare -m bash -c 'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec python -u bus_error_trainer.py 4'"

# 4. checkpoint truncated by SIGKILL mid-save, then a resume from it
CK=$(mktemp -d /tmp/relaunch-ckpt.XXXXXX)
ckpt=$CK/step_600/model.pt
while :; do
  rm -rf "${CK:?}"/*
  PATH="$VENV_BIN:$PATH" python -u truncated_checkpoint.py save "$ckpt" > "$CK/save.log" 2>&1 < /dev/null &
  spid=$!
  # poll the file's size: kill once it exists, is non-empty and still growing (not yet complete)
  until s=$(stat -c %s "$ckpt" 2>/dev/null) && [ "$s" -gt 0 ]; do kill -0 "$spid" 2>/dev/null || break; done
  kill -KILL "$spid" 2>/dev/null; wait "$spid" 2>/dev/null; src=$?
  if [ "$src" = 137 ] && ! grep -q '^saved checkpoint' "$CK/save.log"; then break; fi
  echo "saver not killed mid-write (rc=$src), again" >&2
done
{ echo "# saver killed: rc=$src, poll saw $s bytes; file after kill:"; ls -la "$CK/step_600"; stat -c '%n %s' "$ckpt"; } >&2
run truncated_checkpoint_load "python -u truncated_checkpoint.py resume $ckpt"
rm -rf "$CK"

# The checkout's own path is written /repo/, as in the other fixtures.
for n in disk_full_torch_save disk_full_log_write segfault segfault_faulthandler abort dataloader_bus_error truncated_checkpoint_load; do
  for f in "$OUT/$n.log" "$OUT/$n.shell_stderr"; do [ -e "$f" ] && sed -i "s|$REPO/|/repo/|g" "$f"; done
done
