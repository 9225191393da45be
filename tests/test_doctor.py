"""`relaunch doctor`: passes on a good target, and names the problem (and what to do) on each of several broken ones.

One real sshd for the module (relaunch/testing/sshd.py), one real target folder (git repo, lock of tiny wheels; relaunch/testing/targets.py)
that each broken case varies in one thing: the host key not known, sshd not listening, the container stopped (the
pct stand-in in relaunch/testing/bin), tmux missing from PATH, a checkpoint folder on a read-only mount, a lock that does not
resolve, the Prefect API down. Each case asserts which checks failed, which were not run, and that no other did.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from relaunch.cli.doctor import examine
from relaunch.config import Target
from relaunch.errors import Result
from relaunch.plans.doctor import Check, Status, host_checks, passed
from relaunch.testing.faults import RELAUNCH, bin_without, cli_env, tmpfs, write_target
from relaunch.testing.sshd import SSHServer, free_port, sshd  # noqa: F401  (sshd is a fixture)
from relaunch.testing.targets import shell_target


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Target:
    return shell_target(tmp_path_factory.mktemp("doctor"), name="doctor")


@pytest.fixture(scope="module")
def api_url(prefect_harness: None) -> str:
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value())


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def failed(checks: list[Check]) -> set[str]:
    return {c.name for c in checks if c.status is Status.FAIL}


def skipped(checks: list[Check]) -> set[str]:
    return {c.name for c in checks if c.status is Status.NOT_RUN}


def test_every_check_passes_on_a_good_target_over_ssh(base: Target, sshd: SSHServer, api_url: str) -> None:
    checks = examine(base.model_copy(update={"host": sshd.ssh_host()}), api_url)
    assert passed(checks), "\n".join(c.line() for c in checks)
    names = [c.name for c in checks]
    assert names[:5] == ["host", "tmux", "git", "uv", "flock"] and names[-1] == "api", names
    assert {"lock", "writable log_dir", "writable checkpoint_dir", "disk venv_dir", "repo"} <= set(names), names
    assert "resolves offline" in by_name(checks)["lock"].detail


@dataclass(frozen=True)
class Broken:
    """One way a target is broken: how to make it, the check that must fail, words its detail and advice must hold."""

    make: Callable[[Target, SSHServer, Path, pytest.MonkeyPatch], Target]
    fails: str
    detail: str
    advice: str
    not_run: frozenset[str] = frozenset()
    api_down: bool = False  # the Prefect API the commands use is a port where nothing listens


def _empty_known_hosts(tmp_path: Path) -> str:
    (tmp_path / "known_hosts").write_text("")
    return str(tmp_path / "known_hosts")


def _without(tool: str, expected_gpus: int = 0) -> Callable[[Target, SSHServer, Path, pytest.MonkeyPatch], Target]:
    """The local host with `tool` missing from PATH: the sshd's sessions get a fixed PATH, the doctor's own shell not."""

    def make(base: Target, _: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Target:
        monkeypatch.setenv("PATH", str(bin_without(tmp_path / "bin", tool)))
        return base.model_copy(update={"thresholds": base.thresholds.model_copy(update={"expected_gpus": expected_gpus})})

    return make


def _unresolvable_lock(base: Target, sshd: SSHServer, tmp_path: Path, _: pytest.MonkeyPatch) -> Target:
    (tmp_path / "requirements.lock").write_text("tinyjunk==9.9.9\n")
    return base.model_copy(update={"host": sshd.ssh_host(), "lock_file": str(tmp_path / "requirements.lock")})


BROKEN = {
    "unknown host key": Broken(
        lambda base, sshd, tmp, _: base.model_copy(update={"host": sshd.ssh_host(known_hosts_path=_empty_known_hosts(tmp))}),
        "host",
        "unknown host key",
        "ssh-keyscan",
        frozenset({"host checks"}),
    ),
    "unknown host key, trust_on_first_use on": Broken(
        lambda base, sshd, tmp, _: base.model_copy(
            update={"host": sshd.ssh_host(known_hosts_path=_empty_known_hosts(tmp), trust_on_first_use=True)}
        ),
        "host",
        "unknown host key",
        "ssh-keyscan",
        frozenset({"host checks"}),
    ),
    "sshd down": Broken(
        lambda base, sshd, tmp, _: base.model_copy(update={"host": sshd.ssh_host(port=free_port())}),
        "host",
        "cannot connect",
        "sshd listens on port",
        frozenset({"host checks"}),
    ),
    "container stopped": Broken(
        lambda base, sshd, tmp, _: base.model_copy(update={"host": sshd.container_host("pct", "202")}),
        "container",
        "LXC container 202 is not running",
        "pct start 202",
        frozenset({"host checks"}),
    ),
    "tmux missing": Broken(_without("tmux"), "tmux", "tmux is not on PATH", "install tmux"),
    "checkpoint folder read-only": Broken(
        lambda base, sshd, tmp, _: base.model_copy(update={"host": sshd.ssh_host(), "checkpoint_dir": str(tmp / "ro")}),
        "writable checkpoint_dir",
        "Read-only file system",
        "read-only mount",
    ),
    "lock does not resolve": Broken(_unresolvable_lock, "lock", "tinyjunk==9.9.9", "pin versions that exist"),
    "Prefect API down": Broken(
        lambda base, sshd, tmp, _: base.model_copy(update={"host": sshd.ssh_host()}),
        "api",
        "Connection refused",
        "make serve",
        api_down=True,
    ),
    "GPUs expected, no nvidia-smi": Broken(
        _without("nvidia-smi", expected_gpus=2),
        "nvidia-smi",
        "nvidia-smi is not on PATH, and the target expects 2 GPU(s)",
        "expected_gpus: 0",
    ),
}


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "ro", "1g", read_only=True) as mount:
        yield mount


@pytest.mark.parametrize("case", list(BROKEN), ids=list(BROKEN))
def test_the_doctor_names_the_one_problem_and_what_to_do(
    case: str, base: Target, sshd: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if "read-only" in case:
        request.getfixturevalue("read_only_folder")
    broken = BROKEN[case]
    api_url = f"http://127.0.0.1:{free_port()}/api" if broken.api_down else None
    checks = examine(broken.make(base, sshd, tmp_path, monkeypatch), api_url)
    shown = "\n".join(c.line() for c in checks)
    assert failed(checks) == {broken.fails} and skipped(checks) == broken.not_run, shown
    check = by_name(checks)[broken.fails]
    assert broken.detail in check.detail and broken.advice in check.advice, shown
    assert not passed(checks)


def test_an_unknown_host_key_is_never_recorded_even_with_trust_on_first_use(base: Target, sshd: SSHServer, tmp_path: Path) -> None:
    known_hosts = _empty_known_hosts(tmp_path)
    checks = examine(base.model_copy(update={"host": sshd.ssh_host(known_hosts_path=known_hosts, trust_on_first_use=True)}), None)
    assert Path(known_hosts).read_text() == ""
    assert "trust_on_first_use is on: the first recovery would record this key without that check" in checks[0].advice
    assert sshd.ssh_host().known_hosts_path and Path(sshd.ssh_host().known_hosts_path or "").read_text() == sshd.known_hosts_line()


def test_the_command_exits_0_on_a_good_target_and_1_naming_a_stopped_container(
    base: Target, sshd: SSHServer, tmp_path: Path, api_url: str
) -> None:
    env = cli_env(tmp_path / "home", api_url)
    good = write_target(base.model_copy(update={"host": sshd.ssh_host()}), tmp_path / "good.yaml")
    out = subprocess.run([RELAUNCH, "doctor", str(good), "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["passed"] and report["target"] == "doctor" and all(c["status"] == "ok" for c in report["checks"])

    stopped = write_target(base.model_copy(update={"host": sshd.container_host("pct", "202")}), tmp_path / "stopped.yaml")
    out = subprocess.run([RELAUNCH, "doctor", str(stopped)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "fail    container" in out.stdout and "what to do: start it with `pct start 202`" in out.stdout, out.stdout
    assert out.stdout.rstrip().endswith("1 failed, 1 not run, of 4 checks"), out.stdout


GPU_HOST = Path(__file__).parent / "fixtures" / "doctor_gpu"  # captured on an H200 host (its PROVENANCE.md)


@pytest.mark.parametrize(("expected_gpus", "gpus_status"), [(1, Status.OK), (16, Status.FAIL)])
def test_the_gpu_lines_of_a_real_gpu_host_read_as_visible_against_expected(base: Target, expected_gpus: int, gpus_status: Status) -> None:
    stdout = (GPU_HOST / f"doctor_expect_{expected_gpus}.txt").read_text()
    checks = by_name(host_checks(base, Result(0, stdout)))
    assert checks["nvidia-smi"].status is Status.OK and checks["gpus"].status is gpus_status
    if gpus_status is Status.FAIL:
        assert "only 1 GPU(s) visible, 16 expected: GPU 0: NVIDIA H200" in checks["gpus"].detail and "passthrough" in checks["gpus"].advice
    # That host had no network and the target was not offline: the lock's line says so, in uv's words.
    assert checks["lock"].status is Status.FAIL and "dns error" in checks["lock"].detail
