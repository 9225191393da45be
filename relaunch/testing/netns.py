"""Hosts of their own for tests: one Linux network namespace per host, reached through a veth pair.

    with netns_hosts(3) as net:          # net.hosts[i].address is 10.213.i.2 (10.213.i.1 is this side)
        ...
        net.down(1)                      # host 1 vanishes from the network: its packets go nowhere
        net.up(1)

    with fleet_of_hosts(3, tmp_path) as fleet:  # the same, plus an sshd per host on its own address
        fleet.servers[i].ssh_host()

    with behind_bastion(tmp_path) as route:     # a host reachable only through another host's namespace
        SSHTransport(route.target_host())        # Host with jump=[the bastion]
        route.down()                             # the bastion's link goes away (and the route with it)

Host i is namespace `relaunch-<random>-i` with address 10.213.i.2/24 and this machine's end of its link at
10.213.i.1/24 (when another session already uses those subnets, the next free block of 10.213.x.0/24 is taken).
Everything is removed on exit, failing test or not, and only what was created here: the namespaces, their veth
pairs, and the processes left inside our own namespaces. Root is needed (`ip netns add`); `require_netns()` skips
the test with the reason where it is missing, and fails it with that reason under CI=true.

`down(i)` takes host i's side of the link down, as a host that loses power or its cable: this machine keeps its
route to the host, packets to it are dropped and nothing answers, neither on an open connection nor a new one.
(Taking this machine's side down instead would drop its route, and packets for 10.213.i.2 would follow the
default route out of the machine.)

`host_behind(outer)` adds an inner host in a namespace of its own whose only link goes to `outer`'s namespace:
10.214.s.2/24, with `outer`'s end at 10.214.s.1/24 (s is `outer`'s subnet, so it is as unique as `outer`'s). This machine
has no route to it; only processes in `outer`'s namespace (its sshd, forwarding a jump) reach it. `behind_bastion`
runs an sshd on each of the two, the outer one being the bastion.

The hosts share this machine's file system and process table, so a trainer launched on "host i" is an ordinary
process here. Each host's sessions get a tmux server of their own (TMUX_TMPDIR, a short temporary folder per host),
as separate machines would; `Fleet.kill_tmux()` ends those servers through their own sockets when the test is over,
so a namespace never outlives the test through a tmux server, and no other tmux server on this machine is touched.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from relaunch.config import Host
from relaunch.testing.sshd import SSHServer, cannot_run_here, require_sshd

PREFIX = "10.213"
INNER_PREFIX = "10.214"  # links between two of our namespaces; never routed from this machine
LAN_PREFIX = "10.215"  # the hosts' own network to each other (a bridge in a namespace of its own); never routed from here
LOCK = Path("/tmp/relaunch-netns.lock")  # held while subnets are chosen and taken, across sessions


def require_netns() -> None:
    """Skip (fail under CI=true) unless this machine can make network namespaces: `ip` (iproute2) present and we are root."""
    if shutil.which("ip") is None:
        cannot_run_here("`ip` (iproute2) is missing: install it (apt-get install -y iproute2) to test hosts in network namespaces")
    if os.geteuid() != 0:
        cannot_run_here("network namespaces need root (`ip netns add`); run the tests as root to test hosts in namespaces")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["ip", *args], check=False, capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` exited {out.returncode}: {out.stderr.strip()}")
    return out


@dataclass
class NetnsHost:
    index: int
    netns: str
    root_veth: str  # this machine's end of the link
    host_veth: str  # the host's end, inside its namespace
    subnet: int  # the third octet: 10.213.<subnet>.0/24
    outer_netns: str | None = None  # where root_veth lives: None for this machine, else the namespace the host sits behind
    prefix: str = PREFIX
    lan_veth: str | None = None  # the host's end of its link to the hosts' LAN, where they have one (netns_hosts(lan=True))
    lan_address: str | None = None  # its address there: 10.215.<first host's subnet>.<index + 2>

    @property
    def address(self) -> str:
        return f"{self.prefix}.{self.subnet}.2"

    @property
    def gateway(self) -> str:
        return f"{self.prefix}.{self.subnet}.1"

    def on_link_side(self, *args: str) -> list[str]:
        """An `ip` command line run where root_veth lives."""
        return ["-n", self.outer_netns, *args] if self.outer_netns else list(args)


@dataclass
class NetnsHosts:
    hosts: list[NetnsHost] = field(default_factory=list)
    gone: set[int] = field(default_factory=set)  # hosts whose link is down now

    def __getitem__(self, i: int) -> NetnsHost:
        return self.hosts[i]

    def __len__(self) -> int:
        return len(self.hosts)

    def down(self, i: int) -> None:
        """Host i goes away: its end of the link goes down (of its LAN link too); nothing it had open is told."""
        h = self.hosts[i]
        ip("-n", h.netns, "link", "set", "dev", h.host_veth, "down")
        if h.lan_veth:
            ip("-n", h.netns, "link", "set", "dev", h.lan_veth, "down")
        self.gone.add(i)

    def up(self, i: int) -> None:
        """Host i is back on the network (its processes never stopped)."""
        h = self.hosts[i]
        ip("-n", h.netns, "link", "set", "dev", h.host_veth, "up")
        if h.lan_veth:
            ip("-n", h.netns, "link", "set", "dev", h.lan_veth, "up")
        self.gone.discard(i)
        # The address comes back with the link; wait until this side has its route and carrier again.
        deadline = time.monotonic() + 10
        while (
            "linkdown" in ip("-4", "route", "show", "dev", h.root_veth).stdout
            or "NO-CARRIER" in ip("-o", "link", "show", "dev", h.root_veth).stdout
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{h.root_veth} has no carrier 10 s after {h.host_veth} came up")
            time.sleep(0.02)


def _subnets_in_use() -> set[int]:
    text = ip("-4", "-o", "addr", "show").stdout + ip("-4", "route", "show", "table", "all").stdout
    return {int(m) for m in re.findall(rf"\b{re.escape(PREFIX)}\.(\d+)\.", text)}


def _free_block(n: int) -> int:
    used = _subnets_in_use()
    for base in range(256 - n + 1):
        if not used & set(range(base, base + n)):
            return base
    raise RuntimeError(f"no {n} free subnets left in {PREFIX}.0.0/16")


def _remove(host: NetnsHost) -> list[str]:
    """Everything made for one host; returns what could not be removed."""
    problems: list[str] = []
    # Processes still inside our namespace were started there by this test (through its sshd): end them by id.
    pids = ip("netns", "pids", host.netns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    # Deleting one end of a veth pair deletes both.
    if ip(*host.on_link_side("link", "show", "dev", host.root_veth), check=False).returncode == 0:
        out = ip(*host.on_link_side("link", "del", "dev", host.root_veth), check=False)
        if out.returncode != 0:
            problems.append(f"veth {host.root_veth}: {out.stderr.strip()}")
    if host.netns in ip("netns", "list", check=False).stdout.split():
        out = ip("netns", "del", host.netns, check=False)
        if out.returncode != 0:
            problems.append(f"netns {host.netns}: {out.stderr.strip()}")
    return problems


def _add_lan(net: NetnsHosts, lan_netns: str, tag: str) -> None:
    """The hosts' own network: a bridge in namespace `lan_netns`, each host linked to it with an address on one subnet,
    as the nodes of a cluster reach each other. This machine has no route to it."""
    ip("netns", "add", lan_netns)
    ip("-n", lan_netns, "link", "add", "br0", "type", "bridge")
    ip("-n", lan_netns, "link", "set", "dev", "br0", "up")
    subnet = net.hosts[0].subnet
    for h in net.hosts:
        h.lan_veth, h.lan_address = f"rl{tag}e{h.index}", f"{LAN_PREFIX}.{subnet}.{h.index + 2}"
        switch_end = f"rl{tag}s{h.index}"
        ip("-n", lan_netns, "link", "add", switch_end, "type", "veth", "peer", "name", h.lan_veth, "netns", h.netns)
        ip("-n", lan_netns, "link", "set", "dev", switch_end, "master", "br0")
        ip("-n", lan_netns, "link", "set", "dev", switch_end, "up")
        ip("-n", h.netns, "addr", "add", f"{h.lan_address}/24", "dev", h.lan_veth)
        ip("-n", h.netns, "link", "set", "dev", h.lan_veth, "up")


@contextmanager
def netns_hosts(n: int, lan: bool = False) -> Iterator[NetnsHosts]:
    """n hosts, each in its own namespace with its own address; with `lan`, also on a network of their own
    (host.lan_address, reachable from the other hosts only). All removed on exit."""
    require_netns()
    tag = uuid.uuid4().hex[:6]
    net = NetnsHosts()
    lan_netns = f"relaunch-{tag}-lan"
    try:
        with LOCK.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another session choosing subnets waits until ours exist
            base = _free_block(n)
            for i in range(n):
                # Interface names are at most 15 characters: rl<tag>r<i> / rl<tag>h<i>.
                host = NetnsHost(i, f"relaunch-{tag}-{i}", f"rl{tag}r{i}", f"rl{tag}h{i}", base + i)
                ip("netns", "add", host.netns)
                net.hosts.append(host)
                ip("link", "add", host.root_veth, "type", "veth", "peer", "name", host.host_veth, "netns", host.netns)
                ip("addr", "add", f"{host.gateway}/24", "dev", host.root_veth)
                ip("link", "set", "dev", host.root_veth, "up")
                ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.host_veth)
                ip("-n", host.netns, "link", "set", "dev", host.host_veth, "up")
                ip("-n", host.netns, "link", "set", "dev", "lo", "up")
            if lan:
                _add_lan(net, lan_netns, tag)
            for i in range(n):
                net.up(i)  # waits for the carrier on this side
        yield net
    finally:
        problems = [p for host in net.hosts for p in _remove(host)]
        if lan and lan_netns in ip("netns", "list", check=False).stdout.split():
            out = ip("netns", "del", lan_netns, check=False)  # its bridge and switch ends go with it
            if out.returncode != 0:
                problems.append(f"netns {lan_netns}: {out.stderr.strip()}")
        if problems:
            raise RuntimeError("could not clean up the test's network namespaces: " + "; ".join(problems))


@dataclass
class Fleet:
    """Hosts in namespaces, each with its own sshd on its own address."""

    net: NetnsHosts
    servers: list[SSHServer]
    tmux_dirs: list[Path]

    def down(self, i: int) -> None:
        self.net.down(i)

    def up(self, i: int) -> None:
        self.net.up(i)

    def kill_tmux(self) -> None:
        """End each host's own tmux server through its socket (never another tmux server on this machine)."""
        for folder in self.tmux_dirs:
            for socket in folder.glob("tmux-*/*"):
                subprocess.run(["tmux", "-S", str(socket), "kill-server"], check=False, capture_output=True, timeout=10)


@contextmanager
def fleet_of_hosts(n: int, workdir: Path, bin_first: dict[int, Path] | None = None, lan: bool = False) -> Iterator[Fleet]:
    """n hosts in namespaces, each running sshd on 10.213.i.2 with its own keys and known_hosts; all gone on exit.
    `bin_first`: host i's sessions find the commands of this folder first (stand-ins that make it a GPU host).
    With `lan`, the hosts also reach each other on a network of their own (the nodes of a multi-node run)."""
    require_sshd()
    with netns_hosts(n, lan=lan) as net, ExitStack() as stack:
        fleet = Fleet(net, [], [])
        for host in net.hosts:
            folder = workdir / f"sshd-{host.index}"
            folder.mkdir(parents=True)
            # A short path of its own: a tmux socket's path must fit in 108 bytes.
            tmux_dir = Path(tempfile.mkdtemp(prefix="relaunch-tmux-"))
            stack.callback(shutil.rmtree, tmux_dir, True)
            fleet.tmux_dirs.append(tmux_dir)
            server = SSHServer(
                folder,
                hostname=host.address,
                netns=host.netns,
                env={"TMUX_TMPDIR": str(tmux_dir)},
                bin_first=(bin_first or {}).get(host.index),
            )
            stack.callback(server.stop)
            server.start()
            fleet.servers.append(server)
        stack.callback(fleet.kill_tmux)  # runs before the sshds stop
        stack.callback(lambda: [net.up(i) for i in sorted(net.gone)])  # and this first of all
        yield fleet


@contextmanager
def host_behind(outer: NetnsHost) -> Iterator[NetnsHost]:
    """A host linked only to `outer`'s namespace (10.214.s.2, `outer` at 10.214.s.1); removed on exit, failing test or not."""
    tag = uuid.uuid4().hex[:6]
    inner = NetnsHost(
        outer.index,
        f"relaunch-{tag}-in{outer.index}",
        f"rl{tag}o{outer.index}",
        f"rl{tag}i{outer.index}",
        outer.subnet,
        outer.netns,
        INNER_PREFIX,
    )
    try:
        ip("netns", "add", inner.netns)
        ip("-n", outer.netns, "link", "add", inner.root_veth, "type", "veth", "peer", "name", inner.host_veth, "netns", inner.netns)
        ip("-n", outer.netns, "addr", "add", f"{inner.gateway}/24", "dev", inner.root_veth)
        ip("-n", outer.netns, "link", "set", "dev", inner.root_veth, "up")
        ip("-n", inner.netns, "addr", "add", f"{inner.address}/24", "dev", inner.host_veth)
        ip("-n", inner.netns, "link", "set", "dev", inner.host_veth, "up")
        ip("-n", inner.netns, "link", "set", "dev", "lo", "up")
        yield inner
    finally:
        problems = _remove(inner)
        if problems:
            raise RuntimeError("could not clean up the test's network namespaces: " + "; ".join(problems))


@dataclass
class BehindBastion:
    """A bastion (host 0 of a one-host fleet, on this machine's network) and a target reachable only through it."""

    bastion: Fleet
    inner: NetnsHost
    target: SSHServer

    @property
    def bastion_server(self) -> SSHServer:
        return self.bastion.servers[0]

    def target_host(self, **overrides: object) -> Host:
        """The target as relaunch sees it: jump=[the bastion] unless overridden."""
        return self.target.ssh_host(**{"jump": [self.bastion_server.jump_host()], **overrides})

    def down(self) -> None:
        """The bastion's link to this machine goes down: both it and the target vanish for us."""
        self.bastion.down(0)

    def up(self) -> None:
        """The bastion's link is back. The address resolution that failed during the outage is forgotten, as it would be
        after any longer outage: a resolution still pending from then may otherwise fail the first new connection with
        "No route to host" (a transient error that a retry gets past, and a race for a test)."""
        self.bastion.up(0)
        host = self.bastion.net.hosts[0]
        ip("neigh", "flush", "to", host.address, "dev", host.root_veth)


@contextmanager
def behind_bastion(workdir: Path) -> Iterator[BehindBastion]:
    """A bastion and a target behind it, each with its own sshd, keys and known_hosts; all gone on exit."""
    with fleet_of_hosts(1, workdir / "bastion") as bastion, host_behind(bastion.net.hosts[0]) as inner, ExitStack() as stack:
        folder = workdir / "target"
        folder.mkdir(parents=True)
        target = SSHServer(folder, hostname=inner.address, netns=inner.netns, reachable_from_here=False)
        stack.callback(target.stop)
        target.start()
        yield BehindBastion(bastion, inner, target)
