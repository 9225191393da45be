"""SSH as the user has it: a host named by its `~/.ssh/config` alias (`ssh_config: true`), resolved as OpenSSH would.

Read with paramiko's SSHConfig (what fabric's load_ssh_configs uses), from the config of whoever runs relaunch
(the worker's HOME). Of each alias: HostName, User, Port, IdentityFile (the first that exists), UserKnownHostsFile
(the first), ProxyJump (each jump host looked up in the config in turn, as OpenSSH does). A field the target file
sets wins over the config, as an option on `ssh`'s command line does. ProxyCommand is refused (only ProxyJump is
followed); a jump host's own ProxyJump is not followed (OpenSSH would chain it): list the whole chain in ProxyJump.

Host keys are still verified as without it (relaunch/wire/ssh.py, never AutoAddPolicy): StrictHostKeyChecking is not read.
A key file's passphrase is per host: the Secret block `ssh-passphrase-<alias>` when it exists (passphrase_block).
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass
from pathlib import Path

import paramiko

from relaunch.config import Host, JumpHost, SSHLogin
from relaunch.errors import ConfigError

CONFIG_PATH = "~/.ssh/config"
# `[user@]host[:port]`, one entry of ProxyJump (the ssh:// form too).
JUMP = re.compile(r"^(?:ssh://)?(?:(?P<user>[^@]+)@)?(?P<host>\[[^\]]+\]|[^:]+)(?::(?P<port>\d+))?$")


@dataclass(frozen=True)
class Resolved:
    """The host as the config makes it, and the alias each hop was looked up by (jump hosts first, the host last)."""

    host: Host
    aliases: list[str]


def passphrase_block(alias: str) -> str:
    """The Secret block holding the passphrase of the key used for the config's host `alias` (a block name: a slug)."""
    return "ssh-passphrase-" + re.sub(r"[^a-z0-9-]+", "-", alias.lower()).strip("-")


def load_config(path: str = CONFIG_PATH) -> paramiko.SSHConfig:
    """The user's SSH config; an absent file is an empty config (every alias is then its own hostname)."""
    file = Path(os.path.expanduser(path))
    try:
        return paramiko.SSHConfig.from_path(str(file)) if file.exists() else paramiko.SSHConfig()
    except (OSError, UnicodeDecodeError, paramiko.ConfigParseError) as exc:
        raise ConfigError(f"{file}: cannot read the SSH config (host.ssh_config is on): {exc}") from None


def resolve(host: Host, config: paramiko.SSHConfig | None = None) -> Resolved:
    """`host` with what the SSH config says of its alias filled in; unchanged when `ssh_config` is off."""
    if not host.ssh_config:
        return Resolved(host, [])
    config = config if config is not None else load_config()
    found = config.lookup(host.hostname)
    if "proxycommand" in found and found["proxycommand"].lower() != "none":
        raise ConfigError(
            f"{CONFIG_PATH}: Host {host.hostname} uses ProxyCommand, which relaunch does not run: use ProxyJump for jump hosts, "
            "or give them in the target's host.jump"
        )
    update = _login(host, found)
    # Jump hosts the target file lists are named by their hostname, so that every hop has its passphrase block.
    aliases = [j.hostname for j in host.jump]
    if "jump" not in host.model_fields_set and found.get("proxyjump", "none").lower() != "none":
        jumps = []
        for entry in found["proxyjump"].split(","):
            jump, alias = _jump(entry.strip(), config, host)
            jumps.append(jump)
            aliases.append(alias)
        update["jump"] = jumps
    return Resolved(host.model_copy(update=update), [*aliases, host.hostname])


def _login(login: SSHLogin, found: paramiko.SSHConfigDict) -> dict[str, object]:
    """The fields of `login` the config fills: those the target file left unset."""
    given = login.model_fields_set
    update: dict[str, object] = {"hostname": found["hostname"]}
    if "user" not in given:
        update["user"] = found.get("user") or getpass.getuser()
    if "port" not in given and "port" in found:
        update["port"] = int(found["port"])
    if not ({"key_path", "key_secret_block"} & given):
        existing = [p for p in map(os.path.expanduser, found.get("identityfile", [])) if Path(p).is_file()]
        if existing:
            update["key_path"] = existing[0]
    if "known_hosts_path" not in given and found.get("userknownhostsfile"):
        update["known_hosts_path"] = os.path.expanduser(found["userknownhostsfile"].split()[0])
    return update


def _jump(entry: str, config: paramiko.SSHConfig, host: Host) -> tuple[JumpHost, str]:
    m = JUMP.match(entry)
    if not m:
        raise ConfigError(f"{CONFIG_PATH}: Host {host.hostname}: ProxyJump entry {entry!r} is not [user@]host[:port]")
    alias = m["host"].strip("[]")
    # A user or port written in the entry wins over the jump host's own config section, as with OpenSSH.
    given = {k: v for k, v in {"user": m["user"], "port": int(m["port"]) if m["port"] else None}.items() if v is not None}
    bare = JumpHost.model_validate({"hostname": alias, **given})
    return JumpHost.model_validate({**bare.model_dump(), **_login(bare, config.lookup(alias))}), alias
