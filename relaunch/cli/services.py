"""`relaunch services --systemd DIR` / `--compose DIR`: the control plane as services, from templates relaunch ships
(relaunch/cli/services/): systemd units for a Prefect server and a relaunch worker (Prefect's guide "How to daemonize
worker processes"), and a compose file for the scale-out set-up of docs/operations.md (PostgreSQL, Redis, a server on
them, workers). Placeholders are `{name}` words of PLACEHOLDERS only, so the compose file's own `${VAR}` stay."""

from __future__ import annotations

import secrets
import sys
from importlib.metadata import version
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "services"
UNITS = ("prefect-server.service", "relaunch-worker.service")
COMPOSE = "compose.yaml"
# prefect-redis as the scale extra pins it (pyproject.toml), for the server image.
PREFECT_REDIS_VERSION = "0.3.0"


def fill(template: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


def values(user: str, host: str, port: int, pool: str, api_url: str | None) -> dict[str, str]:
    return {
        # The venv relaunch is installed in: its `prefect` runs the server and the worker (which imports relaunch).
        "bin": str(Path(sys.executable).parent),
        "user": user,
        "host": host,
        "port": str(port),
        "pool": pool,
        "api_url": api_url or f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/api",
        "prefect_version": version("prefect"),
        "prefect_redis_version": PREFECT_REDIS_VERSION,
        "relaunch_version": version("relaunch"),
    }


def write_systemd(folder: Path, filled: dict[str, str]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in UNITS:
        path = folder / name
        path.write_text(fill((TEMPLATES / name).read_text(), filled))
        written.append(path)
    return written


def write_compose(folder: Path, filled: dict[str, str]) -> list[Path]:
    """The compose file, and DIR/.env with random secrets when there is none (an existing one is kept)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "wheels").mkdir(exist_ok=True)
    compose = folder / COMPOSE
    compose.write_text(fill((TEMPLATES / COMPOSE).read_text(), filled))
    env = folder / ".env"
    if not env.exists():
        env.touch(mode=0o600)
        env.write_text(
            f"POSTGRES_PASSWORD={secrets.token_hex(16)}\nREDIS_PASSWORD={secrets.token_hex(16)}\nPREFECT_AUTH=relaunch:{secrets.token_hex(16)}\n"
        )
    return [compose, env]
