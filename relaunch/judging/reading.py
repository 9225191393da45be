"""What a log's lines say of progress: the step number, throughput in the forms people print, non-finite losses. Pure."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from relaunch.config import Thresholds
from relaunch.judging.logtext import NUMBER, printed_number, training_step_mention
from relaunch.judging.signatures import DEFAULT_LOSS, NOT_TRAINING_PROGRESS, STEP_LINE, TQDM_PROGRESS

_TOKENS_PER_SECOND = r"tok(?:en)?s?(?:[ _]?per[ _]?|\s*/\s*)s(?:ec(?:ond)?)?"


DEFAULT_THROUGHPUT = re.compile(
    # `21.3Ktok/s`, `21500 tok/s`, `21,300 tok/s`, `2.13e+04 tok/s`, `1.5M tokens/s`, `900 tok/sec`, `21300 tokens per
    # second`; or a key first: `tokens_per_sec: 2660`, `tok/s=21300`, `tok/s: 21,300`, `tokens/s (total): 21.3k`. The
    # number as printed, separators and all (logtext.NUMBER): logtext.printed_number says whether its value is certain.
    rf"(?<![\w.,'\u2009\u202f\u00a0])(?P<value>{NUMBER})\s*(?P<unit>[kKmM])?\s*(?P<utext>{_TOKENS_PER_SECOND})(?![\w])"
    rf"|(?<![A-Za-z]){_TOKENS_PER_SECOND}(?P<keyscope>(?:[ _/-](?:per[ _-]?)?(?:gpu|device|dev|rank))?)[)\]'\"]?\s*[=:]\s*(?P<value2>{NUMBER})(?P<unit2>[kKmM](?![A-Za-z]))?(?![\w.])",
    re.IGNORECASE,
)


UNIT = {"k": 1e3, "m": 1e6}


# A figure that is not the run's current throughput: a target, a baseline, a peak (`target 21500 tok/s`, `peak_tok/s:
# 30000`, `21500 tok/s (expected)`). Beside another figure it is passed over; alone it is no reading.
NOT_A_READING_BEFORE = re.compile(
    r"\b(?:target|expected|baseline|peak|max(?:imum)?|min(?:imum)?|best|goal|ideal|theoretical|planned)[\s_:=(-]*$", re.I
)


NOT_A_READING_AFTER = re.compile(
    r"^\s*[(\[]?\s*(?:target|expected|baseline|peak|max(?:imum)?|min(?:imum)?|best|goal|ideal)\b(?!\s*[:=]?\s*\d)", re.I
)


# A degraded verdict stops the run: it needs this many throughput readings in a row, the last step lines that print
# one, each certain and each below the threshold. One line, or one figure read uncertain, stops nothing.
DEGRADED_READINGS = 3


# Words beside a throughput figure that say whose it is: one GPU's (`2660 tok/s/gpu`, `tokens/s per device`,
# `per_gpu_tok/s`) or the whole job's (`21.3Ktok/s total`, `total tok/s`, `global throughput: ...`).
PER_DEVICE_AFTER = re.compile(
    r"^\s*(?:/|_|-|\s)\s*(?:per[\s_-]?)?(?:gpu|device|dev|rank|card|chip)s?\b|^[\s_]*\(?per[\s_-]?(?:gpu|device|rank)", re.I
)


PER_DEVICE_BEFORE = re.compile(r"(?:\bper[\s_-]?(?:gpu|device|dev|rank)|\b(?:gpu|device|rank)\s*\d*)[\s_:=-]*\w*[\s_:=-]*$", re.I)


TOTAL_AFTER = re.compile(r"^\s*[(\[]?\s*(?:total|global|overall|aggregate|all[\s_-]gpus|cluster)\b", re.I)


TOTAL_BEFORE = re.compile(r"\b(?:total|global|overall|aggregate|cluster|all[\s_-]gpus)\b[^|,;]*$", re.I)


# What the default step pattern is: tqdm's progress counts as steps only under it (a pattern a user gave says
# exactly which lines are steps).
DEFAULT_STEP_PATTERN = Thresholds.model_fields["step_pattern"].default


@dataclass(frozen=True)
class Reading:
    steps: list[int] = field(default_factory=list)
    throughputs: list[float] = field(default_factory=list)  # the certain readings
    # One per step line that prints a throughput figure: its value, or None where the figure is not certain or is of
    # another scope than the baseline's (Thresholds.baseline_scope).
    throughput_lines: list[float | None] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)  # one per step line; None where none is printed


def read_log(lines: list[str], thresholds: Thresholds) -> Reading:
    step_of = step_reader(thresholds)
    tput_re = re.compile(thresholds.throughput_pattern) if thresholds.throughput_pattern else DEFAULT_THROUGHPUT
    loss_re = re.compile(thresholds.loss_pattern, re.IGNORECASE) if thresholds.loss_pattern else DEFAULT_LOSS
    steps: list[int] = []
    tputs: list[float | None] = []
    comparable: list[float | None] = []
    losses: list[float | None] = []
    for line in lines:
        found = step_of(line)
        if found is None:
            continue
        step, redraw = found
        if redraw and steps and steps[-1] == step:
            continue  # tqdm redrew the same count (a postfix update, its closing draw): no new step
        steps.append(step)
        loss = loss_re.search(line)
        losses.append(_float_or_none(loss.group("value")) if loss else None)
        tput = read_throughput(line, tput_re)
        if tput is not None:
            tputs.append(tput.value)
            # A figure the log marks as the other scope than the baseline's is no reading against it (one GPU's 2690
            # tok/s is not 12 % of a job's 21500).
            comparable.append(tput.value if tput.scope in (None, thresholds.baseline_scope) else None)
    return Reading(steps=steps, throughputs=[v for v in tputs if v is not None], throughput_lines=comparable, losses=losses)


def step_reader(thresholds: Thresholds) -> Callable[[str], tuple[int, bool] | None]:
    """A function from a log line to (its training step, whether it is a tqdm redraw), or None for no step line.

    A step mention that a resume, checkpoint load or save or an evaluation governs in its clause is never a training
    step, whatever the pattern (NOT_A_TRAINING_STEP, logtext.training_step_mention): the first mention that is one
    counts. Under the default pattern a tqdm or rich bar's count is a step too, unless the bar is loading or
    evaluating, and so are the shapes of STEP_LINE (`Step 12/1000`, `global_step: 12`, `iteration 12`)."""
    step_re = re.compile(thresholds.step_pattern)
    default = thresholds.step_pattern == DEFAULT_STEP_PATTERN
    patterns = (step_re, STEP_LINE) if default else (step_re,)

    def step_of(line: str) -> tuple[int, bool] | None:
        bar = TQDM_PROGRESS.search(line) if default and ("[" in line or "\u2022" in line) else None
        if bar:
            n = int(bar["n"] or bar["n2"] or bar["n3"])
            # 0 done is the bar drawn before the first iteration (which may compile for minutes): no step yet.
            if n == 0 or NOT_TRAINING_PROGRESS.search(line[: bar.start()]):  # the bar's description
                return None
            return n, True
        for pattern in patterns:
            for m in pattern.finditer(line):
                if training_step_mention(line, m.start(), m.end()):
                    text = next(g for g in (m.groupdict().get(k) for k in ("step", "step2", "step3", "step4")) if g)
                    return int(text.replace(",", "")), False
        return None

    return step_of


@dataclass(frozen=True)
class ThroughputReading:
    """A line's throughput figure: its value in tokens per second, or None where the figure is not certain."""

    value: float | None
    scope: Literal["job", "gpu"] | None = None  # whose figure the line says it is; None where it does not say


def throughput(line: str, pattern: re.Pattern[str]) -> float | None:
    """Tokens per second on one line; None where it prints none, or none that is certain (read_throughput)."""
    reading = read_throughput(line, pattern)
    return reading.value if reading else None


def read_throughput(line: str, pattern: re.Pattern[str]) -> ThroughputReading | None:
    """Tokens per second on one line: the whole job's figure over one GPU's (`2660 tok/s/gpu | 21.3Ktok/s total`
    reads 21300), a figure of no stated scope over a per-GPU one, the first of its kind otherwise. A line with
    per-GPU figures only reads the per-GPU one, as the baseline set from the same printout does. None: no figure;
    a reading of value None: the figure chosen is not certain (`21.300 tok/s`, `21,3 tok/s`), or the line's only
    figures are targets or peaks (`target 21500 tok/s`)."""
    best: tuple[int, float | None] | None = None  # (rank: 0 total, 1 unscoped, 2 per device, 3 no reading; value)
    for found in pattern.finditer(line):
        m, certain = _whose_figure(line, found, pattern)
        groups = m.groupdict()
        text = groups.get("value") or groups.get("value2")
        if text is None:
            continue
        unit = groups.get("unit") or groups.get("unit2") or ""
        value = printed_number(text, unit) if certain else None
        lead = line[max(0, m.start() - 40) : m.start()]
        if value is not None and re.fullmatch(r"\d{3}(?:\.\d+)?", text.split("e")[0].split("E")[0]) and lead.endswith(" "):
            if re.search(r"(?:^|\s)\d{1,3} $", lead):  # `21 300 tok/s`: a plain space between digit groups, or two figures?
                value = None
        before = re.split(r"[|,;]", lead)[-1]
        after = line[m.end() : m.end() + 24]
        if NOT_A_READING_BEFORE.search(before) or NOT_A_READING_AFTER.search(after):
            rank = 3
        elif TOTAL_AFTER.search(after) or TOTAL_BEFORE.search(before) or TOTAL_BEFORE.search(m.group(0)):
            rank = 0
        elif groups.get("keyscope") or PER_DEVICE_AFTER.search(after) or PER_DEVICE_BEFORE.search(before):
            rank = 2
        else:
            rank = 1
        if best is None or rank < best[0]:
            best = (rank, value)
    if best is None:
        return None
    return ThroughputReading(None if best[0] == 3 else best[1], {0: "job", 2: "gpu"}.get(best[0]))


# A bare number right after a throughput unit (`7 tok/s 21300`): the unit may be the key of the figure after it.
_BARE_NUMBER_AFTER = re.compile(r"\s+[-+]?\.?\d")


def _whose_figure(line: str, m: re.Match[str], pattern: re.Pattern[str]) -> tuple[re.Match[str], bool]:
    """Which figure a value-first match's unit belongs to, and whether that is certain.

    A unit followed by `=` or `:` and a number is that number's key (`loss=2.31 tokens/s: 21300` is 21300, not 2.31
    tok/s: read as the number before it, a healthy run was called degraded). A unit between two bare numbers, the first
    spaced from it and without a k/M suffix (`step 7 tok/s 21300`), may be either's: no certain reading. Only for a
    pattern that names its unit text (`utext`, as DEFAULT_THROUGHPUT does); a pattern of the user's says what it means."""
    if m.groupdict().get("value") is None or "utext" not in pattern.groupindex:
        return m, True
    keyed = pattern.match(line, m.start("utext"))
    if keyed is not None and keyed.groupdict().get("value2") is not None:
        return keyed, True
    spaced = m.start("utext") > m.end("value") and not m.group("unit")
    return m, not (spaced and _BARE_NUMBER_AFTER.match(line, m.end()))


def slow_throughput(reading: Reading, threshold: float) -> list[float] | None:
    """The last DEGRADED_READINGS throughput readings where each is certain and below threshold; None otherwise."""
    last = reading.throughput_lines[-DEGRADED_READINGS:]
    if len(last) < DEGRADED_READINGS or any(v is None or v >= threshold for v in last):
        return None
    return [v for v in last if v is not None]


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def first_nonfinite(reading: Reading) -> int | None:
    return next((step for step, loss in zip(reading.steps, reading.losses) if loss is not None and not math.isfinite(loss)), None)


def diverged(reading: Reading, n: int) -> bool:
    last = reading.losses[-n:]
    return len(last) == n and all(loss is not None and not math.isfinite(loss) for loss in last)
