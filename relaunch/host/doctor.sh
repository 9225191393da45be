#!/usr/bin/env bash
# shellcheck shell=bash
# `relaunch doctor`: whether the host can run and recover the target, changing nothing of the user's. One line per
# check, `CHECK<TAB>name<TAB>ok|fail<TAB>what was found<TAB>what to do`, read by relaunch/plans/doctor.py.
# Writes only a probe file of its own into log_dir and checkpoint_dir (or their nearest existing folder), removed at once.
#   bash doctor.sh PYTHON REPO REF LOCK VENV LOGDIR CKPTDIR MIN_KB GPUS OFFLINE [INSTALLER FLAGS...]
python=$1 repo=$2 ref=$3 lock=$4 venv=$5 logdir=$6 ckptdir=$7 min_kb=$8 gpus=$9 offline=${10}
shift 10
say() { local IFS=' '; printf 'CHECK\t%s\t%s\t%s\t%s\n' "$1" "$2" "${3//$'\n'/ | }" "${4-}"; }
# The last lines of a tool's output, one line: what a person reads first.
tail_of() { printf '%s' "$1" | tail -n "${2:-3}" | tr '\n' ' ' | sed 's/ *$//'; }

for tool in tmux git uv flock; do
  if where=$(command -v "$tool"); then say "$tool" ok "$where"
  else say "$tool" fail "$tool is not on PATH ($PATH)" "install $tool on the host (Debian: apt-get install -y ${tool/flock/util-linux}; uv: pip install uv), or put it on the PATH of non-interactive shells"
  fi
done
if where=$(command -v "$python") || { [ -x "$python" ] && where=$python; }; then
  say python ok "$where: $("$where" -c 'import sys; print(sys.version.split()[0])' 2>&1 | head -n 1)"
else
  say python fail "python '$python' not found" "install it, or set python: to an interpreter the host has"
fi

if [ "$gpus" -gt 0 ]; then
  if ! where=$(command -v nvidia-smi); then
    say nvidia-smi fail "nvidia-smi is not on PATH, and the target expects $gpus GPU(s)" "install the NVIDIA driver utilities on the host (or in the container), or set thresholds.expected_gpus: 0"
  else
    say nvidia-smi ok "$where"
    if listing=$(nvidia-smi -L 2>&1); then
      seen=$(grep -c '^GPU [0-9]' <<< "$listing")
      if [ "$seen" -ge "$gpus" ]; then say gpus ok "$seen GPU(s) visible, $gpus expected"
      else say gpus fail "only $seen GPU(s) visible, $gpus expected: $(tail_of "$listing" 8)" "check the driver (nvidia-smi, dmesg for Xid lines) and the container's GPU passthrough, or lower thresholds.expected_gpus"
      fi
    else
      say gpus fail "nvidia-smi -L failed: $(tail_of "$listing")" "check the NVIDIA driver on the host (nvidia-smi as root, dmesg)"
    fi
  fi
fi

if [ ! -d "$repo" ]; then say repo fail "repo_dir $repo does not exist" "clone the training code there, or fix repo_dir"
elif ! git -C "$repo" rev-parse --git-dir > /dev/null 2>&1; then say repo fail "repo_dir $repo is not a git checkout" "point repo_dir at the checkout's top folder"
elif ! git -C "$repo" rev-parse --verify --quiet "$ref^{commit}" > /dev/null; then say repo fail "known_good_ref '$ref' is not a commit in $repo" "git fetch in $repo, or fix known_good_ref"
else say repo ok "$repo at $ref ($(git -C "$repo" rev-parse --short "$ref^{commit}"))"
fi

# The nearest folder that exists at or above PATH: where a folder not yet made will be made, and whose disk it uses.
existing() { local d=$1; while [ ! -e "$d" ] && [ "$d" != / ]; do d=$(dirname -- "$d"); done; printf '%s' "$d"; }
free_disk() {
  local name=$1 dir=$2 at kb
  at=$(existing "$dir")
  kb=$(df -Pk -- "$at" 2> /dev/null | awk 'NR == 2 {print $4}')
  if [ -z "$kb" ]; then say "disk $name" fail "cannot read the free space at $at (df failed)" "check the filesystem holding $dir"
  elif [ "$kb" -lt "$min_kb" ]; then
    say "disk $name" fail "only $((kb / 1024)) MiB free at $at, $((min_kb / 1024)) MiB needed (min_free_disk_gb)" "free space on that filesystem (old venvs beside venv_dir, old logs or checkpoints), or lower min_free_disk_gb"
  else say "disk $name" ok "$((kb / 1024 / 1024)) GiB free at $at"
  fi
}
# Writable is tried, not read off the mode bits: root passes every mode test, but not a read-only mount.
writable() {
  local name=$1 dir=$2 at probe err
  at=$(existing "$dir")
  if [ ! -d "$at" ]; then say "writable $name" fail "$name $dir cannot be created: $at is not a folder" "fix $name, or move $at away"; return; fi
  if probe=$(mktemp -p "$at" .relaunch-doctor.XXXXXX 2>&1); then
    rm -f -- "$probe"
    if [ "$at" = "$dir" ]; then say "writable $name" ok "$dir"; else say "writable $name" ok "$dir does not exist yet; it can be made in $at"; fi
  else
    err=$(tail_of "$probe" 1)
    if [ "$at" = "$dir" ]; then say "writable $name" fail "$name $dir is not writable: $err" "make it writable for $(id -un) (a read-only mount? its owner?), or point $name elsewhere"
    else say "writable $name" fail "$name $dir cannot be created in $at: $err" "create $dir writable for $(id -un), or point $name elsewhere"
    fi
  fi
}
free_disk venv_dir "$(dirname -- "$venv")"
free_disk log_dir "$logdir"
writable log_dir "$logdir"
if [ -n "$ckptdir" ]; then
  free_disk checkpoint_dir "$ckptdir"
  writable checkpoint_dir "$ckptdir"
fi

# The lock resolves as the rebuild installs it (`uv pip sync`: exactly the pinned lines, no dependencies added),
# with the rebuild's index flags; never touching the network when the target is offline.
if [ ! -f "$lock" ]; then say lock fail "lock_file $lock does not exist" "commit the lock in the repo, or fix lock_file"
elif ! command -v uv > /dev/null 2>&1; then say lock fail "cannot resolve $lock: uv is missing" "install uv on the host"
else
  net=()
  [ "$offline" = 1 ] && net=(--offline)
  if out=$(uv pip compile --quiet --no-header --no-deps "${net[@]}" --python "$python" "$@" -o /dev/null -- "$lock" 2>&1); then
    say lock ok "$lock resolves$([ "$offline" = 1 ] && echo ' offline')"
  else
    say lock fail "$lock does not resolve: $(tail_of "$out" 4)" "pin versions that exist in the target's indexes or find_links (offline: the wheels must be in find_links)"
  fi
fi
