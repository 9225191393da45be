#!/usr/bin/env bash
# shellcheck shell=bash
# A build aside failed: the venv folder is put back as it was before the build (the venv itself was never
# touched), and the failed build is kept beside it as VENV.failed-STAMP for a look; print where.
venv=$1 new=$2 stamp=$3
[ -e "$new" ] || { echo "nothing built at $new"; exit 0; }
dest="$venv.failed-$stamp" n=1
while [ -e "$dest" ]; do dest="$venv.failed-$stamp.$n" n=$((n + 1)); done
mv -T -- "$new" "$dest" && echo "kept $dest"
