"""Arbitrary text survives every layer byte for byte: as an argument, an env value and a cwd.

Layers: this machine, this machine + pct/docker stand-in, SSH, SSH + pct/docker stand-in.
The stand-ins `exec "$@"` without re-quoting, so all quoting is done by relaunch and real shells.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relaunch.config import Container, Host
from relaunch.testing.sshd import BIN, SSHServer, sshd  # noqa: F401  (sshd is a fixture)
from relaunch.wire.commands import Command, script
from relaunch.wire.ssh import SSHTransport
from relaunch.wire.transport import LocalTransport, Transport

LAYERS = ["local", "local+pct", "local+docker", "ssh", "ssh+pct", "ssh+docker"]
CONTAINER_IDS = {"pct": "201", "docker": "trainer"}

# Any character but NUL (argv strings end at NUL) and lone surrogates (not encodable, so not text on a wire).
_any = st.characters(codec="utf-8", exclude_characters="\x00")
_nasty = st.sampled_from(
    [
        "'",
        '"',
        "\\",
        "$",
        "`",
        "$(id)",
        "`id`",
        "${HOME}",
        "$1",
        "!",
        "!!",
        "*",
        "?",
        "[a]",
        "{a,b}",
        "~",
        "#",
        ";",
        "&&",
        "|",
        ">",
        "<",
        "(",
        ")",
        "\n",
        "\t",
        " ",
        "\r",
        "-",
        "--",
        "-n",
        "-e",
        "%s",
        "%",
        "\\n",
        "é",
        "日本",
        "🙂",
        "\u200b",
        "\x7f",
        "\x1b[0m",
    ]
)
TEXT = st.lists(st.one_of(_nasty, st.text(_any, max_size=12)), max_size=10).map("".join)
DIR_NAME = TEXT.filter(lambda s: s not in ("", ".", "..") and "/" not in s and len(s.encode()) <= 255)


@pytest.fixture(scope="module")
def local_env() -> Iterator[None]:
    """PATH and container states for the local stand-in layers (LocalTransport inherits our environment)."""
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        containers = Path(tmp) / "containers"
        containers.write_text("".join(f"{cid}\n" for cid in CONTAINER_IDS.values()))
        mp.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
        mp.setenv("RELAUNCH_FAKE_CONTAINERS_FILE", str(containers))
        yield


@pytest.fixture(scope="module")
def transports(sshd: SSHServer, local_env: None) -> Iterator[dict[str, Transport]]:
    def container(layer: str) -> Container | None:
        kind = layer.partition("+")[2]
        return Container(kind=kind, id=CONTAINER_IDS[kind]) if kind else None  # type: ignore[arg-type]

    made: dict[str, Transport] = {}
    for layer in LAYERS:
        if layer.startswith("ssh"):
            made[layer] = SSHTransport(sshd.ssh_host(container=container(layer)))
        else:
            made[layer] = LocalTransport(Host(container=container(layer)))
    yield made
    for t in made.values():
        t.close()


@pytest.fixture(scope="module")
def dirs() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="relaunch-cwd-") as tmp:
        yield Path(os.path.realpath(tmp))  # realpath: $PWD must equal the path we cd'd to


@pytest.mark.parametrize("layer", LAYERS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=TEXT)
def test_an_argument_arrives_byte_for_byte(transports: dict[str, Transport], layer: str, value: str) -> None:
    result = transports[layer].execute(script('printf %s "$1"', value, label="echo"))
    assert (result.exit_code, result.stderr, result.stdout) == (0, "", value)


@pytest.mark.parametrize("layer", LAYERS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=TEXT)
def test_an_env_value_arrives_byte_for_byte(transports: dict[str, Transport], layer: str, value: str) -> None:
    result = transports[layer].execute(Command(argv=("printenv", "X"), env=(("X", value),)))
    assert (result.exit_code, result.stderr, result.stdout) == (0, "", value + "\n")


@pytest.mark.parametrize("layer", LAYERS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=DIR_NAME)
def test_a_working_directory_with_any_name_is_entered(transports: dict[str, Transport], dirs: Path, layer: str, name: str) -> None:
    path = dirs / name
    path.mkdir(exist_ok=True)  # sshd and the stand-ins run on this machine, so one directory serves every layer
    result = transports[layer].execute(script('printf %s "$PWD"', label="pwd", cwd=str(path)))
    assert (result.exit_code, result.stderr, result.stdout) == (0, "", str(path))


def test_local_transport_keeps_carriage_returns() -> None:
    assert LocalTransport(Host()).execute(script('printf %s "$1"', "a\r\nb\rc", label="echo")).stdout == "a\r\nb\rc"


def test_ssh_keeps_carriage_returns(transports: dict[str, Transport]) -> None:
    assert transports["ssh+pct"].execute(script('printf %s "$1"', "a\r\nb\rc", label="echo")).stdout == "a\r\nb\rc"
