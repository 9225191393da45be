#!/usr/bin/env bash
# shellcheck shell=bash
# Every reason the recovery would fail, before anything changes.
repo=$1 ref=$2 lock=$3 venv=$4 min_kb=$5 logdir=$6 need_gpu=$7 python=$8
problem() { echo "PROBLEM: $*"; }
for tool in git tmux flock; do command -v "$tool" >/dev/null 2>&1 || problem "$tool is not installed"; done
command -v uv >/dev/null 2>&1 || problem "uv is not installed (needed to build the venv)"
command -v "$python" >/dev/null 2>&1 || [ -x "$python" ] || problem "python '$python' not found"
[ "$need_gpu" = 1 ] && ! command -v nvidia-smi >/dev/null 2>&1 && problem "nvidia-smi is not installed but GPUs are expected"
if [ ! -d "$repo" ]; then problem "repo_dir $repo does not exist"
elif ! git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then problem "repo_dir $repo is not a git checkout"
elif ! git -C "$repo" rev-parse --verify --quiet "$ref^{commit}" >/dev/null; then problem "known_good_ref '$ref' is not a commit in $repo"
fi
[ -f "$lock" ] || problem "lock_file $lock does not exist"
parent=$(dirname "$venv")
[ -d "$parent" ] || problem "venv parent folder $parent does not exist"
if [ -d "$parent" ]; then
  free=$(df -Pk "$parent" | awk 'NR==2 {print $4}')
  [ "${free:-0}" -ge "$min_kb" ] || problem "only $((free / 1024)) MiB free at $parent, need $((min_kb / 1024)) MiB"
fi
d=$logdir; while [ ! -e "$d" ]; do d=$(dirname "$d"); done
{ [ -d "$d" ] && [ -w "$d" ]; } || problem "log_dir $logdir cannot be created (nearest existing: $d)"
echo checked
