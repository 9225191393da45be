"""Generated target files: either refused at validation, naming a field, or safe to recover with.

Strings mix quotes, `$()`, backticks, newlines, NUL, `..`, globs and non-ASCII, each carrying a
command that would touch a canary file if any layer ran it as shell code.
"""

from __future__ import annotations

import shutil
import string
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from relaunch.config import load_target
from relaunch.errors import ConfigError
from relaunch.flows.recover import recover_training
from relaunch.paths import CONTROL, normalise, overlaps
from relaunch.testing.faults import reap, tree
from relaunch.testing.targets import shell_target
from relaunch.vocabulary import Verdict

CANARY = Path(tempfile.gettempdir()) / "relaunch-fuzz-canary"


def hostile(canary: Path) -> st.SearchStrategy[str]:
    """Fragments that run `touch` if anything evaluates them, mixed with odd but harmless text."""
    c = str(canary)
    attacks = [f'"; touch {c}/a; "', f"$(touch {c}/b)", f"`touch {c}/c`", f"'; touch {c}/d #", f"\n touch {c}/e", f"{{ touch {c}/f; }}"]
    odd = ["..", "*", "?", "[x]", "é", "日本", "\r", "\0", " ", "-", "~", "%s", "{checkpoint}", "{0}", "}", "\\"]
    return st.lists(st.sampled_from(attacks + odd) | st.text(max_size=4), min_size=1, max_size=4).map("".join)


PATH_FIELDS = ("repo_dir", "venv_dir", "log_dir", "inductor_cache_dir", "checkpoint_dir", "state_dir")
FLOAT_FIELDS = ("startup_grace_seconds", "poll_interval_seconds", "settle_timeout_seconds", "stall_window_floor_seconds")


@st.composite
def target_files(draw: st.DrawFn) -> dict:
    base = {
        "name": "fuzz",
        "repo_dir": "/srv/fuzz/repo",
        "venv_dir": "/srv/fuzz/venv",
        "lock_file": "requirements.lock",
        "launch_command": "bash stepper.sh",
        "log_dir": "/srv/fuzz/logs",
        "checkpoint_dir": "/srv/fuzz/ckpt",
        "inductor_cache_dir": "/srv/fuzz/cache",
        "resume_arg": "--resume {checkpoint}",
        "thresholds": {},
    }
    text = hostile(CANARY)
    for field in draw(st.lists(st.sampled_from(PATH_FIELDS), max_size=3, unique=True)):
        base[field] = draw(st.sampled_from(["/srv/fuzz/", "/tmp/../", "/", "", "/srv/fuzz/ckpt/"])) + draw(text)
    if draw(st.booleans()):
        base["env"] = {draw(text | st.just("GOOD")): draw(text)}
    if draw(st.booleans()):
        base["restore_paths"] = [draw(text)]
    if draw(st.booleans()):
        base["resume_arg"] = draw(text)
    if draw(st.booleans()):
        base["known_good_ref"] = draw(text)
    for field in draw(st.lists(st.sampled_from(FLOAT_FIELDS), max_size=2, unique=True)):
        base["thresholds"][field] = draw(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-5, 10**6))
    if draw(st.booleans()):
        base["thresholds"]["step_pattern"] = draw(st.sampled_from([r"step=(\d+)", r"(?P<step>\d+", r"step=(?P<step>\d+)", draw(text)]))
    return base


def check_invariants(data: dict, path: Path) -> None:
    try:
        target = load_target(path)
    except ConfigError as exc:
        assert str(path) in str(exc) and "Traceback" not in str(exc)
        return
    for field in PATH_FIELDS:
        value = getattr(target, field)
        assert value is None or (value.startswith("/") and not CONTROL & set(value)), (field, value)
    for folder in target.protected_dirs().values():
        assert not overlaps(normalise(target.inductor_cache_dir), normalise(folder))
    assert all(k.isidentifier() and k.isascii() and "\0" not in v for k, v in target.env.items())
    assert all(".." not in p.split("/") and not p.startswith("/") for p in target.restore_paths)
    assert {name for _, name, _, _ in string.Formatter().parse(target.resume_arg) if name is not None} <= {"checkpoint"}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=target_files())
def test_a_generated_target_file_is_refused_naming_the_file_or_holds_every_invariant(data, tmp_path):
    path = tmp_path / "target.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    check_invariants(data, path)


@pytest.mark.usefixtures("prefect_harness")
# Each example is a whole recovery (seconds): no shrinking, which could run dozens more.
@settings(
    max_examples=4, deadline=None, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    folder=hostile(CANARY).filter(lambda s: s and "/" not in s and "\0" not in s and not CONTROL & set(s) and s not in (".", "..")),
    value=hostile(CANARY).filter(lambda s: "\0" not in s),
)
def test_a_recovery_with_hostile_names_and_values_runs_none_of_them_and_touches_nothing_outside_the_target(folder, value):
    CANARY.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="relaunch-fuzz-"))
    outside = work / "outside"
    outside.mkdir()
    (outside / "keep").write_text("unrelated data")
    t = None
    try:
        t = shell_target(work / folder, env={"FUZZ": value}, launch_command='printf "%s" "$FUZZ" > fuzz-seen; bash stepper.sh')
        report = recover_training(t)
        assert report.verdict is Verdict.HEALTHY, report.timeline()
        # Bytes, not read_text(): its newline translation would turn a \r the trainer got into \n.
        assert (Path(t.repo_dir) / "fuzz-seen").read_bytes().decode() == value
        assert list(CANARY.iterdir()) == [], "a config value ran as shell code"
        assert tree(outside) == {"keep": tree(outside)["keep"]} and (outside / "keep").read_text() == "unrelated data"
        assert sorted(p.name for p in work.iterdir()) == sorted(["outside", folder]), "nothing was created beside the target"
    finally:
        if t is not None:
            reap(t)
        shutil.rmtree(work, ignore_errors=True)
