"""Pure checks of the paths a target names. A path that could make relaunch touch the user's work is refused here,
before anything runs: these are the only guards that hold on every host, whatever its shell does with the value.
"""

from __future__ import annotations

import posixpath
import string

# Control characters turn one path into two wherever a tool prints a list (`ls`, `find`): a venv_dir of
# "/x/precious\nx/venv" once made a line-splitting prune delete /x/precious.
CONTROL = {chr(c) for c in range(32)} | {"\x7f"}

# Folders of the system itself: a cache or venv may never be one of them, nor hold one.
SYSTEM_DIRS = frozenset(
    "/ /bin /boot /dev /etc /home /lib /lib32 /lib64 /libx32 /media /mnt /opt /proc /root /run /sbin /snap /srv /sys /tmp /usr /var "
    "/var/tmp /var/lib /var/log /var/cache /usr/local /usr/lib /usr/bin /workspace /data /scratch".split()
)
# Folders whose insides belong to the operating system: nothing relaunch clears may live there.
SYSTEM_TREES = frozenset("/bin /boot /dev /etc /lib /lib32 /lib64 /libx32 /proc /sbin /sys /usr".split())


def check_clean_text(value: str) -> str:
    bad = sorted({repr(c) for c in value if c in CONTROL})
    if bad:
        raise ValueError(f"{value!r} contains control characters ({', '.join(bad)}); paths and names may not")
    return value


def normalise(path: str) -> str:
    """`..` and `//` resolved lexically, as the host would after following no links."""
    return posixpath.normpath(path) if not path.startswith("//") else posixpath.normpath("/" + path.lstrip("/"))


def check_host_path(value: str) -> str:
    check_clean_text(value)
    if not value.startswith("/"):
        raise ValueError(f"{value!r} must be an absolute path on the host")
    return value


def check_relative_path(value: str) -> str:
    """restore_paths: inside the repo, always."""
    check_clean_text(value)
    if not value or value.startswith("/"):
        raise ValueError(f"{value!r} must be a path relative to repo_dir")
    if ".." in value.split("/"):
        raise ValueError(f"{value!r} climbs out of repo_dir ('..'); name paths inside the repo")
    return value


def check_resume_arg(value: str) -> str:
    """Only `{checkpoint}` may be a placeholder; `{0}` or `{checkpoint.__class__}` would be format() attacks."""
    check_clean_text(value)
    try:
        fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(value) if name is not None]
    except ValueError as exc:
        raise ValueError(f"{value!r}: {exc}; write literal braces as {{{{ and }}}}") from None
    for name, spec, conv in fields:
        if name != "checkpoint" or spec or conv:
            raise ValueError(
                f"{value!r}: the only placeholder allowed is {{checkpoint}}, found {{{name}{'!' + conv if conv else ''}{':' + spec if spec else ''}}}"
            )
    return value


def is_inside(path: str, folder: str) -> bool:
    """path equals folder or lies below it (both normalised)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def overlaps(a: str, b: str) -> bool:
    return is_inside(a, b) or is_inside(b, a)


def check_cache_dir_is_dedicated(cache: str, protected: dict[str, str]) -> None:
    """The cache is cleared: it may not equal, hold or lie inside any folder of the user's work or the system."""
    _check_dedicated(
        "inductor_cache_dir",
        cache,
        protected,
        "clearing the cache would touch it; use a dedicated folder such as /tmp/torchinductor_<user>",
    )


def check_venv_dir_is_dedicated(venv: str, protected: dict[str, str]) -> None:
    """The venv is moved aside and replaced: it may not equal or hold logs, checkpoints or relaunch's own state."""
    _check_dedicated("venv_dir", venv, protected, "replacing the venv would move it; give the venv its own folder")


def _check_dedicated(field: str, given: str, protected: dict[str, str], why: str) -> None:
    path = normalise(given)
    for other, folder in protected.items():
        if overlaps(path, normalise(folder)):
            raise ValueError(f"{field} {given!r} overlaps {other} {folder!r}: {why}")
    _check_not_system(path, field, given)


def _check_not_system(path: str, field: str, given: str) -> None:
    top_level = path.count("/") < 2
    if top_level or _is_home(path) or any(is_inside(system, path) for system in SYSTEM_DIRS):
        raise ValueError(f"{field} {given!r} is a system or top-level folder (or holds one); use a dedicated folder below it")
    for tree in SYSTEM_TREES:
        if is_inside(path, tree):
            raise ValueError(f"{field} {given!r} lies inside the system folder {tree}; use a dedicated folder elsewhere")


def _is_home(path: str) -> bool:
    return posixpath.dirname(path) == "/home"
