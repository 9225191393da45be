#!/usr/bin/env bash
# shellcheck shell=bash
# The log's size, then its last N lines as of that size.
log=$1 n=$2
size=$(stat -c %s -- "$log") || exit 3
echo "$size"
head -c "$size" -- "$log" | tail -n "$n"
