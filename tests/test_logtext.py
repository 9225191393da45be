"""Logs as they really come: huge, coloured, redrawn with `\\r`, or not files at all."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

import relaunch.judging.logtext as logtext
from relaunch.errors import ConfigError
from relaunch.judging.logtext import FAILURE_WORDS, MAX_LINE_CHARS, clean_lines, read_log

REPO = Path(__file__).resolve().parent.parent
LOGS = Path(__file__).parent / "fixtures" / "logs"
PLAIN_FIXTURES = [p for p in sorted(LOGS.glob("*/*.log")) if not re.search(rb"[\r\x1b]", p.read_bytes())]
NUMBERED = re.compile(r"^(\d+)[:-](.*)$")


def relaunch_diagnose(*args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The CLI as a person runs it: its own process, so a hang or a memory blow-up is its own."""
    return subprocess.run(
        [sys.executable, "-m", "relaunch.cli", "diagnose", *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def diagnose_json(*args: object) -> dict:
    run = relaunch_diagnose(*args, "--json")
    out = json.loads(run.stdout)
    # diagnose exits 1 for a run that is not healthy, starting or finished.
    assert run.returncode == (0 if out["verdict"] in ("healthy", "starting", "finished") else 1), run.stderr
    return out


def all_plain_fixtures(tmp_path: Path) -> Path:
    """Every plain captured log in one file, blank lines between them: many failures, far apart."""
    log = tmp_path / "all.log"
    log.write_bytes(b"\n\n".join(p.read_bytes() for p in PLAIN_FIXTURES) + b"\n")
    return log


# ---- not a log file ------------------------------------------------------------------------------


def test_a_fifo_given_as_the_log_is_refused_at_once_naming_it(tmp_path):
    fifo = tmp_path / "train.log"
    os.mkfifo(fifo)
    started = time.monotonic()
    run = relaunch_diagnose(fifo, "--exit-code", "1", timeout=30)  # a blocking open would hang here
    assert run.returncode == 2
    assert f"{fifo} is a FIFO (named pipe), not a log file" in run.stderr
    assert "save the trainer's output to a file" in run.stderr
    assert time.monotonic() - started < 20


def test_dev_zero_given_as_the_log_is_refused_as_a_device_that_never_ends():
    run = relaunch_diagnose("/dev/zero", timeout=30)
    assert run.returncode == 2
    assert "/dev/zero is a character device, not a log file" in run.stderr


def test_a_directory_given_as_the_log_is_refused_naming_it(tmp_path):
    with pytest.raises(
        ConfigError, match=f"^{re.escape(str(tmp_path))} is a directory, not a log file: give the path of the log file inside it$"
    ):
        read_log(tmp_path)


# ---- huge ----------------------------------------------------------------------------------------


def test_a_50_mb_line_is_quoted_from_its_start_capped_and_the_output_stays_small(tmp_path):
    log = tmp_path / "train.log"
    with log.open("wb") as out:
        out.write((LOGS / "cpu" / "sigkill.log").read_bytes())
        out.write(b"tensor([" + b"0.1234, " * 6_250_000 + b"])\n")  # a tensor printed with no line width
    run = relaunch_diagnose(log, "--exit-code", "1")
    assert run.returncode == 1, run.stderr
    assert len(run.stdout) < 10_000
    assert run.stdout.startswith("verdict: crashed (error): exited 1 without a traceback")
    quoted = next(line for line in run.stdout.splitlines() if "tensor([" in line)
    assert quoted.startswith("  | tensor([0.1234, 0.1234") and quoted.endswith(" … [~49998010 more chars]")


def test_the_first_failure_in_the_first_mb_of_a_300_mb_log_is_found_though_the_tail_is_far_away(tmp_path):
    log = tmp_path / "train.log"
    steps = (LOGS / "cpu" / "sigterm.log").read_bytes() * 50_000  # 8 MB of real step lines
    with log.open("wb") as out:
        out.write((LOGS / "cpu" / "generic_error.log").read_bytes())  # the first attempt's crash
        while out.tell() < 300_000_000:
            out.write(steps)
    out = diagnose_json(log, "--exit-code", "1")
    assert (out["verdict"], out["cause"]) == ("crashed", "error")
    assert out["evidence"] == ["KeyError: 'labels'", "exit code 1"]
    assert out["metrics"]["last_step"] == 4413  # read from the tail, 300 MB later


def test_read_log_memory_is_bounded_by_its_buffers_not_by_the_file_or_its_lines(tmp_path):
    log = tmp_path / "train.log"
    with log.open("wb") as out:
        out.write((LOGS / "cpu" / "generic_error.log").read_bytes())
        out.write(b"tensor([" + b"0.1234, " * 4_000_000 + b"])\n")  # 32 MB line inside the scan
        out.write((LOGS / "cpu" / "sigterm.log").read_bytes() * 100_000)  # 17 MB of short lines
    tracemalloc.start()
    try:
        excerpt = read_log(log)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20, f"{peak / 2**20:.0f} MiB"
    assert "KeyError: 'labels'" in excerpt.matches
    assert excerpt.size_bytes == log.stat().st_size and len(excerpt.tail) == 400


# ---- coloured and redrawn ------------------------------------------------------------------------


def test_an_ansi_coloured_traceback_is_diagnosed_as_an_error_quoting_its_exception_line():
    out = diagnose_json(LOGS / "ansi_colored_traceback.log", "--exit-code", "1")
    assert (out["verdict"], out["cause"]) == ("crashed", "error")
    assert out["evidence"] == ["RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x32 and 64x10)", "exit code 1"]


def test_coloured_step_lines_still_count_as_steps_with_their_throughput():
    out = diagnose_json(LOGS / "ansi_colored_traceback.log", "--running", "--seconds-since-log-write", "1")
    assert out["verdict"] == "healthy"
    assert (out["metrics"]["last_step"], out["metrics"]["steps_seen"], out["metrics"]["tokens_per_second"]) == (620, 6, 20400)


def test_a_progress_bar_redrawn_with_carriage_returns_is_judged_on_its_newest_step():
    out = diagnose_json(LOGS / "carriage_return_progress.log", "--running", "--seconds-since-log-write", "1")
    assert out["verdict"] == "healthy"
    assert out["metrics"]["last_step"] == 164 and out["summary"].startswith("step 164,")
    assert "| 164/1000 [" in out["evidence"][0] and "step=164 loss=4.3142" in out["evidence"][0]


def test_colour_codes_and_crlf_line_ends_change_nothing_read_log_quotes(tmp_path):
    plain = all_plain_fixtures(tmp_path)
    text = plain.read_bytes()
    crlf, coloured = tmp_path / "crlf.log", tmp_path / "coloured.log"
    crlf.write_bytes(text.replace(b"\n", b"\r\n"))
    coloured.write_bytes(re.sub(rb"(\w+)([:=])", b"\x1b[1;31m\\1\x1b[0m\\2", text))  # as rich colours `key=`
    for options in ({"tail_lines": 3}, {"tail_lines": 20, "max_matches": 5, "context_lines": 3}):
        expected = read_log(plain, **options)
        for variant in (crlf, coloured):
            got = read_log(variant, **options)
            assert (got.matches, got.tail) == (expected.matches, expected.tail), (variant.name, options)


# ---- the same lines as the host's poll ---------------------------------------------------------------


@pytest.mark.parametrize(("tail_lines", "max_matches", "context_lines"), [(3, 30, 12), (10, 5, 3), (1, 2, 0)])
def test_read_log_quotes_what_grep_for_the_failure_words_and_tail_quote(tmp_path, tail_lines, max_matches, context_lines):
    for log in [*PLAIN_FIXTURES, all_plain_fixtures(tmp_path)]:
        grep = f"grep -a -n -B {context_lines} -m {max_matches} -E '{FAILURE_WORDS}' '{log}' | cut -c1-2000"
        tail = subprocess.run(
            f"tail -n {tail_lines} '{log}' | cut -c1-2000", shell=True, capture_output=True, text=True
        ).stdout.splitlines()
        first_tail_line = len(log.read_bytes().splitlines()) - len(tail) + 1
        numbered = [NUMBERED.match(line) for line in subprocess.run(grep, shell=True, capture_output=True, text=True).stdout.splitlines()]
        before_tail = {int(m[1]): m[2] for m in numbered if m and int(m[1]) < first_tail_line}
        excerpt = read_log(log, tail_lines=tail_lines, max_matches=max_matches, context_lines=context_lines)
        assert excerpt.tail == tail, log.name
        assert excerpt.matches == [before_tail[n] for n in sorted(before_tail)], log.name


def test_matches_come_only_from_before_the_tail_in_log_order(tmp_path):
    log = all_plain_fixtures(tmp_path)
    lines = clean_lines(log.read_text())
    for tail_lines in (5, 40, 200):
        excerpt = read_log(log, tail_lines=tail_lines)
        assert excerpt.tail == lines[-tail_lines:]
        before = iter(lines[:-tail_lines])
        assert excerpt.matches and all(any(line == earlier for earlier in before) for line in excerpt.matches)


@pytest.mark.parametrize("chunk", [7, 64, 4096])
def test_a_failure_word_cut_by_a_chunk_boundary_is_still_found(tmp_path, monkeypatch, chunk):
    log = all_plain_fixtures(tmp_path)
    expected = read_log(log, tail_lines=3)
    monkeypatch.setattr(logtext, "_CHUNK", chunk)
    assert read_log(log, tail_lines=3) == expected


# ---- clean_lines -------------------------------------------------------------------------------------


def test_clean_lines_strips_colour_cursor_title_and_link_escapes():
    first = (LOGS / "ansi_colored_traceback.log").read_bytes().decode().splitlines()[2]
    assert clean_lines(first) == [
        "step=615 loss=3.8696 acc=0.153 streak=1.1 lr=3.88e-04 noise=0.0345 | tgt=0.52b/s dft=0.52b/s (21.8Ktok/s) | q_pre=[48, 48, 48, 48, 48] q_hs=[1]"
    ]
    assert clean_lines(
        "\x1b[2K\x1b[1A\x1b[31mred\x1b[0m \x1b]0;window title\x07plain \x1b]8;;https://x\x1b\\link\x1b]8;;\x1b\\ \x1b(Bcharset\x1b7\x1b8 end\x1b"
    ) == ["red plain link charset end"]


def test_clean_lines_takes_every_newline_and_bare_carriage_return_as_a_line_break():
    assert clean_lines("a\r\nb\nc") == ["a", "b", "c"]
    assert clean_lines("\rstep 1\rstep 2\r\n") == ["step 1", "step 2"]
    assert clean_lines("a\r\r\rb\n") == ["a", "b"]  # what a redraw leaves empty is no line
    assert clean_lines("a\n\nb\r\n\r\nc\n") == ["a", "", "b", "", "c"]  # blank lines are kept
    assert clean_lines("") == [] and clean_lines("\n") == [""]
    assert clean_lines("\x00\x00\x00step=3\n") == ["step=3"]  # a log truncated under its writer


def test_clean_lines_keeps_a_long_lines_start_and_says_how_much_was_cut():
    assert clean_lines("x" * MAX_LINE_CHARS + "\n") == ["x" * MAX_LINE_CHARS]
    assert clean_lines("x" * (MAX_LINE_CHARS + 500)) == ["x" * MAX_LINE_CHARS + " … [500 more chars]"]


def test_clean_lines_is_fast_enough_for_every_health_poll():
    text = (LOGS / "ansi_colored_traceback.log").read_bytes().decode() + (LOGS / "carriage_return_progress.log").read_bytes().decode()
    text = (text * (256 * 1024 // len(text) + 1))[: 256 * 1024]
    started = time.perf_counter()
    for _ in range(10):
        clean_lines(text)
    assert time.perf_counter() - started < 2.0
