#!/usr/bin/env bash
# shellcheck shell=bash
# The step a check's last poll read, journaled for the run it was read from (RUN/journal `S HOSTTIME STEP`): a
# poll journals the step its previous poll read, so without this a check that settles at its first poll leaves
# no step behind, and the next check could not learn the run's step interval (its stall window) across checks.
# shellcheck source=lib.sh
. ./lib.sh
state=$1 run_id=$2 seen_step=$3
run=$(run_folder "$state" "$run_id")
# Only while that run is still the current one and its journal exists (a relaunch in between starts a new one).
if [ "$(current_run "$state")" = "$run_id" ] && [ -w "$run/journal" ]; then
  echo "S $seen_step" >> "$run/journal"
fi
exit 0
