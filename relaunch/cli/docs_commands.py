"""`relaunch docs [NAME]`: the docs the README links to, shipped inside the package, so that an installed wheel (a
bastion, a worker: no checkout) has them too."""

from __future__ import annotations

import sys
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

import typer

import relaunch
from relaunch.cli.root import app


def shipped() -> dict[str, str]:
    """NAME -> its text, for each docs/NAME.md in the package (in a checkout's editable install: the checkout's docs/,
    which setuptools' editable finder does not import as a package without an __init__.py)."""
    try:
        folder: Traversable = files("relaunch.docs")
    except ModuleNotFoundError:
        folder = Path(relaunch.__file__).resolve().parent.parent / "docs"
    return {
        p.name.removesuffix(".md"): p.read_text(encoding="utf-8")
        for p in sorted(folder.iterdir(), key=lambda p: p.name)
        if p.name.endswith(".md")
    }


def _title(text: str) -> str:
    return next((line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")), "")


@app.command("docs")
def docs_command(name: str | None = typer.Argument(None, help="A doc's name (operations, design, ...); none: list them.")) -> None:
    """Print one of relaunch's docs (shipped in the package), or list them."""
    docs = shipped()
    if name is None:
        width = max(map(len, docs))
        for doc, text in docs.items():
            print(f"{doc:<{width}}  {_title(text)}")
        print("\nrelaunch docs NAME prints one (a pager: relaunch docs NAME | less)")
        return
    key = name.removeprefix("docs/").removesuffix(".md")
    if key not in docs:
        print(f"relaunch: no doc {name!r}; there are: {', '.join(docs)}", file=sys.stderr)
        raise typer.Exit(2)
    print(docs[key], end="")
