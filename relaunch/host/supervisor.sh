#!/usr/bin/env bash
# shellcheck shell=bash
# shellcheck source=lib.sh
. ./lib.sh
# relaunch supervisor. $1: the run folder; its `spec` holds repo, venv bin, command, then KEY=VALUE entries.
set -o pipefail
run_dir=$1
log=$(cat "$run_dir/log_path")
run_id=${run_dir##*/}
mapfile -d '' spec < "$run_dir/spec"
repo=${spec[0]} venv_bin=${spec[1]} command=${spec[2]}
note() { printf '[relaunch] %s run %s: %s\n' "$(date -u +%FT%TZ)" "$run_id" "$1" >> "$log"; }
# A handler (not an ignore) so the trainer still gets default signal handling.
trap 'true' TERM HUP INT
record_pid "$$" "$run_dir/supervisor_pid"
cd -- "$repo" || { note "cannot cd to $repo"; echo 126 > "$run_dir/exit_code"; exit 126; }
note "start: $command"
# The environment reaches the trainer as environment: `env` takes each KEY=VALUE as one argument.
# RELAUNCH_RUN marks every process of this run, also ranks a launcher starts in sessions of their own.
PATH="$venv_bin:$PATH" env -- "RELAUNCH_RUN=$run_dir" "${spec[@]:3}" bash -c "$command" >> "$log" 2>&1 < /dev/null &
pid=$!
record_pid "$pid" "$run_dir/pid"
wait "$pid"; code=$?
while kill -0 "$pid" 2>/dev/null; do wait "$pid"; code=$?; done
echo "$code" > "$run_dir/exit_code.tmp" && mv -f "$run_dir/exit_code.tmp" "$run_dir/exit_code"
note "trainer exited with code $code"
exit "$code"
