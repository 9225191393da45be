#!/usr/bin/env bash
# shellcheck shell=bash
# The log's size, then its bytes from an offset.
log=$1 offset=$2 max=$3
size=$(stat -c %s -- "$log") || exit 3
echo "$size"
[ "$size" -gt "$offset" ] && tail -c +$((offset + 1)) -- "$log" | head -c "$max"
exit 0
