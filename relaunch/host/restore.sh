#!/usr/bin/env bash
# shellcheck shell=bash
# Save what the restore drops as a patch, then restore the paths to the ref.
repo=$1 ref=$2 patch=$3; shift 3
set -e
cd -- "$repo"
# Everything that differs from the ref, committed later or not: exactly what the restore drops.
if ! git diff --quiet "$ref" -- "$@"; then
  mkdir -p "$(dirname "$patch")"
  git diff --binary "$ref" -- "$@" > "$patch.tmp" && mv -f "$patch.tmp" "$patch"
  echo "saved $patch"
fi
git checkout "$ref" -- "$@"
echo "ref $(git rev-parse "$ref^{commit}")"
echo "head $(git rev-parse HEAD)"
