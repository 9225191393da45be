#!/usr/bin/env python3
"""The mutation table: each judging mechanism, broken once, must turn the test(s) that guard it red.

A guard no test catches the removal of is a guard in name only (issue 36 found six). Each row of MUTANTS names a
mechanism, one exact string replacement in one file that removes its guard (never a syntax break), and the pytest
node ids that must fail once it is gone. For each row the tracked tree (`git ls-files`) is copied into a fresh
temporary folder, the mutation applied there (the checkout is never touched), and the row's tests run there with
the copy first on PYTHONPATH; the verdict is `killed` (the tests went red) or `SURVIVED` (still green: a finding).

    python scripts/mutants.py              every row, then a markdown table; exit 1 if any row is not killed
    python scripts/mutants.py --only NAME  one row (repeatable)
    python scripts/mutants.py --list       the rows, and nothing run
    python scripts/mutants.py --baseline   each row's tests on the unmutated copy: they must all pass

A mutation whose `old` text is not found exactly once fails its row loudly (`NOT APPLIED`), so the table cannot rot
silently as the code moves; so does a node id that no longer collects, or a test that skips instead of running.
Run the rows one at a time (they start real trainers, tmux sessions, a Prefect server, network namespaces).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# pyproject's package-dir maps the top-level flows/, tasks/ and demo/ to relaunch.flows etc.; in the copy, links make
# `relaunch/flows` and the rest resolve there, so that PYTHONPATH=<copy> imports the copy, never the editable install.
PACKAGE_LINKS = {"relaunch/flows": "../flows", "relaunch/tasks": "../tasks", "relaunch/demo": "../demo"}
# A row's tests in one pytest run: the slowest (a fleet of namespace hosts, a gang recovery) take minutes on a
# loaded machine; pyproject's own per-test timeout (600 s) still applies inside.
ROW_TIMEOUT_SECONDS = 900


@dataclass(frozen=True)
class Mutant:
    """One guard, broken once: `old` replaced by `new` in `file`; `tests` must go red."""

    name: str
    mechanism: str
    file: str
    old: str
    new: str
    what: str  # the mutation in a few words, for the table
    tests: tuple[str, ...]


GEN = "tests/test_generated_histories.py"
EVIDENCE = "tests/test_judging_evidence.py"
SHAPES = "tests/test_log_reading_shapes.py"
CONTENT = "tests/test_checkpoint_content.py"
CHOICE = "tests/test_checkpoint_choice.py"
GAPS = "tests/test_never_harm_gaps.py"
ROOTS = "tests/test_root_cause_rules.py"
HANDOVER = "tests/test_watch_handover.py"
RECORD = "tests/test_progress_record.py"
TRAJ = "tests/test_checkpoint_trajectory.py"
CAUSE = "tests/test_cause_first.py"
GUARDS = "tests/test_launch_guards.py"
RULES = "tests/test_progress_rules.py"

MUTANTS: tuple[Mutant, ...] = (
    # ---- issue 36: judging a live run from evidence ----------------------------------------------------------------
    Mutant(
        name="cpu-is-work",
        mechanism="process evidence: CPU gained over the window is work",
        file="relaunch/judging/activity.py",
        old="    gained = latest.cpu_ticks - then.cpu_ticks\n",
        new="    gained = 0\n",
        what="CPU ticks gained read as 0",
        tests=(f"{GEN}::test_a_busy_tree_quiet_for_many_windows_is_sampled_before_it_is_judged_and_called_only_once_its_stacks_fail",),
    ),
    Mutant(
        name="waiting-stacks-hang",
        mechanism="py-spy stacks: every sample waiting is a hang, CPU or not",
        file="relaunch/judging/activity.py",
        old="    if len(recent) >= HANG_SAMPLES and all(waiting for _, waiting, _ in recent):\n        return True\n",
        new="    if len(recent) >= HANG_SAMPLES and all(waiting for _, waiting, _ in recent):\n        return None\n",
        what="all-waiting samples decide nothing",
        tests=(f"{GEN}::test_a_generated_busy_hang_whose_every_stack_waits_is_stalled_by_its_stacks_long_before_the_ceiling",),
    ),
    Mutant(
        name="spinning-stacks-hang",
        mechanism="py-spy stacks: samples spinning in one place are a hang",
        file="relaunch/judging/activity.py",
        old="        return True  # the same active frames, line for line, in every sample",
        new="        return None  # the same active frames, line for line, in every sample",
        what="one-place spin decides nothing",
        tests=(f"{EVIDENCE}::test_a_thread_spinning_while_the_main_thread_waits_is_a_hang_by_its_stacks",),
    ),
    Mutant(
        name="never-on-one-look",
        mechanism="never act on one look: history shorter than the window watches",
        file="relaunch/judging/alive.py",
        old="    young = activity.history_seconds < window\n",
        new="    young = False\n",
        what="history never 'young'",
        tests=(f"{EVIDENCE}::test_a_hung_trainer_is_called_stalled_only_after_it_was_watched_for_its_window",),
    ),
    Mutant(
        name="resume-is-no-step",
        mechanism="progress is a step that advances: resume/restore/eval lines are no step",
        file="relaunch/judging/logtext.py",
        old="    if NOT_A_TRAINING_STEP.search(line, clause_start, end):\n        return False\n",
        new="    if False:\n        return False\n",
        what="governing word before a mention ignored",
        tests=(
            f"{SHAPES}::test_a_resume_load_save_or_eval_mention_never_counts_as_a_step",
            f"{SHAPES}::test_restored_from_global_step_then_a_quiet_compile_is_starting_not_stalled",
        ),
    ),
    Mutant(
        name="thousands-separators",
        mechanism="throughput forms: `21,300 tok/s` reads 21300",
        file="relaunch/judging/logtext.py",
        old='        return float(text.replace(grouped["sep"], "")) * scale\n',
        new='        return float(text.split(grouped["sep"])[0]) * scale\n',
        what="grouped figure read up to its separator",
        tests=(f"{SHAPES}::test_a_run_printing_21_300_tok_s_against_a_21500_baseline_is_healthy",),
    ),
    Mutant(
        name="scientific-notation",
        mechanism="throughput forms: `2.13e+04 tok/s` reads 21300",
        file="relaunch/judging/logtext.py",
        old=r'.]*\d)?(?:[eE][-+]?\d+)?"',
        new=r'.]*\d)?"',
        what="exponent dropped from NUMBER",
        tests=(f"{SHAPES}::test_a_run_printing_21_300_tok_s_against_a_21500_baseline_is_healthy",),
    ),
    Mutant(
        name="unit-is-a-key",
        mechanism="throughput forms: `loss=2.31 tokens/s: 21300` reads 21300, not 2.31",
        file="relaunch/judging/reading.py",
        old='    if keyed is not None and keyed.groupdict().get("value2") is not None:\n        return keyed, True\n',
        new="    if False:\n        return keyed, True\n",
        what="a unit followed by `: N` read as the unit of the number before it",
        tests=(f"{SHAPES}::test_a_throughput_among_other_metrics_reads_its_value_or_uncertain_never_another_fields_number",),
    ),
    Mutant(
        name="baseline-scope",
        mechanism="throughput forms: one GPU's figure is no reading against the job's baseline",
        file="relaunch/judging/reading.py",
        old="tput.value if tput.scope in (None, thresholds.baseline_scope) else None",
        new="tput.value",
        what="a per-GPU figure compared with the job's baseline",
        tests=(f"{SHAPES}::test_a_healthy_run_printing_one_gpus_figure_is_never_degraded_against_the_whole_jobs_baseline",),
    ),
    Mutant(
        name="uncertain-figures",
        mechanism="throughput forms: an uncertain figure (`21.300`) never degrades",
        file="relaunch/judging/logtext.py",
        old="        if not suffix and _DOT_OR_THOUSANDS.fullmatch(text):\n            return None\n",
        new="        if False:\n            return None\n",
        what="`21.300` read as certain",
        tests=(f"{SHAPES}::test_uncertain_throughput_figures_never_make_a_run_degraded",),
    ),
    Mutant(
        name="this-runs-text",
        mechanism="only this run's text: an appended log is read from RUN/log_offset",
        file="relaunch/host/snapshot.sh",
        old='  { read -r base osum < "$run/log_offset"; } 2> /dev/null\n',
        new='  { read -r _ osum < "$run/log_offset"; } 2> /dev/null\n',
        what="offset never read (base 0)",
        tests=(
            "tests/test_this_runs_text.py::test_the_poll_judges_only_bytes_from_where_this_run_began_even_after_the_log_shrank_or_was_rewritten",
        ),
    ),
    Mutant(
        name="torch-zip-eocd",
        mechanism="checkpoints by content: a torch zip without its end records is cut",
        file="relaunch/deciding/checkpoint_formats.py",
        old='        state="cut", format=TORCH, detail=f"cut short: no end-of-central-directory',
        new='        state="complete", format=TORCH, detail=f"cut short: no end-of-central-directory',
        what="zip with no EOCD judged complete",
        tests=(f"{CONTENT}::test_a_torch_save_cut_short_is_skipped_whoever_killed_the_run_and_whenever[a_rank_died_exit_1]",),
    ),
    Mutant(
        name="safetensors-header",
        mechanism="checkpoints by content: a safetensors file must end where its header says",
        file="relaunch/deciding/checkpoint_formats.py",
        old='    if want != p.size:\n        how = "cut short" if want > p.size else "damaged"\n        return Content(state="cut", format=SAFETENSORS',
        new='    if False:\n        how = "cut short" if want > p.size else "damaged"\n        return Content(state="cut", format=SAFETENSORS',
        what="header's data end not compared with size",
        tests=(f"{CONTENT}::test_a_safetensors_file_whose_header_does_not_parse_or_describes_less_is_never_taken",),
    ),
    Mutant(
        name="one-series",
        mechanism="checkpoints: step numbers compare only within the run's own series",
        file="relaunch/deciding/checkpoint_rules.py",
        old="    if len(set(keys.values())) < 2:\n",
        new="    if True:\n",
        what="the highest number of any name wins (`resnet50.pt` over `step_20.pt`)",
        tests=(f"{CHOICE}::test_a_file_of_another_series_is_never_resumed_from_over_the_runs_own_newest_saves",),
    ),
    Mutant(
        name="rank-is-no-step",
        mechanism="checkpoints: a rank's or shard's number is no step",
        file="relaunch/deciding/checkpoint_names.py",
        old='    if re.search(r"\\d", series) and RANK_WORD.search(series):\n',
        new="    if False:\n",
        what="`step_600_rank1.pt` read as step 1",
        tests=(f"{CHOICE}::test_a_checkpoint_saved_as_one_file_per_rank_is_never_resumed_from_by_one_ranks_file",),
    ),
    Mutant(
        name="symlinked-checkpoint-dir",
        mechanism="checkpoints: a symlinked checkpoint_dir is followed",
        file="relaunch/host/list_checkpoints.sh",
        old='find -H "$dir" -mindepth 1 -maxdepth 1 \\( -empty',
        new='find "$dir" -mindepth 1 -maxdepth 1 \\( -empty',
        what="`find -H` dropped from the listing",
        tests=(f"{CONTENT}::test_a_symlinked_checkpoint_dir_is_followed_and_its_newest_checkpoint_resumed",),
    ),
    Mutant(
        name="date-is-no-step",
        mechanism="checkpoints: a name whose number is a date is no step",
        file="relaunch/deciding/checkpoint_names.py",
        old="    if date := _is_date(number):\n",
        new="    if date := None:\n",
        what="date check removed from not_a_step",
        tests=(f"{CONTENT}::test_a_name_whose_number_only_looks_like_a_step_is_no_step",),
    ),
    Mutant(
        name="hand-started-trainer",
        mechanism="never two trainers: launch refuses beside the program running in repo_dir",
        file="relaunch/host/launch.sh",
        old="if [ ${#running[@]} -gt 0 ]; then\n",
        new="if false; then\n",
        what="exit-21 (cwd + program) refusal removed",
        tests=("tests/test_two_trainers.py::test_a_trainer_started_by_hand_outside_tmux_is_unmanaged_and_no_second_one_is_launched",),
    ),
    Mutant(
        name="wrapper-program",
        mechanism="never two trainers: the programs a wrapper script runs are the target's program too",
        file="relaunch/host/lib.sh",
        old="  [[ $program == *.sh ]] || return 0\n",
        new="  return 0\n",
        what="only the launch command's own program is looked for",
        tests=(
            "tests/test_two_trainers.py::test_a_trainer_started_by_hand_in_any_folder_or_without_its_wrapper_script_is_found_and_none_launched_beside",
        ),
    ),
    Mutant(
        name="program-by-path",
        mechanism="never two trainers: a program named by a path in repo_dir counts from any folder",
        file="relaunch/host/lib.sh",
        old='    grep -lsaF -e "$r/" -e "$repo/" /proc/[0-9]*/cmdline 2> /dev/null | cut -d/ -f3\n',
        new="    true\n",
        what="only processes working in repo_dir are looked at",
        tests=(
            "tests/test_two_trainers.py::test_a_trainer_started_by_hand_in_any_folder_or_without_its_wrapper_script_is_found_and_none_launched_beside",
        ),
    ),
    Mutant(
        name="dead-pane-holds-nothing",
        mechanism="unknown never stops, a dead run is recovered: a pane whose program ended is no foreign run",
        file="relaunch/host/panes.sh",
        old='    [ "$dead" = 1 ] && continue\n    dying "${line%% *}" && continue\n',
        new="",
        what="a dead pane (remain-on-exit) read as a program that is no trainer",
        tests=("tests/test_snapshot_moment.py::test_a_dead_pane_tmux_keeps_is_no_foreign_run_and_the_next_launch_closes_it",),
    ),
    Mutant(
        name="signal-in-script",
        mechanism="root cause: a trainer ended by a signal inside a wrapper script that exits 0 is no finished run",
        file="relaunch/judging/gone.py",
        old="    if code in (0, None) and (signaled := signaled_in_script(snap)) is not None:\n",
        new="    if False and (signaled := signaled_in_script(snap)) is not None:\n",
        what="the script's 0 taken as the trainer's",
        tests=(
            "tests/test_root_cause_rules.py::test_a_trainer_ended_by_a_signal_inside_a_script_that_exits_0_is_never_finished",
            "tests/test_steps_local.py::test_a_trainer_killed_inside_a_wrapper_script_that_exits_0_is_crashed_killed_not_finished",
        ),
    ),
    Mutant(
        name="marked-trainer",
        mechanism="never two trainers: launch refuses beside a process carrying the target's marker",
        file="relaunch/host/launch.sh",
        old="if [ ${#marked[@]} -gt 0 ]; then\n",
        new="if false; then\n",
        what="exit-18 (marker) refusal removed",
        tests=("tests/test_launch_guards.py::test_launch_refuses_beside_a_live_process_carrying_the_targets_marker[target]",),
    ),
    Mutant(
        name="unknown-never-stops",
        mechanism="an unrecorded live trainer is unmanaged, never `unknown` (whose remedy stops and launches)",
        file="relaunch/judging/diagnosis.py",
        old="    if snap.strays and not snap.pid_alive:\n",
        new="    if False:\n",
        what="strays no longer make `unmanaged`",
        tests=("tests/test_two_trainers.py::test_a_trainer_whose_state_folder_was_removed_is_found_by_its_marker_and_never_stopped",),
    ),
    Mutant(
        name="gang-unreachable-never-stops",
        mechanism="a gang node that cannot be reached is unknown: nothing stopped on the others",
        file="relaunch/deciding/gang.py",
        old="    gone = [n for n in lost if n.diagnosis is None]\n",
        new="    gone = []\n",
        what="unreachable node no longer escalates",
        tests=("tests/test_gang_judging.py::test_a_node_that_cannot_be_reached_is_unknown_and_never_a_reason_to_stop_the_others",),
    ),
    # ---- issue 36: the never-harm gaps the issue named -------------------------------------------------------------
    Mutant(
        name="gang-one-checkpoint",
        mechanism="every gang node resumes from node 0's checkpoint",
        file="flows/recover.py",
        old="    return each(launch, launching, run.attempt, run.before_step, run.refuse, run.run_id, choice)\n",
        new="    return each(launch, launching, run.attempt, run.before_step, run.refuse, run.run_id, None)\n",
        what="each node chooses its own",
        tests=(f"{GAPS}::test_every_node_of_a_gang_resumes_from_the_checkpoint_node_0_lists_though_node_1_holds_a_newer_save",),
    ),
    Mutant(
        name="pid-reuse",
        mechanism="a recorded PID is alive only with its recorded start time",
        file="relaunch/host/lib.sh",
        old='starttime_into t "$1" && [ "$t" = "$2" ]; }',
        new='starttime_into t "$1"; }',
        what="alive() ignores the start time",
        tests=(f"{GAPS}::test_a_recorded_pid_that_another_process_holds_after_a_reboot_is_dead_never_alive_and_never_signalled",),
    ),
    Mutant(
        name="state-folder-prefix",
        mechanism="a state folder that prefixes another's (`llama`, `llama-70b`) never matches its marker",
        file="relaunch/host/lib.sh",
        old='-e "^RELAUNCH_TARGET=$(bre_quote "$state")\\$"',
        new='-e "^RELAUNCH_TARGET=$(bre_quote "$state")"',
        what="RELAUNCH_TARGET match not anchored",
        tests=(f"{GAPS}::test_a_stop_or_poll_of_llama_never_touches_the_trainer_of_llama_70b_whose_folders_it_prefixes",),
    ),
    Mutant(
        name="partition-cut-off",
        mechanism="fleet: nothing recovered on a host of an unreachable incident",
        file="flows/fleet.py",
        old="    held = set(cut) | {",
        new="    held = set() | {",
        what="cut-off hosts not held",
        tests=(f"{GAPS}::test_hosts_cut_off_at_once_while_one_link_flaps_are_one_partition_and_nothing_is_touched_on_them",),
    ),
    Mutant(
        name="tmux-server-exempt",
        mechanism="a stop never ends the tmux server, marker or not",
        file="relaunch/host/stop.sh",
        old='[ -n "$server" ] && skip[$server]=1\n',
        new='[ -n "$server" ] && true\n',
        what="tmux server no longer skipped",
        tests=(f"{GAPS}::test_a_stop_never_ends_the_tmux_server_though_it_was_started_from_the_trainers_environment",),
    ),
    Mutant(
        name="kmsg-fails-in-ci",
        mechanism="a test that cannot run here fails under CI=true instead of skipping",
        file="relaunch/testing/sshd.py",
        old="    if in_ci():\n        pytest.fail(",
        new="    if False:\n        pytest.fail(",
        what="cannot_run_here always skips",
        tests=(f"{GAPS}::test_the_rows_that_write_the_kernel_log_fail_under_ci_where_dev_kmsg_is_not_writable_and_skip_elsewhere",),
    ),
    # ---- issue 35: root causes -------------------------------------------------------------------------------------
    Mutant(
        name="own-error-over-peer",
        mechanism="a rank's own error over a peer's lost collective",
        file="relaunch/judging/gone.py",
        old="    return _own_rank_failure(lines, first) or first\n",
        new="    return first\n",
        what="first failure always wins",
        tests=(f"{ROOTS}::test_a_rank_that_raised_its_own_error_is_the_cause_not_the_peer_that_lost_it",),
    ),
    Mutant(
        name="abort-is-the-error",
        mechanism="an abort after a distributed error is that error",
        file="relaunch/judging/gone.py",
        old="if signal in NATIVE_SIGNALS and not (signal == 6 and distributed) and",
        new="if signal in NATIVE_SIGNALS and",
        what="SIGABRT in torchrun's table is a rank's own crash",
        # The watchdog's abort: no C++ terminate in the log, only torchrun's `-6 (SIGABRT)` after the ranks' timeouts.
        tests=(
            "tests/test_diagnose_fixtures.py::test_diagnose_names_the_verdict_cause_and_evidence_of_each_captured_failure[gpu/nccl_watchdog_timeout.log --exit-code 1]",
        ),
    ),
    Mutant(
        name="terminate-words-own",
        mechanism="an abort after a distributed error is that error, wherever the peers' lines landed",
        file="relaunch/judging/gone.py",
        old="        at, found = next(((i, f) for i, f in terminated if f and CXX_TERMINATE.match(f[2][0])), (len(lines), None))\n",
        new="        at, found = len(lines), None\n",
        what="C++ terminate's unprefixed words not read",
        tests=(f"{ROOTS}::test_the_abort_is_the_distributed_error_wherever_the_peer_that_lost_it_wrote_its_lines",),
    ),
    Mutant(
        name="what-line-below",
        mechanism="C++ terminate's message is its `what():` line, other processes' lines between them",
        file="relaunch/judging/gone.py",
        old='        if line.lstrip().startswith("what():"):\n            return line.strip()\n        if CXX_TERMINATE.match(line):\n',
        new='        if line.lstrip().startswith("what():"):\n            return line.strip()\n        if True:\n',
        what="what(): only on the very next line",
        tests=(f"{ROOTS}::test_the_abort_is_the_distributed_error_wherever_the_peer_that_lost_it_wrote_its_lines",),
    ),
    Mutant(
        name="outside-signal-killed",
        mechanism="exit 129/130/143 is `killed`, whatever was printed",
        file="relaunch/judging/gone.py",
        old="    if code is not None and code - 128 in OUTSIDE_SIGNALS and not oom_kernel:\n",
        new="    if False:\n",
        what="outside-signal rule removed",
        tests=(f"{ROOTS}::test_a_death_by_an_outside_signal_is_killed_whatever_traceback_it_printed",),
    ),
    Mutant(
        name="saved-log-oom",
        mechanism="a saved log without a PID: an OOM kill named like the trainer is host_oom_killed",
        file="relaunch/judging/gone.py",
        old="        oom_kernel = _unnamed_oom_lines(snap)\n",
        new="        oom_kernel = []\n",
        what="kills by name not read",
        tests=(f"{ROOTS}::test_a_kill_of_any_process_named_like_the_trainer_is_the_saved_logs_oom",),
    ),
    # ---- issue 48: a wrapper's exit 0 over a crash, a checkpoint the code refuses, a short write, a barrier missed ----
    Mutant(
        name="wrapper-zero-uncaught",
        mechanism="an exit 0 over an uncaught exception that ends the log is a wrapper's: a crash, never finished",
        file="relaunch/judging/gone.py",
        old="    if code == 0 and (uncaught := uncaught_at_end(snap.log_tail)) is not None:\n",
        new="    if False and (uncaught := uncaught_at_end(snap.log_tail)) is not None:\n",
        what="the wrapper's 0 taken as the trainer's",
        tests=(
            "tests/test_misread_faces.py::test_an_exit_0_over_an_uncaught_exception_at_the_logs_end_is_a_crash_and_the_0_is_named_the_wrappers",
            "tests/test_misread_faces.py::test_any_real_traceback_ending_the_log_under_a_wrappers_0_reads_as_its_own_cause",
            "tests/test_misread_faces.py::test_a_launched_wrapper_script_whose_trainer_raised_exits_0_and_is_read_as_the_trainers_error[script-echo]",
        ),
    ),
    Mutant(
        name="thread-traceback-not-fatal",
        mechanism="a thread's or child process's traceback at a run's end is no uncaught exception of the trainer",
        file="relaunch/judging/wrappers.py",
        old="|Exception in thread .+:$|Process .+:$)",
        new=")",
        what="a thread's traceback read as the trainer's",
        tests=(
            "tests/test_misread_faces.py::test_a_traceback_of_a_thread_or_child_process_at_a_runs_end_is_no_uncaught_exception_of_the_trainer",
        ),
    ),
    Mutant(
        name="pickled-name-moved",
        mechanism="an unpickler that cannot find a module or class the checkpoint names: checkpoint_incompatible, never skipped",
        file="relaunch/judging/signatures.py",
        old=", (Cause.CHECKPOINT_INCOMPATIBLE, PICKLED_NAME_GONE)]",
        new="]",
        what="a moved class read as a broken checkpoint",
        tests=(
            "tests/test_misread_faces.py::test_a_pickled_class_a_refactor_moved_is_an_incompatible_checkpoint_restored_by_code_never_skipped",
            "tests/test_misread_faces.py::test_any_module_or_class_the_unpickler_cannot_find_is_incompatible_on_any_rank",
        ),
    ),
    Mutant(
        name="short-write-disk-full",
        mechanism="numpy's short write (`N requested and M written`) is a full disk",
        file="relaunch/judging/signatures.py",
        old='            rf"|{SHORT_WRITE.pattern}"\n',
        new="",
        what="a short write read as a plain error",
        tests=(
            "tests/test_misread_faces.py::test_numpys_short_write_is_a_full_disk_and_the_polls_free_space_confirms_it",
            "tests/test_misread_faces.py::test_a_short_write_of_any_size_on_any_rank_is_a_full_disk",
        ),
    ),
    Mutant(
        name="full-disk-confirmed",
        mechanism="a disk the trainer said filled and the poll finds really full is still full: no relaunch onto it",
        file="relaunch/judging/gone.py",
        old="(disk_full_evidence(snap, min_free_disk_gb) or full_disk_evidence(snap))",
        new="disk_full_evidence(snap, min_free_disk_gb)",
        what="the poll's full disk not read without a minimum",
        tests=("tests/test_misread_faces.py::test_numpys_short_write_is_a_full_disk_and_the_polls_free_space_confirms_it",),
    ),
    Mutant(
        name="barrier-is-distributed",
        mechanism="a monitored barrier that timed out is a distributed failure, not rank 0's own error",
        file="relaunch/judging/signatures.py",
        old='            # A monitored barrier some rank never reached (cpu/monitored_barrier_*.log): the failure is that rank\'s.\n            rf"|{BARRIER_MISSED}"\n',
        new="",
        what="the barrier's timeout read as an error of the rank that waited",
        tests=(
            "tests/test_misread_faces.py::test_a_monitored_barrier_that_timed_out_is_a_distributed_failure_naming_the_ranks_that_never_arrived",
        ),
    ),
    Mutant(
        name="barrier-names-absent",
        mechanism="the ranks that never reached a monitored barrier are named as its cause",
        file="relaunch/judging/gone.py",
        old="            absent = barrier_absentees(lines)\n",
        new="            absent = None\n",
        what="the late ranks not named",
        tests=(
            "tests/test_misread_faces.py::test_a_monitored_barrier_that_timed_out_is_a_distributed_failure_naming_the_ranks_that_never_arrived",
            "tests/test_misread_faces.py::test_the_ranks_named_are_those_that_never_arrived_whatever_their_numbers_and_the_timeout",
        ),
    ),
    # ---- issue 50: a person's stop is never undone by the watch; a death is never lost to an API that is down -------
    Mutant(
        name="stop-recorded-first",
        mechanism="a person's stop is on record before its first signal",
        file="relaunch/host/stop.sh",
        old='if [ "$mode" = deliberate ] && { [ -n "$had_state" ] || [ ${#order[@]} -gt 0 ]; }; then\n',
        new="if false; then\n",
        what="no record before the SIGTERM",
        tests=(
            f"{HANDOVER}::test_a_persons_stop_is_on_record_before_its_trainer_hears_the_first_signal",
            f"{HANDOVER}::test_a_persons_stop_under_the_running_watch_is_never_undone_however_often_it_is_made[quiet]",
        ),
    ),
    Mutant(
        name="stop-read-last",
        mechanism="the watch's look reads a person's stop after the trainer's liveness and exit record",
        file="relaunch/host/pulse.sh",
        old='alive "$pid" "$pstart" && ! dying "$pid" && pid_up=1\nalive "$spid" "$sstart" && sup_up=1\n'
        'slurp exit_code "$run/exit_code"\n[ -e "$state/stopped" ] && echo "stopped 1"\n',
        new='[ -e "$state/stopped" ] && echo "stopped 1"\nalive "$pid" "$pstart" && ! dying "$pid" && pid_up=1\n'
        'alive "$spid" "$sstart" && sup_up=1\nslurp exit_code "$run/exit_code"\n',
        what="the stop read first (as before)",
        tests=(f"{HANDOVER}::test_a_look_that_reads_a_death_reads_a_stop_recorded_while_it_looked",),
    ),
    Mutant(
        name="watch-leaves-stopped",
        mechanism="a recovery the watch started leaves a target stopped on purpose stopped",
        file="flows/recover.py",
        old="    if verdict is Verdict.STOPPED and handed_over:\n",
        new="    if False:\n",
        what="a handed-over stopped target goes to the playbook",
        tests=(f"{HANDOVER}::test_a_recovery_the_watch_starts_leaves_a_target_stopped_on_purpose_stopped",),
    ),
    Mutant(
        name="handover-retried",
        mechanism="a handover the Prefect API could not take is retried with backoff until it answers",
        file="flows/watch.py",
        old="            if w.owed is not None and w.recovery is None and now >= w.owed.due:\n",
        new="            if False:\n",
        what="an owed handover never tried again",
        tests=(
            f"{HANDOVER}::test_a_recovery_the_api_failed_is_tried_again_until_it_runs_and_the_death_is_handed_over_once",
            f"{HANDOVER}::test_a_death_while_the_prefect_api_is_down_is_recovered_once_it_answers_again_and_said_once",
        ),
    ),
    # ---- issue 50: work, a wait, a pause or a hang, from the progress record kept on the host -----------------------
    Mutant(
        name="pause-is-a-persons",
        mechanism="a process of the tree stopped by a signal (T) is paused, never a stall",
        file="relaunch/judging/progress.py",
        old='    held = [p for p in latest.processes if p.state == "T"]\n',
        new="    held = []\n",
        what="state T not read",
        tests=(
            f"{RULES}::test_a_tree_with_a_process_stopped_by_a_signal_is_paused_whatever_else_it_does",
            f"{RECORD}::test_a_trainer_a_person_paused_with_sigstop_is_called_paused_and_left_alive",
        ),
    ),
    Mutant(
        name="rising-counter-is-work",
        mechanism="CPU, I/O, the log, a process born or ended or a busy GPU rising anywhere in the tree is work",
        file="relaunch/judging/progress.py",
        old="    if rise is None or record.now - rise.at_epoch >= record.window_seconds:\n        return None\n    return Reading(\n        motion=Motion.WORKING,",
        new="    if True:\n        return None\n    return Reading(\n        motion=Motion.WORKING,",
        what="the working rule never speaks",
        tests=(
            f"{RULES}::test_a_tree_whose_counters_rise_within_the_window_is_never_called_stalled",
            f"{RECORD}::test_a_trainer_working_inside_one_long_c_call_or_through_a_busy_child_is_never_called_stalled[quiet-pbkdf2]",
        ),
    ),
    Mutant(
        name="cpu-of-every-process",
        mechanism="the CPU and I/O of every process of the tree count, a non-Python child's too",
        file="relaunch/judging/progress.py",
        old="    before = {p.pid: p for p in a.processes}\n    after = {p.pid: p for p in b.processes}\n",
        new="    before = {p.pid: p for p in a.processes if p.comm.startswith('python')}\n    after = {p.pid: p for p in b.processes if p.comm.startswith('python')}\n",
        what="only python processes read",
        tests=(f"{RECORD}::test_a_trainer_working_inside_one_long_c_call_or_through_a_busy_child_is_never_called_stalled[quiet-child]",),
    ),
    Mutant(
        name="blocked-names-holder",
        mechanism="a flat tree waiting on a lock held outside it is stalled/blocked, escalated naming the holder",
        file="relaunch/judging/progress.py",
        old="    if waits:\n        lines = tuple(",
        new="    if False:\n        lines = tuple(",
        what="lock waits not read",
        tests=(
            f"{RULES}::test_a_flat_tree_waiting_on_a_lock_held_outside_it_is_blocked_naming_the_holder_and_inside_it_a_hang",
            f"{RECORD}::test_a_trainer_waiting_on_a_lock_another_live_job_holds_is_escalated_naming_the_holder_never_stopped[fcntl]",
        ),
    ),
    Mutant(
        name="record-spans-the-window",
        mechanism="a record shorter than the window is watched, never judged on one look",
        file="relaunch/judging/progress.py",
        old="    if record.spans >= record.window_seconds:\n        return None\n    return Reading(\n        motion=Motion.WATCHING,",
        new="    if True:\n        return None\n    return Reading(\n        motion=Motion.WATCHING,",
        what="no watching: judged on a short record",
        tests=(f"{RULES}::test_a_record_shorter_than_the_window_is_watched_never_judged",),
    ),
    Mutant(
        name="gpu-spin-asks-stacks",
        mechanism="a busy GPU over a still host asks the stacks before anything is said",
        file="relaunch/judging/progress.py",
        old="    if len(read) < 2 or min(read) < GPU_BUSY_PERCENT:\n",
        new="    if True:\n",
        what="the GPU-spin rule never speaks",
        tests=(
            f"{RULES}::test_a_busy_gpu_over_a_still_host_asks_the_stacks_and_an_io_or_log_rise_is_work",
            f"{RULES}::test_the_captured_h100_spinning_kernel_is_a_gpu_spin_whose_stack_waits_in_synchronize",
        ),
    ),
    Mutant(
        name="record-judges-first-look",
        mechanism="a hang that began long before the check is judged on its first look, from the record",
        file="relaunch/judging/alive.py",
        old="    if not snap.progress:\n        return None\n",
        new="    if True:\n        return None\n",
        what="the record is not read",
        tests=(f"{RECORD}::test_a_hang_that_began_long_before_the_check_looked_is_judged_on_its_first_look_from_the_record",),
    ),
    Mutant(
        name="watch-finds-hangs",
        mechanism="the watch hands a live run whose record stood still to recovery by itself",
        file="relaunch/judging/watching.py",
        old="        return Seen.HUNG if reading is not None and reading.motion in HANDED_AS_HUNG else Seen.RUNNING\n",
        new="        return Seen.RUNNING\n",
        what="a live run is always running to the watch",
        tests=(f"{RECORD}::test_the_watch_hands_a_hang_to_recovery_by_itself_within_the_window_and_the_relaunched_run_steps",),
    ),
    Mutant(
        name="stop-continues-paused",
        mechanism="a stop of a paused trainer continues it after its SIGTERM, so it saves within the grace",
        file="relaunch/host/stop.sh",
        old=' && signalled+=("$p") && kill -CONT "$p" 2> /dev/null; done\n',
        new=' && signalled+=("$p"); done\n',
        what="no SIGCONT after the SIGTERM",
        tests=(f"{RECORD}::test_a_stop_of_a_paused_trainer_continues_it_so_it_saves_on_its_sigterm_within_the_grace",),
    ),
    Mutant(
        name="launch-is-no-death",
        mechanism="a look at a launch whose supervisor has not recorded a PID yet is no death",
        file="relaunch/judging/watching.py",
        old="    if pulse.pid is None and pulse.exit_code is None and launching(pulse):\n",
        new="    if False:\n",
        what="a launch under way read as a death",
        tests=(
            f"{HANDOVER}::test_a_look_at_a_launch_whose_supervisor_has_not_recorded_a_pid_yet_is_no_death_until_a_launch_would_have_failed",
        ),
    ),
    # ---- issue 44: which checkpoint is the newest complete one, by the run's own trajectory and by content ------------
    Mutant(
        name="nothing-usable-escalates",
        mechanism="a checkpoint folder with nothing usable escalates",
        file="relaunch/deciding/checkpoints.py",
        old="    if any(s.reason not in HARMLESS for s in skipped):\n",
        new="    if False:\n",
        what="nothing usable never escalates",
        tests=(f"{CHOICE}::test_a_folder_of_names_relaunch_cannot_use_escalates_and_one_of_only_unfinished_saves_starts_from_scratch",),
    ),
    Mutant(
        name="epoch-counts-first",
        mechanism="a name's other counters (epoch, stage) count before its step",
        file="relaunch/deciding/checkpoint_names.py",
        old='    return (m["series"], (*counters(m["series"]), int(m["number"], 10))) if m else None\n',
        new='    return (m["series"], (int(m["number"], 10),)) if m else None\n',
        what="the step alone orders",
        tests=(
            f"{TRAJ}::test_a_loop_whose_step_starts_again_each_epoch_resumes_from_the_last_epochs_newest_save",
            f"{TRAJ}::test_a_later_stage_is_newer_than_an_earlier_stages_higher_step",
        ),
    ),
    Mutant(
        name="own-saves-followed",
        mechanism="the saves the current run wrote since it began are followed by write time",
        file="relaunch/deciding/checkpoint_trajectory.py",
        old="    own = [c for c in usable if ev.started is not None and c.written >= ev.started]\n",
        new="    own = []\n",
        what="the run's own saves not told apart",
        tests=(
            f"{TRAJ}::test_a_second_stage_counting_from_zero_in_the_same_names_resumes_from_its_own_newest_save",
            f"{TRAJ}::test_within_one_run_a_counter_that_started_again_is_followed_by_write_time",
        ),
    ),
    Mutant(
        name="resumed-from-taken",
        mechanism="a run that saved nothing since it began resumes from the checkpoint it resumed from",
        file="relaunch/deciding/checkpoint_trajectory.py",
        old="    start = next((c for c in usable if ev.resumed and ev.resumed in (c.name, c.pick)), None)\n",
        new="    start = None\n",
        what="the resumed-from checkpoint unknown",
        tests=(f"{TRAJ}::test_a_run_sent_back_to_the_first_stages_end_that_saved_nothing_yet_resumes_from_there_again",),
    ),
    Mutant(
        name="rollback-abandoned",
        mechanism="a save above the resumed-from checkpoint written before the run began is an abandoned branch",
        file="relaunch/deciding/checkpoint_trajectory.py",
        old="series_key(series) != start[0] or order <= start[1]:",
        new="series_key(series) != start[0] or True:",
        what="no branch is abandoned",
        tests=(f"{TRAJ}::test_a_persons_rollback_is_followed_and_the_abandoned_branchs_higher_step_never_wins[resumed_by_relaunch]",),
    ),
    Mutant(
        name="trajectory-escalates",
        mechanism="where write order and step order disagree with nothing to settle it, a person is asked",
        file="relaunch/deciding/checkpoint_trajectory.py",
        old="    if newest is top or newest.written <= top.written + CLOCK_SLACK_SECONDS:\n",
        new="    if True:\n",
        what="the higher step taken in silence",
        tests=(f"{TRAJ}::test_where_write_order_and_step_order_disagree_and_nothing_says_which_trajectory_a_person_is_asked",),
    ),
    Mutant(
        name="adopted-command-names-start",
        mechanism="an adopted run's command line names the checkpoint it resumed from",
        file="relaunch/deciding/checkpoint_trajectory.py",
        old="        if len(named) == 1:\n",
        new="        if False:\n",
        what="the adopted command line not read",
        tests=(
            f"{TRAJ}::test_a_persons_rollback_is_followed_and_the_abandoned_branchs_higher_step_never_wins[adopted_with_its_command_line]",
        ),
    ),
    Mutant(
        name="listing-resumed-from",
        mechanism="the listing says what the current run resumed from",
        file="relaunch/host/list_checkpoints.sh",
        old="    printf 'R resumed_from %s\\0' \"$value\"\n",
        new="    :\n",
        what="no resumed_from record",
        tests=(
            f"{TRAJ}::test_the_listing_says_what_the_current_run_resumed_from_and_an_adopted_runs_command_line",
            f"{TRAJ}::test_a_persons_rollback_is_followed_and_the_abandoned_branchs_higher_step_never_wins[resumed_by_relaunch]",
        ),
    ),
    Mutant(
        name="listing-adopted-command",
        mechanism="the listing sends an adopted run's command line",
        file="relaunch/host/list_checkpoints.sh",
        old='    [ -n "$value" ] && printf \'R command %s\\0\' "${value:0:4096}"\n',
        new="    :\n",
        what="no command record",
        tests=(
            f"{TRAJ}::test_a_persons_rollback_is_followed_and_the_abandoned_branchs_higher_step_never_wins[adopted_with_its_command_line]",
        ),
    ),
    Mutant(
        name="npy-size",
        mechanism="an .npy file is whole by its header's size",
        file="relaunch/deciding/checkpoint_formats.py",
        old='        return Content(state="cut", format=NPY, detail=f"{how}: {p.size} bytes where its header describes {want}")',
        new='        return Content(state="complete", format=NPY, detail=f"{how}: {p.size} bytes where its header describes {want}")',
        what="a cut .npy read whole",
        tests=(f"{TRAJ}::test_each_files_format_says_whether_it_is_whole_wherever_it_is_cut",),
    ),
    Mutant(
        name="pickle-stop",
        mechanism="a pickle is whole by its STOP byte",
        file="relaunch/deciding/checkpoint_formats.py",
        old='    if not p.tail.endswith(b"."):\n',
        new="    if False:\n",
        what="no STOP byte check",
        tests=(f"{TRAJ}::test_each_files_format_says_whether_it_is_whole_wherever_it_is_cut",),
    ),
    Mutant(
        name="json-parses",
        mechanism="a JSON file is whole when it parses",
        file="relaunch/deciding/checkpoint_formats.py",
        old='        return Content(state="cut", format="JSON", detail="cut short: it does not parse")',
        new='        return Content(state="complete", format="JSON", detail="cut short: it does not parse")',
        what="a cut JSON read whole",
        tests=(f"{TRAJ}::test_each_files_format_says_whether_it_is_whole_wherever_it_is_cut",),
    ),
    Mutant(
        name="folder-file-set",
        mechanism="a folder of no known layout holds every file its series' previous save held",
        file="relaunch/deciding/checkpoint_folders.py",
        old="    if missing := theirs - mine:\n",
        new="    if missing := None:\n",
        what="a missing file not seen",
        tests=(f"{TRAJ}::test_a_folder_still_being_written_is_never_taken_whatever_was_written_after_it[file_not_begun]",),
    ),
    Mutant(
        name="folder-sizes",
        mechanism="a folder's raw files are no shorter than in the previous save",
        file="relaunch/deciding/checkpoint_folders.py",
        old="        if was is not None and size < was:\n",
        new="        if False:\n",
        what="a shorter file not seen",
        tests=(f"{TRAJ}::test_a_folder_still_being_written_is_never_taken_whatever_was_written_after_it[raw_file_shorter_than_before]",),
    ),
    Mutant(
        name="folder-whole-first",
        mechanism="a folder of whole files by their formats is complete",
        file="relaunch/deciding/checkpoint_folders.py",
        old='        return Content(state="complete", format="folder", detail=detail)\n',
        new='        return Content(state="unknown", format="folder", detail=detail)\n',
        what="a whole folder not taken",
        tests=(f"{TRAJ}::test_the_only_checkpoint_a_folder_of_whole_files_finished_just_before_a_sigkill_is_taken",),
    ),
    Mutant(
        name="folder-whole-by-previous",
        mechanism="a folder like its series' previous whole save is complete",
        file="relaunch/deciding/checkpoint_folders.py",
        old='    return Content(\n        state="complete",\n        format="folder",',
        new='    return Content(\n        state="unknown",\n        format="folder",',
        what="a folder like the last whole save not taken",
        tests=(f"{TRAJ}::test_a_complete_folder_of_no_known_layout_renamed_in_just_before_a_sigkill_is_taken",),
    ),
    # ---- issue 45: the cause first, and no repeat of what no step can fix ------------------------------------------
    Mutant(
        name="refused-command-not-repeated",
        mechanism="a command the program refuses (exit 2 before any step) escalates after one plain relaunch",
        file="relaunch/deciding/playbook.py",
        old="    if diagnosis.no_step_fixes:\n        return _no_step_fixes",
        new="    if False:\n        return _no_step_fixes",
        what="no-step-fixes never read",
        tests=(f"{CAUSE}::test_a_launch_command_naming_a_missing_script_escalates_after_one_plain_relaunch_with_pythons_line_first",),
    ),
    Mutant(
        name="refusal-words-compared",
        mechanism="a refused command whose words changed gets one more relaunch",
        file="relaunch/deciding/playbook.py",
        old=" and earlier[-1].cause_line == line:",
        new=":",
        what="any repeat escalates",
        tests=(f"{CAUSE}::test_a_refused_command_whose_words_change_is_relaunched_again_not_escalated",),
    ),
    Mutant(
        name="force-runs-the-procedure",
        mechanism="recover --force runs the full procedure whatever the check found",
        file="relaunch/deciding/playbook.py",
        old="    if force and not earlier and diagnosis.verdict not in",
        new="    if force and action is Action.NONE and diagnosis.verdict not in",
        what="force only on a fine run",
        tests=(f"{CAUSE}::test_a_forced_recovery_runs_the_full_procedure_on_a_crashed_run_and_says_so",),
    ),
    Mutant(
        name="program-words-first",
        mechanism="the program's own last line leads a crash with no traceback",
        file="relaunch/judging/gone.py",
        old="said = own[-1:] + own[:-1]",
        new="said = own",
        what="argparse's usage line first",
        tests=(f"{CAUSE}::test_an_argparse_usage_error_escalates_after_one_relaunch_naming_its_error_line",),
    ),
    Mutant(
        name="usage-exit-only",
        mechanism="only exit 2 is a refused command",
        file="relaunch/judging/gone.py",
        old="if code != USAGE_EXIT or",
        new="if",
        what="any exit code a refusal",
        tests=(f"{CAUSE}::test_a_trainer_that_exits_1_without_a_traceback_still_gets_the_full_procedure",),
    ),
    Mutant(
        name="refusal-before-any-step",
        mechanism="an exit 2 after steps is no refused command",
        file="relaunch/judging/gone.py",
        old="if code != USAGE_EXIT or metrics.steps_seen or not said:",
        new="if code != USAGE_EXIT or not said:",
        what="steps ignored",
        tests=(f"{CAUSE}::test_a_trainer_that_exits_2_after_stepping_is_not_taken_for_a_refused_command",),
    ),
    Mutant(
        name="trainer-words-before-banners",
        mechanism="the trainer's words come before relaunch's banners in the evidence",
        file="relaunch/judging/gone.py",
        old="evidence=[*said, *(line for line in tail if line not in own), exit_text]",
        new="evidence=[*tail, exit_text]",
        what="the log's order",
        tests=(f"{CAUSE}::test_a_trainer_that_exits_1_without_a_traceback_still_gets_the_full_procedure",),
    ),
    Mutant(
        name="skipped-pth-no-cause",
        mechanism="a .pth line Python reported and skipped is not the cause",
        file="relaunch/judging/gone.py",
        old="        if PTH_ERROR.match(stripped):",
        new="        if False:",
        what=".pth lines read as the cause",
        tests=(f"{CAUSE}::test_a_pth_line_python_reported_and_skipped_is_not_the_cause_the_error_that_ended_the_process_is",),
    ),
    Mutant(
        name="banner-never-first",
        mechanism="relaunch's own banner is never the cause line",
        file="relaunch/judging/findings.py",
        old="(\\[relaunch\\]|exit code",
        new="(exit code",
        what="banners count as the cause",
        tests=(f"{CAUSE}::test_a_launch_command_naming_a_missing_script_escalates_after_one_plain_relaunch_with_pythons_line_first",),
    ),
    Mutant(
        name="advice-said-once",
        mechanism="the failed state's message carries what to do once",
        file="flows/outcome.py",
        old='.split(" | what to do:", 1)[0]',
        new="",
        what="advice twice",
        tests=(f"{CAUSE}::test_a_launch_command_naming_a_missing_script_escalates_after_one_plain_relaunch_with_pythons_line_first",),
    ),
    Mutant(
        name="headline-ends-with-cause",
        mechanism="an escalation's headline ends with the cause line",
        file="relaunch/records/report.py",
        old='said = cause_line(last.evidence) if outcome == "escalated" and not self.refusal else ""',
        new='said = ""',
        what="no cause in the headline",
        tests=(f"{CAUSE}::test_a_launch_command_naming_a_missing_script_escalates_after_one_plain_relaunch_with_pythons_line_first",),
    ),
    # ---- issue 44: which process is the target's trainer, and whose files ---------------------------------------
    Mutant(
        name="only-writers-block",
        mechanism="only a file open for writing under checkpoint_dir blocks a launch (a backup reading it does not)",
        file="relaunch/host/lib.sh",
        old="(( (8#$flags & 3) != 0 )); } || continue\n    last=$p",
        new="(( (8#$flags & 2) != 0 )); } || continue\n    last=$p",
        what="write-only opens not counted",
        tests=(
            f"{GUARDS}::test_launch_refuses_while_another_process_has_checkpoint_files_open",
            f"{GUARDS}::test_a_process_holding_a_checkpoint_open_blocks_a_launch_only_when_it_writes_there",
        ),
    ),
    Mutant(
        name="launch-counts-writers",
        mechanism="launch.sh counts only writers of checkpoint_dir",
        file="relaunch/host/launch.sh",
        old='pids_writing_files_under "$checkpoint_dir" | sort -un | others',
        new='pids_with_files_under "$checkpoint_dir" | sort -un | others',
        what="readers block a launch",
        tests=(f"{GUARDS}::test_a_process_holding_a_checkpoint_open_blocks_a_launch_only_when_it_writes_there",),
    ),
    Mutant(
        name="idle-shell-new-window",
        mechanism="a session holding only a person's idle shells gets the run in a new window",
        file="relaunch/host/launch.sh",
        old="  window=1\nfi",
        new="  exit 11\nfi",
        what="refused beside an idle shell",
        tests=(f"{GUARDS}::test_a_session_holding_only_a_persons_idle_shell_gets_the_run_in_a_new_window_and_the_shell_is_left_alone",),
    ),
    Mutant(
        name="new-window-pane-recorded",
        mechanism="the new window's pane is the run's, recorded",
        file="relaunch/host/launch.sh",
        old='[ "$window" = 1 ] || read -r pane_pid pane_id',
        new="read -r pane_pid pane_id",
        what="the person's pane recorded",
        tests=(f"{GUARDS}::test_a_session_holding_only_a_persons_idle_shell_gets_the_run_in_a_new_window_and_the_shell_is_left_alone",),
    ),
    Mutant(
        name="open-log-found",
        mechanism="a trainer in another pane is found by the file it writes under log_dir",
        file="relaunch/host/panes.sh",
        old='  [ -n "${2-}" ] || return 1',
        new="  return 1",
        what="no log found by open writes",
        tests=("tests/test_adopt.py::test_a_trainer_restarted_by_hand_in_a_new_window_beside_a_persons_idle_shell_is_adopted",),
    ),
    Mutant(
        name="renamed-trainer-refused",
        mechanism="a renamed Python trainer writing log_dir or checkpoint_dir from repo_dir blocks a launch",
        file="relaunch/host/launch.sh",
        old='pids_python_writing_in "$1" "$venv" "$checkpoint_dir" "${log%/*}"; }',
        new="}",
        what="renamed trainers unseen at launch",
        tests=(f"{GUARDS}::test_a_renamed_python_trainer_writing_the_log_dir_from_repo_dir_is_found_and_blocks_a_second_one",),
    ),
    Mutant(
        name="renamed-trainer-stray",
        mechanism="the health poll names a renamed trainer as a stray",
        file="relaunch/host/snapshot.sh",
        old='&& strays+=("$p writer")',
        new="&& :",
        what="no writer stray",
        tests=(f"{GUARDS}::test_a_renamed_python_trainer_writing_the_log_dir_from_repo_dir_is_found_and_blocks_a_second_one",),
    ),
    Mutant(
        name="renamed-trainer-in-repo",
        mechanism="a renamed trainer counts only with its working folder in repo_dir",
        file="relaunch/host/lib.sh",
        old='[[ $wd == "$r" || $wd == "$r"/* || $wd == "$repo" || $wd == "$repo"/* ]] || continue',
        new=":",
        what="any folder counts",
        tests=(f"{GUARDS}::test_a_renamed_python_trainer_writing_the_log_dir_from_repo_dir_is_found_and_blocks_a_second_one",),
    ),
    Mutant(
        name="shared-repo-other-target",
        mechanism="another target's trainer in a shared repo is not this target's",
        file="relaunch/host/launch.sh",
        old='| others | drop_other_targets "$state" "${log%/*}")',
        new="| others)",
        what="another target's trainer blocks",
        tests=(f"{GUARDS}::test_another_targets_trainer_running_the_same_program_in_a_shared_repo_is_not_this_targets",),
    ),
    Mutant(
        name="renamed-target-still-ours",
        mechanism="a trainer logging into this target's log_dir under another marker is ours (a renamed target)",
        file="relaunch/host/lib.sh",
        old='[ -n "$lp" ] && [ "$lp" != "$logdir" ] && continue',
        new='[ -n "$lp" ] && continue',
        what="a renamed target's trainer dropped",
        tests=("tests/test_two_trainers.py::test_a_target_renamed_between_nights_finds_the_trainer_of_its_old_name",),
    ),
)


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    status: str  # killed, SURVIVED, NOT APPLIED, TIMEOUT, SKIPPED, ERROR; baseline: passed, FAILED, ...
    seconds: float
    red: str  # the first test that went red, or what went wrong
    tail: str = ""  # the end of pytest's output, shown for anything unexpected


def tracked_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name]


@contextmanager
def copy_of_tree(root: Path) -> Iterator[Path]:
    """A fresh copy of the tracked tree (symbolic links kept as links) with the package links pyproject implies."""
    folder = Path(tempfile.mkdtemp(prefix="relaunch-mutant-"))
    try:
        for name in tracked_files(root):
            source, dest = root / name, folder / name
            if not source.exists() and not source.is_symlink():
                continue  # deleted in the work tree, not yet from the index: the copy is of what is there
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest, follow_symlinks=False)
        for link, target in PACKAGE_LINKS.items():
            (folder / link).symlink_to(target)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def apply(copy: Path, mutant: Mutant) -> str | None:
    """The mutation applied in the copy; the reason it could not be (its text not found exactly once), else None."""
    path = copy / mutant.file
    if not path.is_file():
        return f"{mutant.file} does not exist"
    text = path.read_text()
    count = text.count(mutant.old)
    if count != 1:
        return f"`{mutant.old.strip()[:60]}` found {count} times in {mutant.file}, not once"
    path.write_text(text.replace(mutant.old, mutant.new))
    return None


def environment(copy: Path, prefect_home: Path) -> dict[str, str]:
    """The tests' environment, with the copy first on the import path and the venv's tools on PATH."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(copy),
        DO_NOT_TRACK="1",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_HOME=str(prefect_home),
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
    )
    return env


def imports_from(copy: Path, env: dict[str, str], full: bool) -> str | None:
    """Why `relaunch` (and relaunch.flows) would not be imported from the copy, or None.

    The venv's editable install appends its finder to sys.meta_path, after the path finder that reads PYTHONPATH, so
    the copy should win; this checks it rather than trusting it. `full` imports relaunch.flows (Prefect, seconds);
    otherwise its spec is only found (no import of Prefect)."""
    probe = (
        "import relaunch, relaunch.flows; print(relaunch.__file__); print(relaunch.flows.__file__)"
        if full
        else "import importlib.util, relaunch; print(relaunch.__file__); print(importlib.util.find_spec('relaunch.flows').origin)"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=copy, env=env, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return f"importing relaunch in the copy failed: {out.stderr.strip()[-500:]}"
    real = copy.resolve()
    for line in out.stdout.split():
        if not Path(line).resolve().is_relative_to(real):
            return f"imported {line}, outside the copy {copy}"
    return None


# pytest's short summary lines (-ra): `FAILED tests/x.py::test_y - AssertionError...`, `ERROR tests/x.py::test_y ...`.
RED_LINE = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)
COUNTS = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)")


def run_tests(copy: Path, mutant: Mutant, env: dict[str, str]) -> tuple[int | None, str]:
    """(pytest's exit code or None on a timeout, its output). In a session of its own, so a timeout ends all it started."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", *mutant.tests]
    with subprocess.Popen(
        command, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=ROW_TIMEOUT_SECONDS)
            return proc.returncode, output
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this run's own pytest leads: nothing else
            output, _ = proc.communicate()
            return None, output


def judge(mutant: Mutant, code: int | None, output: str, baseline: bool) -> tuple[str, str]:
    """(status, the test that went red or what went wrong) from pytest's exit code and its summary."""
    counts: dict[str, int] = {}
    for n, kind in COUNTS.findall(output.splitlines()[-1] if output.strip() else ""):
        counts[kind.rstrip("s") if kind.startswith("error") else kind] = int(n)
    red = RED_LINE.findall(output)
    if code is None:
        return "TIMEOUT", f"no verdict in {ROW_TIMEOUT_SECONDS} s"
    if code == 1 and red:
        # Tests ran and failed: for a mutant the point of the row; for the baseline a broken row.
        return ("FAILED", red[0]) if baseline else ("killed", red[0])
    if code == 0 and counts.get("skipped") and not counts.get("passed"):
        # A skipped test guards nothing here: neither a kill nor a pass.
        return "SKIPPED", "the test skipped: it guards nothing on this machine"
    if code == 0:
        if counts.get("skipped"):
            return ("passed" if baseline else "SURVIVED"), f"({counts['skipped']} skipped)"
        return ("passed", "") if baseline else ("SURVIVED", "")
    return "ERROR", f"pytest exited {code} (a node id that no longer collects?)"


def run_row(mutant: Mutant, baseline: bool, verify_fully: bool) -> Outcome:
    start = time.monotonic()
    with copy_of_tree(ROOT) as copy, tempfile.TemporaryDirectory(prefix="relaunch-mutant-prefect-") as home:
        env = environment(copy, Path(home))
        wrong = imports_from(copy, env, full=verify_fully)
        if wrong:
            return Outcome(mutant, "ERROR", time.monotonic() - start, wrong)
        if not baseline:
            why_not = apply(copy, mutant)
            if why_not:
                return Outcome(mutant, "NOT APPLIED", time.monotonic() - start, why_not)
        code, output = run_tests(copy, mutant, env)
    status, red = judge(mutant, code, output, baseline)
    expected = "passed" if baseline else "killed"
    return Outcome(mutant, status, time.monotonic() - start, red, "" if status == expected else output[-3000:])


def short(node: str) -> str:
    """`tests/x.py::test_y[p]` as `x::test_y[p]`: the table stays readable."""
    return node.removeprefix("tests/").replace(".py::", "::")


def table(outcomes: list[Outcome], baseline: bool) -> str:
    head = "test that passed" if baseline else "test that went red"
    rows = [f"| mechanism | file | mutation | {head} | result | seconds |", "| --- | --- | --- | --- | --- | --- |"]
    for o in outcomes:
        m = o.mutant
        test = short(o.red) if o.status in ("killed", "FAILED") else ", ".join(short(t) for t in m.tests) if o.status == "passed" else o.red
        rows.append(f"| {m.name}: {m.mechanism} | {m.file} | {m.what} | {test or '-'} | {o.status} | {o.seconds:.0f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this row (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the rows and run nothing")
    parser.add_argument("--baseline", action="store_true", help="run each row's tests unmutated: they must pass")
    args = parser.parse_args(argv)
    names = {m.name for m in MUTANTS}
    if len(names) != len(MUTANTS):
        print("two rows share a name", file=sys.stderr)
        return 2
    unknown = sorted(set(args.only or ()) - names)
    if unknown:
        print(f"no such row: {', '.join(unknown)} (see --list)", file=sys.stderr)
        return 2
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.mechanism}\n    {m.file}: {m.what}\n    " + "\n    ".join(m.tests))
        return 0
    began = time.monotonic()
    outcomes: list[Outcome] = []
    for i, mutant in enumerate(chosen):
        # The first copy imports relaunch.flows for real (Prefect, seconds); the others find its spec only.
        outcome = run_row(mutant, args.baseline, verify_fully=i == 0)
        outcomes.append(outcome)
        print(f"{outcome.status:<11} {mutant.name:<28} {outcome.seconds:6.1f} s  {short(outcome.red) if outcome.red else ''}", flush=True)
        if outcome.tail:
            print("    " + outcome.tail.strip().replace("\n", "\n    "), flush=True)
    print()
    print(table(outcomes, args.baseline))
    print(f"\n{len(outcomes)} row(s) in {time.monotonic() - began:.0f} s")
    expected = "passed" if args.baseline else "killed"
    return 0 if all(o.status == expected for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
