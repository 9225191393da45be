#!/usr/bin/env bash
# Capture the faces of a damaged compile cache (issue 26): warm a fresh inductor cache with cache_trainer.py, then
# for each damage start the trainer again, in a fresh process, on a damaged copy of that cache.
# Usage (repo root, on the GPU machine): bash bench/gpu_capture/capture_cache.sh OUTDIR
#   DEVICE=cpu PY=.venv/bin/python bash bench/gpu_capture/capture_cache.sh OUTDIR   # the same steps on the CPU
# Writes OUTDIR/gpu_cache.tar (rewritten after every face, so a run cut short still brings back the finished
# faces): cache_FACE.log (the trainer's stdout+stderr), cache_FACE.shell_stderr (bash's own notice of a child
# killed by a signal), cache_FACE.damage (what damage_cache.py did), cache_rcs.txt (exit code, UTC times,
# command of each face), cache_layout.txt (ls -lRa of the warmed cache), cache_env.txt (versions, cache settings).
# Each face has its own copy of the warmed cache: TORCHINDUCTOR_CACHE_DIR=FACE/inductor and HOME=FACE/home, so
# whatever Triton writes under ~/.triton lands in the copy too (cache_env.txt says where it landed).
set -u
OUTDIR=${1:?usage: capture_cache.sh OUTDIR}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
LIMIT_S=${LIMIT_S:-150}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR
W=/tmp/gpu_cache_capture
L=$W/logs
rm -rf "$W"
mkdir -p "$L" "$W/faces"
now() { date -u +%FT%TZ; }
pack() { tar -C "$L" -cf "$OUTDIR/gpu_cache.tar" .; }
trainer=("$PY" -u cache_trainer.py --device "$DEVICE")

# fresh_face NAME: a copy of the warmed cache (FACE/inductor, FACE/home) for one face to damage and run on.
fresh_face() {
  rm -rf "$W/faces/$1"
  cp -a "$W/pristine" "$W/faces/$1"
}

# damage NAME MODE [SELECTOR...]: a fresh copy, damaged by damage_cache.py (selectors relative to the copy); its
# record goes to cache_NAME.damage. Fails, and says so in cache_rcs.txt, where no file matched.
damage() {
  local name=$1 mode=$2
  shift 2
  fresh_face "$name"
  "$PY" "$HERE/damage_cache.py" "$mode" "$W/faces/$name" "$@" > "$L/cache_$name.damage" 2>&1 && return 0
  echo "cache_$name not run: damage_cache.py $mode $* matched no file" | tee -a "$L/cache_rcs.txt"
  return 1
}

# face NAME [VAR=VALUE...]: run the trainer on FACE=faces/NAME (faces/$FACE_DIR where set: a second start on a
# face's cache as the first start left it) in bench/gpu_capture, log, record the exit code.
face() {
  local name=$1 root=$W/faces/${FACE_DIR:-$1} t0 rc
  shift
  t0=$(now)
  {
    (cd "$HERE" && exec env TORCHINDUCTOR_CACHE_DIR="$root/inductor" HOME="$root/home" "$@" \
      timeout -k 10 "$LIMIT_S" "${RUN_AS[@]}" "${trainer[@]}") > "$L/cache_$name.log" 2>&1
    rc=$?
  } 2> "$L/cache_$name.shell_stderr"
  echo "cache_$name rc=$rc start=$t0 end=$(now) cmd=cd bench/gpu_capture && env TORCHINDUCTOR_CACHE_DIR=$root/inductor HOME=$root/home $* timeout -k 10 $LIMIT_S ${RUN_AS[*]} ${trainer[*]}" \
    >> "$L/cache_rcs.txt"
  echo "== cache_$name rc=$rc $(grep -c '^step=' "$L/cache_$name.log") step lines"
  pack
}
RUN_AS=()

{
  echo "date_utc=$(now)"
  uname -a
  nproc
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" - "$DEVICE" << 'EOF'
import sys
import torch
import torch._inductor.config as ic
from torch._inductor.runtime.cache_dir_utils import cache_dir, triton_cache_dir
print(sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda)
try:
    import triton
    print("triton", triton.__version__, triton.__file__)
except ImportError as e:
    print("triton not importable:", e)
if sys.argv[1] == "cuda":
    print("device", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0))
print("fx_graph_cache", ic.fx_graph_cache, "autograd_cache", torch._functorch.config.enable_autograd_cache,
      "bundle_triton_into_fx_graph_cache", ic.bundle_triton_into_fx_graph_cache,
      "use_static_cuda_launcher", getattr(ic, "use_static_cuda_launcher", None),
      "compile_threads", ic.compile_threads)
print("default cache_dir()", cache_dir(), "default triton_cache_dir(0)", triton_cache_dir(0))
EOF
} > "$L/cache_env.txt" 2>&1
pack

# Warm: an empty cache (and an empty HOME) that the first run fills. A marker before it finds anything the run
# wrote outside the cache (Triton's own cache, temp files) so the layout record is complete.
mkdir -p "$W/faces/cold/inductor" "$W/faces/cold/home"
touch "$W/before_cold"
face cold
{
  echo "files written by the cold run outside its cache copy (find /tmp /root -newer marker, excluding $W):"
  find /tmp /root -newer "$W/before_cold" -type f -not -path "$W/*" 2> /dev/null | head -n 50
} >> "$L/cache_env.txt"
cp -a "$W/faces/cold" "$W/pristine"
(cd "$W/pristine" && ls -lRa .) > "$L/cache_layout.txt" 2>&1  # -a: Triton's own cache is HOME/.triton
pack

# Healthy warm start, the baseline every damaged face is compared with.
fresh_face warm
face warm

# A second start on the same damaged copy (FACE_rerun) shows whether the first start repaired the cache or whether
# every relaunch on it fails the same way.

# (a) every compiled module (.so: Triton's driver utils and launchers) cut to half; once more with faulthandler on.
damage so_half half .so && face so_half && FACE_DIR=so_half face so_half_rerun
damage so_half_faulthandler half .so && face so_half_faulthandler PYTHONFAULTHANDLER=1

# (b) every kernel image (.cubin) cut to half, and overwritten with garbage of the same size.
damage cubin_half half .cubin && face cubin_half
damage cubin_garbage garbage .cubin && face cubin_garbage && FACE_DIR=cubin_garbage face cubin_garbage_rerun

# (c) the fx-graph cache's entries cut to half (the "cannot unpickle" face); AOTAutograd's entries likewise.
damage fxgraph_half half inductor/fxgraph/ && face fxgraph_half && FACE_DIR=fxgraph_half face fxgraph_half_rerun
damage aotautograd_half half inductor/aotautograd/ && face aotautograd_half

# (d) the whole cache cut off mid-write: every file truncated to a random prefix (seed 26).
damage prefix_all prefix && face prefix_all && FACE_DIR=prefix_all face prefix_all_rerun

# (e) the cache read-only. The commands run as root, whom file modes do not stop: a read-only bind mount, or where
# mounts are refused, the modes removed and the trainer run as nobody.
fresh_face readonly
ro=$W/faces/readonly
if mount --bind "$ro" "$ro" 2> "$L/cache_readonly.damage" && mount -o remount,bind,ro "$ro" 2>> "$L/cache_readonly.damage"; then
  echo "read-only bind mount of $ro" >> "$L/cache_readonly.damage"
  face readonly
  umount "$ro"
elif command -v setpriv > /dev/null; then
  umount "$ro" 2> /dev/null
  chmod -R a+rX,a-w "$ro"
  echo "mount refused; modes a+rX,a-w on $ro, trainer run as uid 65534 (setpriv)" >> "$L/cache_readonly.damage"
  RUN_AS=(setpriv --reuid=65534 --regid=65534 --clear-groups)
  face readonly
  RUN_AS=()
else
  echo "no read-only bind mount and no setpriv: face not captured" >> "$L/cache_readonly.damage"
fi
pack
echo ALL_DONE
