"""Prefect Secret blocks for the SSH transport (relaunch/wire/ssh.py reads keys and passphrases through this)."""

from __future__ import annotations

from relaunch.wire import ssh


def load_secret(name: str) -> str:
    """The value of the Secret block NAME. Prefect is imported here, on the first host whose key is kept in a block."""
    from prefect.blocks.system import Secret

    return str(Secret.load(name).get())


def install() -> None:
    ssh.use_secret_loader(load_secret)
