"""SSH round trips through relaunch's own SSHTransport, against a real OpenSSH server on loopback.

Starts sshd on 127.0.0.1 as the tests do (relaunch/testing/sshd.py: its own host and user keys, a free port), then times
`transport.execute(Command(argv=("true",)))`, which runs `timeout ... bash --noprofile --norc -c true` on the
host as every relaunch command does:

* first command: a new SSHTransport each time, so the time includes TCP connect, the SSH handshake, host-key
  check, key load and public-key authentication (what the first step or poll of a flow run pays);
* reused connection: one SSHTransport, many commands over its one connection (what every later step and
  every health poll pays); sshd's log must show exactly one login for the whole series;
* reused connection through the `pct exec` stand-in (relaunch/testing/bin/pct), one more layer of quoting and a process.

Prints JSON: milliseconds per command, summarised by bench/stats.py (median, nearest-rank p95, max), and
the raw samples. Takes about 10 s.

Usage: .venv/bin/python bench/ssh_round_trips.py [--connections 30] [--commands 300] [--pct-commands 50]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.stats import P95_METHOD, machine, summary  # noqa: E402
from relaunch.testing.sshd import SSHD, running_sshd  # noqa: E402
from relaunch.wire.commands import Command  # noqa: E402
from relaunch.wire.ssh import SSHTransport  # noqa: E402

TRUE = Command(argv=("true",))


def timed(transport: SSHTransport) -> float:
    start = time.perf_counter()
    result = transport.execute(TRUE)
    elapsed = time.perf_counter() - start
    if result.exit_code != 0:
        raise SystemExit(f"`true` exited {result.exit_code} over SSH: {result.stderr[-500:]}")
    return elapsed * 1000


def first_commands(server, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        transport = SSHTransport(server.ssh_host())
        try:
            samples.append(timed(transport))
        finally:
            transport.close()
    return samples


def reused(server, host, n: int) -> tuple[list[float], int]:
    """n commands over one connection, after one untimed command that opens it; returns the logins it took."""
    before = server.accepted_logins()
    transport = SSHTransport(host)
    try:
        timed(transport)  # opens the connection: not part of this series
        paramiko_transport = transport.connection.transport
        samples = []
        for _ in range(n):
            samples.append(timed(transport))
            if transport.connection.transport is not paramiko_transport:
                raise SystemExit("the connection was replaced mid-series: the numbers would include a reconnect")
    finally:
        transport.close()
    return samples, server.accepted_logins() - before


def sshd_version() -> str:
    out = subprocess.run([SSHD, "-V"], capture_output=True, text=True)
    text = (out.stderr or out.stdout).strip()
    return text.splitlines()[0] if text else "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=30, help="First commands, each on a new connection.")
    parser.add_argument("--commands", type=int, default=300, help="Commands on one reused connection.")
    parser.add_argument("--pct-commands", type=int, default=50, help="Commands on one reused connection through the pct stand-in.")
    args = parser.parse_args()
    if not Path(SSHD).exists():
        raise SystemExit(f"{SSHD} missing: apt-get install -y openssh-server")
    started = machine()
    with running_sshd() as server:
        timed_first = first_commands(server, args.connections)
        timed_reused, logins = reused(server, server.ssh_host(), args.commands)
        if logins != 1:
            raise SystemExit(f"expected one login for the reused series, sshd logged {logins}")
        timed_pct, pct_logins = reused(server, server.container_host("pct", "201"), args.pct_commands)
    print(
        json.dumps(
            {
                "what": "milliseconds per relaunch command (`true` under timeout and bash --noprofile --norc) through SSHTransport to OpenSSH on 127.0.0.1",
                "machine": started,
                "sshd": sshd_version(),
                "paramiko": importlib.metadata.version("paramiko"),
                "fabric": importlib.metadata.version("fabric"),
                "p95_method": P95_METHOD,
                "first_command_with_handshake": summary(timed_first, unit="ms", digits=2),
                "reused_connection": {**summary(timed_reused, unit="ms", digits=2), "logins": logins},
                "reused_connection_pct": {**summary(timed_pct, unit="ms", digits=2), "logins": pct_logins},
                "samples_ms": {
                    "first_command_with_handshake": [round(x, 2) for x in timed_first],
                    "reused_connection": [round(x, 2) for x in timed_reused],
                    "reused_connection_pct": [round(x, 2) for x in timed_pct],
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
