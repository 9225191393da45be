#!/usr/bin/env bash
# shellcheck shell=bash
# Remove an aside copy judged to be only cache; it must still be the sibling relaunch made, and no process may
# still use it (another job sharing the cache: an open file or a loaded kernel there). Exit 5: in use, kept.
# shellcheck source=lib.sh
. ./lib.sh
cache=$1 aside=$2
case $aside in "$cache".relaunch-cleared-*) ;; *) echo "refusing to remove $aside"; exit 3 ;; esac
[ -L "$aside" ] && { echo "refusing to remove a link"; exit 3; }
# Open files (fd links) and mapped files (a compiled kernel's .so in /proc/PID/maps) name the folder as it is now.
mapfile -t users < <({ pids_with_files_under "$aside"; grep -lsF -- " $aside/" /proc/[0-9]*/maps | cut -d/ -f3; } | sort -un)
if [ ${#users[@]} -gt 0 ]; then
  echo "the old compile cache is still in use by ${#users[@]} process(es), kept as $aside:"
  describe_pids "${users[@]}"
  exit 5
fi
rm -rf -- "$aside"
