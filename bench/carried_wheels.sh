# shellcheck shell=bash
# Sourced by the GPU run scripts (bench/gpu_multirank/run.sh, bench/gpu_demo/run.sh), from the repo root, on a
# machine with no package registry: installs the wheels carried in .whl/ (Prefect and all its dependencies for
# Python 3.12, manylinux x86_64, and py-spy's; how they were fetched: tests/fixtures/logs/gpu/PROVENANCE.md)
# into /tmp/site, and puts uv, git and py-spy on PATH where the machine lacks them (uv's and git's binaries
# travel xz-compressed in .whl/: uv's wheel is too big to carry beside Prefect's; git is Debian bookworm's 2.39.5, builtins only).
#   source bench/carried_wheels.sh; install_carried_wheels LOGDIR || exit 3
# Writes LOGDIR/pip.txt, appends a line to LOGDIR/env.txt. PYTHONPATH is the caller's: /tmp/site and its source.

# unpack_carried_tool NAME: .whl/NAME-*-x86_64.xz to /tmp/site/bin/NAME, on PATH, unless NAME is there already.
unpack_carried_tool() {
  command -v "$1" > /dev/null && return 0
  local packed
  packed=$(ls .whl/"$1"-*-x86_64.xz) || return 1
  mkdir -p /tmp/site/bin \
    && python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$packed" "/tmp/site/bin/$1" \
    && chmod +x "/tmp/site/bin/$1" && export PATH="$PATH:/tmp/site/bin"
}

install_carried_wheels() {
  local logs=$1 t0
  t0=$(date +%s)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$logs/pip.txt" 2>&1 \
    || { cat "$logs/pip.txt"; return 3; }
  unpack_carried_tool uv || return 3
  unpack_carried_tool git || return 3
  command -v py-spy > /dev/null || export PATH="$PATH:/tmp/site/bin"
  echo "wheels installed in $(( $(date +%s) - t0 )) s; uv=$(command -v uv) ($(uv --version)) git=$(command -v git) py-spy=$(command -v py-spy)" \
    | tee -a "$logs/env.txt"
}

# installed_layout SRC DEST: the package as pip installs it (pyproject's package-dir: flows/, tasks/ and demo/ as
# relaunch.flows, relaunch.tasks, relaunch.demo), as a tree of links under DEST, for PYTHONPATH: the GPU machines have
# no registry to build the wheel with, and a plain checkout on PYTHONPATH has no relaunch.flows.
installed_layout() {
  local src=$1 dest=$2 sub
  rm -rf "$dest" && mkdir -p "$dest" && cp -rs "$src/relaunch" "$dest/relaunch" || return 1
  for sub in flows tasks demo; do ln -s "$src/$sub" "$dest/relaunch/$sub" || return 1; done
}
