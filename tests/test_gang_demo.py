"""`relaunch demo --scenario multi-node` as typed: a two-node gang, a rank killed on node 1, healthy after a gang
relaunch; its namespaces, sshds and trainers gone when it ends, and when Ctrl-C ends it midway."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from relaunch.testing.netns import ip, require_netns
from relaunch.testing.sshd import require_sshd
from tests.test_multirank import started_under

RELAUNCH = Path(sys.executable).parent / "relaunch"


def namespaces(stderr: str) -> list[str]:
    """The namespaces the demo said it made."""
    line = next((x for x in stderr.splitlines() if "two hosts in network namespaces:" in x), "")
    return re.findall(r"(relaunch-[0-9a-f]+-\d) \(", line)


def left_behind(spaces: list[str], folder: Path) -> list[str]:
    listed = set(ip("netns", "list").stdout.split())
    return [f"netns {s}" for s in spaces if s in listed] + [f"pid {p}" for p in started_under(folder)]


def test_the_multi_node_demo_kills_a_rank_on_the_second_node_and_ends_healthy_after_a_gang_relaunch_leaving_nothing_behind(tmp_path):
    require_netns()
    require_sshd()
    out = subprocess.run(
        [str(RELAUNCH), "demo", "--scenario", "multi-node", "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    told = f"stdout:\n{out.stdout}\nstderr:\n{out.stderr[-3000:]}"
    assert out.returncode == 0, told
    first = out.stdout.splitlines()[0]
    assert first.startswith("attempt 1: crashed (killed) -> relaunch  node 1 (root@") and "rank 1 (local_rank 0, pid" in first, told
    assert re.search(r"^    stop .* node 0$", out.stdout, re.M) and re.search(r"^    launch .* node 1$", out.stdout, re.M), told
    assert "verdict: healthy" in out.stdout, told
    spaces = namespaces(out.stderr)
    assert len(spaces) == 2, told
    assert not left_behind(spaces, tmp_path), left_behind(spaces, tmp_path)


def test_ctrl_c_during_the_multi_node_demo_removes_its_namespaces_and_stops_its_gang(tmp_path):
    require_netns()
    require_sshd()
    err = tmp_path / "stderr"
    with err.open("w") as sink:
        demo = subprocess.Popen(
            [str(RELAUNCH), "demo", "--scenario", "multi-node", "--workdir", str(tmp_path / "work")],
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
        try:
            deadline = time.monotonic() + 120
            while "the gang steps" not in err.read_text():  # its trainers run on both hosts
                assert demo.poll() is None and time.monotonic() < deadline, err.read_text()
                time.sleep(0.1)
            demo.send_signal(signal.SIGINT)
            code = demo.wait(timeout=60)
        finally:
            if demo.poll() is None:
                demo.kill()
    spaces = namespaces(err.read_text())
    assert code != 0 and len(spaces) == 2, err.read_text()
    assert not left_behind(spaces, tmp_path), left_behind(spaces, tmp_path)
