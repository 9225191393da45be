"""Target files fail clearly; the docs' tables are the code's tables; the README's set-up is what CI runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from relaunch.config import load_target
from relaunch.deciding.playbook import playbook_table
from relaunch.errors import ConfigError

ROOT = Path(__file__).parent.parent
GOOD = {
    "name": "dflash",
    "repo_dir": "/root/dflash",
    "venv_dir": "/root/venv",
    "lock_file": "requirements.lock",
    "launch_command": "bash start.sh",
    "log_dir": "/workspace/logs",
}


def write(tmp_path, data) -> Path:
    path = tmp_path / "target.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def test_a_minimal_target_file_loads_with_defaults_from_the_field_notes(tmp_path):
    target = load_target(write(tmp_path, GOOD))
    assert target.inductor_cache_dir == f"/tmp/torchinductor_relaunch_{target.name}", "the target's own cache, not root's shared one"
    assert target.thresholds.startup_grace_seconds >= 420, "the incident's start-up took well over 7 minutes"
    assert target.state_path == f"/var/tmp/relaunch/{target.name}", "state per target, outside log_dir"


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"thresholds": {"poll_interval_seconds": 0}}, "thresholds.poll_interval_seconds"),
        ({"repo_dir": "relative/path"}, "repo_dir"),
        ({"max_attempts": "three"}, "max_attempts"),
        ({"tmux_session": "a;rm -rf /"}, "tmux_session"),
        ({"unknown_field": 1}, "unknown_field"),
        ({"checkpoint_dir": "/ckpt", "resume_arg": "--resume"}, "resume_arg"),
        ({"restore_paths": ["../secrets.py"]}, "restore_paths"),
        ({"restore_paths": ["/etc/passwd"]}, "restore_paths"),
        ({"resume_arg": "--resume {0}"}, "resume_arg"),
        ({"resume_arg": "--resume {checkpoint} }"}, "resume_arg"),
        ({"thresholds": {"step_pattern": r"step=(\d+)"}}, "thresholds.step_pattern"),
        ({"thresholds": {"throughput_pattern": r"(\d+) tok/s"}}, "thresholds.throughput_pattern"),
        ({"thresholds": {"step_pattern": "step=(?P<step>\\d+"}}, "thresholds.step_pattern"),
        ({"env": {"A": "x\0y"}}, "env"),
        ({"env": {"A; touch /tmp/x; B": "1"}}, "env"),
        ({"log_dir": "/workspace/lo\ngs"}, "log_dir"),
        ({"min_free_disk_gb": float("inf")}, "min_free_disk_gb"),
        ({"thresholds": {"poll_interval_seconds": 0.01}}, "thresholds.poll_interval_seconds"),
        ({"known_good_ref": "--output=/tmp/x"}, "known_good_ref"),
        ({"checkpoint_dir": "/workspace/ckpt", "inductor_cache_dir": "/workspace/ckpt"}, "inductor_cache_dir"),
        ({"inductor_cache_dir": "/tmp/../usr"}, "inductor_cache_dir"),
        ({"venv_dir": "/workspace"}, "venv_dir"),
    ],
)
def test_a_bad_target_file_fails_naming_the_file_and_the_field(tmp_path, change, names):
    path = write(tmp_path, {**GOOD, **change})
    with pytest.raises(ConfigError) as err:
        load_target(path)
    assert str(path) in str(err.value) and names in str(err.value)


def test_a_missing_field_and_broken_yaml_are_named(tmp_path):
    data = dict(GOOD)
    data.pop("launch_command")
    with pytest.raises(ConfigError, match="launch_command: Field required"):
        load_target(write(tmp_path, data))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_target(write(tmp_path, "name: [unclosed"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_target(tmp_path / "absent.yaml")


def test_the_docs_show_the_playbook_table_the_code_uses():
    # The table moved from the README to docs/internals.md; the README links to it.
    assert playbook_table() in (ROOT / "docs" / "internals.md").read_text()
    assert "(docs/internals.md)" in (ROOT / "README.md").read_text()


def test_the_readme_stays_short_and_links_every_doc_it_moved_text_to():
    readme = ROOT / "README.md"
    assert readme.stat().st_size < 15_000, f"README.md is {readme.stat().st_size} bytes: move detail to docs/"
    for doc in ("demo", "operations", "internals", "design", "benchmarks", "testing", "fault-matrix"):
        assert f"(docs/{doc}.md" in readme.read_text(), f"README.md does not link docs/{doc}.md"
        assert (ROOT / "docs" / f"{doc}.md").is_file()


def test_the_readme_quick_start_is_what_ci_runs():
    readme, ci = (ROOT / "README.md").read_text(), (ROOT / ".ci" / "run").read_text()
    assert "make demo" in readme and "make test" in readme and "make test" in ci


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (b"name: caf\xe9\n", "not UTF-8"),
        (b"name: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested too deeply"),
        (b"name: a\nrepo_dir: /r\nname: b\n", "duplicate key 'name' (line 3)"),
    ],
)
def test_a_target_file_that_is_not_plain_yaml_is_refused_naming_why(tmp_path, text, says):
    path = tmp_path / "target.yaml"
    path.write_bytes(text)
    with pytest.raises(ConfigError) as err:
        load_target(path)
    assert str(path) in str(err.value) and says in str(err.value)


def test_a_fifo_or_a_device_given_as_the_target_file_is_refused_without_reading_it(tmp_path):
    import os

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        with pytest.raises(ConfigError, match="not a regular file"):
            load_target(path)
