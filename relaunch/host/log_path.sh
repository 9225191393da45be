#!/usr/bin/env bash
# shellcheck shell=bash
# The current attempt's log path.
state=$1
run_id=$(cat "$state/current" 2>/dev/null) || { echo "no launch on record in $state"; exit 3; }
cat "$state/runs/$run_id/log_path"
