"""Progress is a step number that advances; throughput is read in the forms people print, or not at all.

Generated shapes (Hypothesis) against the readers in relaunch/judging/reading.py and the rule in relaunch/judging/logtext.py, then
end-to-end diagnoses on real Lightning 2.6 output (tests/fixtures/judging/PROVENANCE.md). The harms they guard: a
healthy run printing `21,300 tok/s` read as 21 tok/s and killed as degraded; `Restored from global step 100` read as
a step, ending the start-up grace during a compile; a resumed Lightning run's `Training: | | 41/? [...]` read as no
step at all, so it was `starting` forever.
"""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from relaunch.config import Thresholds
from relaunch.judging.diagnosis import diagnose
from relaunch.judging.logtext import clean_lines, printed_number
from relaunch.judging.reading import read_log
from relaunch.vocabulary import Verdict
from tests.test_judging import alive, lines  # the snapshot of a live run, and a log as the poll reads it

JUDGING = Path(__file__).parent / "fixtures" / "judging"
T = Thresholds(startup_grace_seconds=900, stall_window_floor_seconds=300, healthy_steps=3)
BASELINE = T.model_copy(update={"baseline_tokens_per_second": 21500})


def read_throughput_of(line: str) -> float | None:
    """What a step line's throughput figure reads as: its value, or None (no figure, or none certain)."""
    reading = read_log([f"step=7 loss=2.31 | {line}"], T)
    assert len(reading.throughput_lines) <= 1
    return reading.throughput_lines[0] if reading.throughput_lines else None


# ---- throughput: shapes with the true value known ------------------------------------------------------------

SEPARATORS = [",", "_", "'", "\u2009", "\u202f", "\u00a0"]
UNITS = ["tok/s", "tokens/s", "tok/sec", "tokens/sec", "tokens per second", "tokens/second"]


@st.composite
def certain_figures(draw: st.DrawFn) -> tuple[float, str]:
    """A figure printed unambiguously, and the value it prints."""
    form = draw(st.sampled_from(["plain", "grouped", "suffix", "scientific", "decimal"]))
    if form == "plain":
        value = draw(st.integers(1, 10**7))
        number = str(value)
    elif form == "grouped":
        value = draw(st.integers(1000, 10**8))
        number = f"{value:,}".replace(",", draw(st.sampled_from(SEPARATORS)))
    elif form == "suffix":
        tenths = draw(st.integers(1, 99_999))
        suffix = draw(st.sampled_from(["k", "K", "M", "m"]))
        value = tenths / 10 * (1e6 if suffix in "Mm" else 1e3)
        number = f"{tenths / 10:.1f}{draw(st.sampled_from(['', ' ']))}{suffix}"
    elif form == "scientific":
        number = f"{draw(st.floats(1, 1e8)):.{draw(st.integers(0, 4))}e}"
        value = float(number)
    else:  # one or two decimals: `21300.5`, `21,300.25`
        hundredths = draw(st.integers(1, 10**9))
        number = f"{hundredths / 100:,.2f}" if draw(st.booleans()) else f"{hundredths / 100:.2f}"
        value = float(number.replace(",", ""))
    unit = draw(st.sampled_from(UNITS))
    key_first = draw(st.booleans()) and unit != "tokens per second" and " " not in number
    if key_first:
        key = draw(st.sampled_from(["tok/s", "tokens_per_sec", "tokens/sec", "tok/sec", "tokens per second", "tokens/s"]))
        line = f"{key}{draw(st.sampled_from([': ', '=', ' = ', ':']))}{number}"
    else:
        line = f"{draw(st.sampled_from(['', 'throughput: ', '(', 'speed ']))}{number}{draw(st.sampled_from([' ', '']))}{unit}"
    return value, line


@st.composite
def ambiguous_figures(draw: st.DrawFn) -> tuple[float, str]:
    """A figure whose number a reader cannot be sure of, and one value it may print."""
    form = draw(st.sampled_from(["dot_thousands", "three_places", "decimal_comma", "european", "indian", "spaced"]))
    if form == "dot_thousands":  # 21.300 = 21300, German style
        value = draw(st.integers(1000, 999_999))
        number = f"{value:,}".replace(",", ".")
    elif form == "three_places":  # 21.300 = 21.3, to three places
        value = draw(st.integers(1000, 999_999)) / 1000
        number = f"{value:.3f}"
    elif form == "decimal_comma":  # 21,3 = 21.3
        tenths = draw(st.integers(11, 9999).filter(lambda n: n % 10))
        value, number = tenths / 10, f"{tenths / 10}".replace(".", ",")
    elif form == "european":  # 21.300,5
        value = draw(st.integers(1000, 999_999)) + 0.5
        number = f"{value:,.1f}".replace(",", " ").replace(".", ",").replace(" ", ".")
    elif form == "indian":  # 2,13,000 = 213000, lakh grouping
        value = draw(st.integers(100_000, 99_999_999))
        head, last = str(value)[:-3], str(value)[-3:]
        pairs = [head[max(0, i - 2) : i] for i in range(len(head), 0, -2)][::-1]
        number = ",".join([*pairs, last])
    else:  # `21 300`: a plain space between the groups
        value = draw(st.integers(1000, 999_999))
        number = f"{value:,}".replace(",", " ")
    return value, f"{number} {draw(st.sampled_from(UNITS))}"


@given(certain_figures())
def test_a_throughput_printed_in_any_common_form_reads_its_true_value(case):
    value, line = case
    got = read_throughput_of(line)
    assert got is not None and math.isclose(got, value, rel_tol=1e-9), (line, got, value)


@given(st.one_of(certain_figures(), ambiguous_figures()))
def test_a_printed_throughput_reads_its_true_value_or_uncertain_never_a_wrong_number(case):
    value, line = case
    got = read_throughput_of(line)
    assert got is None or math.isclose(got, value, rel_tol=1e-9), (line, got, value)


# Another metric's field, as trainers print them beside a throughput: `loss=2.31`, `lr 3e-4`, `grad_norm: 0.98`, `12`.
OTHER_FIELDS = st.tuples(
    st.sampled_from(["loss", "lr", "grad_norm", "step", "mfu", "acc", "", "epoch", "it/s"]),
    st.sampled_from(["=", ": ", " ", ":"]),
    st.sampled_from(["2.31", "3e-4", "0.98", "7", "41.2", "12", "0.5", "1.2e-05", "1,024"]),
).map(lambda f: f"{f[0]}{f[1] if f[0] else ''}{f[2]}")


@given(
    certain_figures(),
    st.lists(OTHER_FIELDS, max_size=3),
    st.lists(OTHER_FIELDS, max_size=2),
    st.sampled_from([" ", "  ", ", ", " | ", "\t", "; "]),
)
def test_a_throughput_among_other_metrics_reads_its_value_or_uncertain_never_another_fields_number(case, before, after, sep):
    """`step=7 loss=2.31 tokens/s: 21300` once read 2.31 tok/s: the key-first figure taken as the unit of the number
    before it, a healthy run called degraded three lines in a row and stopped. Whatever the fields around it and
    however they are separated, the reading is the throughput's own value, or no certain reading at all."""
    value, figure = case
    line = sep.join([*before, figure, *after])
    reading = read_log([f"step=7{sep}{line}"], T)
    assert len(reading.throughput_lines) == 1, line
    got = reading.throughput_lines[0]
    assert got is None or math.isclose(got, value, rel_tol=1e-9), (line, got, value)


def test_a_key_first_throughput_after_another_metric_reads_its_own_value():
    for line in ("loss=2.31 tokens/s: 21300", "loss 2.31 tok/s=21300", "lr=3e-4 tok/s: 21,300", "grad_norm 0.98 tokens/s=21.3k"):
        assert read_throughput_of(line) == 21300.0, line


def test_a_number_whose_separator_may_be_a_decimal_mark_is_no_reading():
    for text in ("21.300", "21,3", "21.300,5", "2,13,000", "21.300.000", "2,130e4"):
        assert printed_number(text) is None, text
    assert printed_number("21.3", "k") == 21300.0 and printed_number("0.500") == 0.5


def test_samples_and_iterations_per_second_are_no_token_throughput():
    for line in ("512 samples/s", "4.41it/s", "21300 img/s", "throughput: 21300", "21300 tokens/step"):
        assert read_log([f"step=7 {line}"], T).throughput_lines == [], line


def test_a_target_or_peak_figure_is_passed_over_and_alone_is_no_reading():
    assert read_throughput_of("21,300 tok/s (target 30,000 tok/s)") == 21300.0
    assert read_throughput_of("peak 30000 tok/s") is None


# ---- steps: shapes, and the mentions that are no training step ----------------------------------------------

BAR = "█▏▎▍▌▋▊▉"


@st.composite
def step_lines(draw: st.DrawFn, n: int) -> str:
    """A line a trainer prints after its training step n, in one of the shapes trainers print."""
    total = n + draw(st.integers(0, 10_000))
    shape = draw(st.sampled_from(["key", "slash", "bracket", "it", "iteration", "global", "tqdm", "tqdm_no_total", "rich"]))
    metrics = draw(st.sampled_from(["", " loss=2.31", " | loss 2.31 | 21300 tok/s", " loss: 2.31 eval_loss: 2.5"]))
    if shape == "key":
        return f"{draw(st.sampled_from(['step=', 'step: ', 'step ']))}{n}{metrics}"
    if shape == "slash":
        return f"{draw(st.sampled_from(['Step', 'step']))} {n}/{total}{metrics}"
    if shape == "bracket":
        return f"[step {n}]{metrics}"
    if shape == "it":
        return f"it {n}/{total}{metrics}"
    if shape == "iteration":
        return f"{draw(st.sampled_from(['iteration', 'iter:', 'iter']))} {n}{metrics}"
    if shape == "global":
        return f"{draw(st.sampled_from(['global_step: ', 'global_step=', 'global step ']))}{n}{metrics}"
    desc = draw(st.sampled_from(["", "train: ", "Epoch 3: ", "Training: "]))
    if shape == "tqdm":
        pct = 100 * n // total
        return f"{desc}{pct:3d}%|{BAR[0] * (pct // 10):10s}| {n}/{total} [02:33<03:07,  2.93it/s, v_num=0, train_loss=2.31]"
    if shape == "tqdm_no_total":
        return draw(st.sampled_from([f"{desc}|          | {n}/? [02:33<00:00,  4.41it/s]", f"{n}it [02:33,  4.41it/s]"]))
    return f"Epoch 3/9  ━━━━━━━━━━━━╸━━━━━ {n}/{total} 0:02:33 • 0:03:07 2.93it/s v_num: 0 train_loss: 2.31"


NOT_STEP_PHRASES = [
    "Resuming from step {n}",
    "resuming from step {n}, skipping {n} batches",
    "Restored from global step {n}",
    "Restoring from checkpoint at step {n}",
    "loaded checkpoint at step={n}",
    "Loading the checkpoint at step {n}.",
    "Loaded model weights (global_step: {n})",
    "Saving checkpoint at step {n}",
    "saved checkpoint step_{n} at step {n}",
    "step {n}: checkpoint saved to /ckpt",
    "Evaluating at step {n}",
    "eval at step {n}: loss 2.31",
    "Running validation at step {n}",
    "validation step {n}",
    "Continuing training from global step {n}",
    "continuing from iteration {n}",
    "skipping first {n} batches",
    "Will skip the first 0 epochs then the first {n} batches in the first epoch.",
    "best model so far: /runs/ckpt/epoch=1-step={n}.ckpt",
    "Validation DataLoader 0:  50%|█████     | {n}/{t} [00:01<00:01,  4.41it/s]",
    "Sanity Checking DataLoader 0:  50%|█████     | {n}/{t} [00:00<00:00, 88.85it/s]",
    "Skipping the first batches:  45%|████▌     | {n}/{t} [00:02<00:03, 91.2it/s]",
    "Validation DataLoader 0 ━━━━━━━━━━━━╸━━━━━ {n}/{t} 0:00:01 • 0:00:01 4.41it/s",
    "restarting at step {n}",
    "Restarted from iteration {n}",
    "Warm-starting at step {n}",
    "warmstart from global_step {n}",
    "fast-forwarding dataloader to step {n}",
    "Fast forwarded data to iteration {n}",
    "Rolling back to step {n}",
    "rolled back to iteration {n} after a loss spike",
    "Recovered state at step {n}",
    "picked up at step {n}",
    "rewinding to step {n}",
]


@given(st.integers(1, 10**6).flatmap(lambda n: st.tuples(st.just(n), step_lines(n))))
def test_every_step_line_shape_reads_its_step(case):
    n, line = case
    assert read_log([line], T).steps == [n], line


@given(st.sampled_from(NOT_STEP_PHRASES), st.integers(1, 10**6), st.sampled_from(["", " (took 2.3 s)", " | lr 3.0e-04"]))
def test_a_resume_load_save_or_eval_mention_never_counts_as_a_step(phrase, n, tail):
    line = phrase.format(n=n, t=2 * n) + tail
    assert read_log([line], T).steps == [], line


@given(st.integers(1, 5000), st.lists(st.integers(1, 40), min_size=3, max_size=30), st.booleans())
def test_an_advancing_tqdm_count_is_one_step_per_count_and_its_redraws_are_none(start, gaps, with_total):
    counts = [start]
    for gap in gaps:
        counts.append(counts[-1] + gap)
    total = "?" if not with_total else str(counts[-1] + 1)
    draws = []
    for n in counts:  # each count drawn, then redrawn with its postfix, as Lightning does; `\r` between
        draws += [f"Epoch 0: |          | {n}/{total} [00:10<00:00,  4.41it/s]"] * 2
    log = clean_lines("\r".join(draws) + "\n")
    assert read_log(log, T).steps == counts


def test_a_training_step_line_that_prints_eval_metrics_or_a_save_in_another_clause_is_still_a_step():
    for line in (
        "step=12 loss=2.3 eval_loss=2.5",
        "step 12 loss 2.3 val loss 2.1",
        "step=12 loss=2.3 | saved checkpoint",
        "[step 12] val/loss=2.1",
    ):
        assert read_log([line], T).steps == [12], line


def test_a_step_count_with_thousands_separators_reads_whole():
    assert read_log(["[epoch:  1, iter:  10,100, lr:(1.992e-04,)] l_pix: 1.8e-02"], T).steps == [10100]


# ---- end to end: diagnose ---------------------------------------------------------------------------------------


def test_a_run_printing_21_300_tok_s_against_a_21500_baseline_is_healthy():
    for figure in ("21,300 tok/s", "2.13e+04 tok/s", "tok/s: 21,300", "21.3k tok/s", "tokens_per_sec=21_300"):
        log = [f"step={s} loss=2.{s} | {figure}" for s in range(1, 6)]
        d = diagnose(alive(log, 600, 1), BASELINE)
        assert (d.verdict, d.metrics.tokens_per_second) == (Verdict.HEALTHY, 21300.0), (figure, d)


PER_GPU_FORMS = ["{v} tok/s/gpu", "tokens/s per GPU: {v}", "per_gpu_tok/s={v}", "{v} tokens/sec/device", "tok/s/rank: {v}"]
TOTAL_FORMS = ["{v} tok/s total", "total tok/s: {v}", "global throughput {v} tokens/s", "{v} tok/s (all GPUs)"]


@given(st.sampled_from(PER_GPU_FORMS), st.integers(2, 16), st.integers(1000, 5000))
def test_a_healthy_run_printing_one_gpus_figure_is_never_degraded_against_the_whole_jobs_baseline(form, gpus, per_gpu):
    """The README's baseline is the job's (21500 tok/s on 8 GPUs); a trainer printing only one GPU's figure (2690
    tok/s/gpu) is at full speed, not at 12 % of it. A figure of the other scope is no reading for the degraded rule."""
    baseline = T.model_copy(update={"baseline_tokens_per_second": float(gpus * per_gpu)})
    log = [f"step={s} loss=2.{s} | {form.format(v=per_gpu)}" for s in range(1, 8)]
    d = diagnose(alive(log, 600, 1), baseline)
    assert d.verdict is Verdict.HEALTHY, (log[-1], d)


@given(st.sampled_from(TOTAL_FORMS), st.integers(2, 16), st.integers(1000, 5000))
def test_a_job_total_is_never_read_against_a_baseline_of_one_gpu(form, gpus, per_gpu):
    baseline = T.model_copy(update={"baseline_tokens_per_second": float(per_gpu), "baseline_scope": "gpu"})
    slow_total = per_gpu * gpus // 4  # a quarter of the job's speed, yet more than one GPU's baseline
    log = [f"step={s} loss=2.{s} | {form.format(v=slow_total)}" for s in range(1, 8)]
    assert diagnose(alive(log, 600, 1), baseline).verdict is Verdict.HEALTHY


def test_a_slow_figure_of_the_baselines_own_scope_is_still_degraded():
    per_gpu = T.model_copy(update={"baseline_tokens_per_second": 2690.0, "baseline_scope": "gpu"})
    log = [f"step={s} loss=2.{s} | 540 tok/s/gpu" for s in range(1, 8)]
    assert diagnose(alive(log, 600, 1), per_gpu).verdict is Verdict.DEGRADED
    log = [f"step={s} loss=2.{s} | 4,300 tok/s total" for s in range(1, 8)]
    assert diagnose(alive(log, 600, 1), BASELINE).verdict is Verdict.DEGRADED


def test_uncertain_throughput_figures_never_make_a_run_degraded():
    log = [f"step={s} loss=2.{s} | 21.300 tok/s" for s in range(1, 6)]  # 21.3 or 21300: not read
    d = diagnose(alive(log, 600, 1), BASELINE)
    assert d.verdict is Verdict.HEALTHY and d.metrics.tokens_per_second is None, d


def test_one_slow_line_is_no_degradation_but_three_slow_readings_in_a_row_are():
    fast = [f"step={s} loss=2.{s} | 21300 tok/s" for s in range(1, 6)]
    one_slow = [*fast, "step=6 loss=2.6 | 4300 tok/s", "step=7 loss=2.7 | 4300 tok/s"]
    assert diagnose(alive(one_slow, 600, 1), BASELINE).verdict is Verdict.HEALTHY
    uncertain_among = [*one_slow, "step=8 loss=2.8 | 4,3 tok/s"]
    assert diagnose(alive(uncertain_among, 600, 1), BASELINE).verdict is Verdict.HEALTHY
    three_slow = [*one_slow, "step=8 loss=2.8 | 4,300 tok/s"]
    d = diagnose(alive(three_slow, 600, 1), BASELINE)
    assert d.verdict is Verdict.DEGRADED and "4300 tok/s" in d.evidence[0], d


def test_restored_from_global_step_then_a_quiet_compile_is_starting_not_stalled():
    log = ["Restored from global step 100", "compiling the model (torch.compile, mode=max-autotune)"]
    d = diagnose(alive(log, 400, 350), T)  # past the 300 s window since its last line, inside the grace
    assert (d.verdict, d.metrics.steps_seen) == (Verdict.STARTING, 0), d


def test_a_resumed_lightning_run_whose_bar_has_no_total_becomes_healthy_as_its_count_advances():
    log = lines(JUDGING / "lightning_resume_no_total.log")
    first_bar = next(i for i, line in enumerate(log) if "| 41/?" in line)
    d = diagnose(alive(log[:first_bar], 60, 1), T)
    assert (d.verdict, d.metrics.steps_seen) == (Verdict.STARTING, 0), "the Restoring/Restored lines are no steps"
    assert read_log(log, T).steps == list(range(41, 71))
    d = diagnose(alive(log, 120, 1), T)
    assert (d.verdict, d.metrics.last_step) == (Verdict.HEALTHY, 70), d


def test_lightnings_validation_and_sanity_bars_are_no_steps_and_no_stall():
    log = lines(JUDGING / "lightning_fit.log")
    steps = read_log(log, T).steps
    assert steps == list(range(1, 41)) * 2, "two epochs of 40; the sanity check's and validation's counts are none"
    ends_in_validation = log[: max(i for i, line in enumerate(log) if line.startswith("Validation DataLoader 0: 100%")) + 1]
    assert diagnose(alive(ends_in_validation, 600, 1), T).verdict is Verdict.HEALTHY


def test_lightnings_rich_bar_is_a_step():
    assert read_log(lines(JUDGING / "lightning_rich.log"), T).steps == [40]
