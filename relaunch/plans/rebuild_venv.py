"""The host commands of a venv rebuild (build aside, then swap) and the pure readings of the lock and the venv; no Prefect.

tasks/rebuild_venv.py says why the build is split in two and why a relocatable venv is renamed into place.
"""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from relaunch.config import Target
from relaunch.host import host_script
from relaunch.plans.leftovers import tracked
from relaunch.steps import BuildDetail
from relaunch.wire.commands import Command, script

BUILDING_MARKER = ".relaunch-building"
# Written last into a venv built aside: its first line is the rebuild's stamp, its second the build's findings
# (BuildDetail as JSON). Present means complete: the swap takes only such a build, of its own stamp.
BUILT_RECORD = ".relaunch-built"

# After the stop: move the current venv aside and rename the build into place (refused under a live trainer).
MOVE_ASIDE = host_script("venv_move_aside")

# A failed build aside is kept as VENV.failed-STAMP; the venv was never touched.
PUT_BACK = host_script("venv_put_back")

# The siblings of the venv, NUL-separated: the prune decides in Python, so no name is ever split.
LIST_SIBLINGS = host_script("list_siblings")

# Remove the named old venvs; each must still be a `VENV.old-*` sibling, whatever the caller sent.
REMOVE_OLD = host_script("remove_old_venvs")

# $1 python, $2 the folder to build in (VENV.new-STAMP), $3 marker, $4 1 for system site packages, $5 the
# site-dirs program, $6 the venv, $7 the built record's name.
# First, builds of earlier recoveries that never reached their swap (a killed orchestrator, a failed stop)
# are kept aside as .incomplete-* (half-built or unrecorded) or .unused-* (complete): they are not this
# rebuild's, and they are never deleted. Then uv venv, relocatable; with system_site_packages the venv also
# sees the interpreter's own packages. uv builds a venv from its interpreter's base, so where that
# interpreter is itself a venv (the H200 image's python3 is /opt/torch/.venv/bin/python3, torch inside)
# `--system-site-packages` alone would show the base's bare site-packages: a .pth adds the interpreter's
# own, after the venv's, as system site-packages come.
CREATE = """set -e
for d in "$6".new-*; do
  [ -e "$d" ] || continue
  s=${d#"$6".new-} kind=unused
  { [ -e "$d/$3" ] || [ ! -f "$d/$7" ]; } && kind=incomplete
  dest="$6.$kind-$s" n=1
  while [ -e "$dest" ]; do dest="$6.$kind-$s.$n" n=$((n + 1)); done
  mv -T -- "$d" "$dest"
  echo "an earlier build that was never swapped in is kept as $dest"
done
if [ "$4" = 1 ]; then
  uv venv --relocatable --system-site-packages --python "$1" "$2"
  site=$("$2/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  "$1" -c "$5" > "$site/_relaunch_interpreter_site.pth"
else
  uv venv --relocatable --python "$1" "$2"
fi
if [ -n "$3" ]; then touch "$2/$3"; fi"""
INTERPRETER_SITE = "import site, sys\nif sys.prefix != sys.base_prefix:\n    print('\\n'.join(site.getsitepackages()))"

# The build is complete: the marker goes first, then the record is written whole (a rename), so a build
# cut off in between has neither and counts as incomplete. $1 folder, $2 marker, $3 record, $4 stamp, $5 JSON.
MARK = """set -e
rm -f -- "$1/$2"
printf '%s\\n%s\\n' "$4" "$5" > "$1/$3.tmp"
mv -f -- "$1/$3.tmp" "$1/$3\""""

# Run in the new venv: every distribution it sees from outside itself (the image's), and the distributions
# the import-checked modules belong to. JSON, one line.
IMAGE_PROBE = """import importlib.metadata as md, json, os, sys
inside = os.path.realpath(sys.prefix) + os.sep
image = {}
for d in md.distributions():
    if d.metadata["Name"] and not os.path.realpath(str(d.locate_file(""))).startswith(inside):
        image.setdefault(d.metadata["Name"], d.version)
tops = md.packages_distributions()
print(json.dumps({"image": image, "used": sorted({n for m in sys.argv[1:] for n in tops.get(m.split(".")[0], [])})}))"""

IMPORT_CHECK = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n    print('imported', m)"

# A pip comment: `#` at the start of a line or after whitespace (a URL's `#egg=` fragment is not one).
COMMENT = re.compile(r"(^|\s)#.*$")
# A URL's scheme (`https`, `git+https`, `file`), and a VCS reference without one (`git+git@host:repo`).
URL_SCHEME = re.compile(r"(?i)(?<![\w+.-])([a-z][a-z0-9+.-]*)://")
VCS_PREFIX = re.compile(r"(?i)(?<![\w+.-])(?:git|hg|svn|bzr)\+")
# Index options are ignored under --no-index; every other line is installed from what it names.
INDEX_OPTION = re.compile(r"^(-i|--index-url|--extra-index-url)([\s=]|$)")


def installer_flags(target: Target) -> list[str]:
    flags = ["--no-index"] if target.offline else []
    for url in target.index_urls:
        flags += ["--extra-index-url", url]
    for link in target.find_links:
        flags += ["--find-links", link]
    return flags


def network_lines(lock_text: str) -> list[tuple[int, str]]:
    """(line number, line) of each lock entry that must be fetched over the network: a URL or a VCS reference.

    Continuation lines are joined (the number is the entry's first line); comments and index options are skipped.
    """
    found, entry, first = [], "", 0
    for number, raw in enumerate(lock_text.splitlines(), 1):
        if not entry:
            first = number
        line = COMMENT.sub("", raw).rstrip()
        if line.endswith("\\"):
            entry += line[:-1] + " "
            continue
        entry = (entry + line).strip()
        if entry and not INDEX_OPTION.match(entry) and _fetched(entry):
            found.append((first, entry))
        entry = ""
    return found


def _fetched(entry: str) -> bool:
    """Whether an entry names something fetched over the network: a URL or VCS reference to anything but file:."""
    schemes = [m.group(1).lower().rsplit("+", 1)[-1] for m in URL_SCHEME.finditer(entry)]
    return any(s != "file" for s in schemes) or (not schemes and bool(VCS_PREFIX.search(entry)))


def lock_problems(target: Target, lock_text: str) -> list[str]:
    """What in the lock cannot be built as the target says (pure: run before anything is touched)."""
    if not target.offline:
        return []
    return [
        f"{target.lock_path} line {n}: `{line}` needs the network, and the target is offline (offline: true, so uv runs "
        "with --no-index): put that package's wheel in a find_links folder and pin it by version (`name==1.2.3`), "
        "or set offline: false"
        for n, line in network_lines(lock_text)
    ]


def aside_path(target: Target, stamp: str) -> str:
    """Where the rebuild of `stamp` builds the new venv, beside the venv it replaces (one folder: a rename swaps them)."""
    return f"{target.venv_dir}.new-{stamp}"


def plan_build(target: Target, stamp: str) -> dict[str, Command]:
    """The commands that build the new venv aside, in order; none of them touches the venv or the trainer."""
    new = aside_path(target, stamp)
    py = f"{new}/bin/python"
    plan = {
        "freeze_old": Command(
            ("uv", "pip", "freeze", "--python", f"{target.venv_dir}/bin/python"), label="uv pip freeze", timeout_seconds=120
        ),
        "create": plan_create(target, BUILDING_MARKER, new),
        "install": Command(
            ("uv", "pip", "sync", "--python", py, "--compile-bytecode", *installer_flags(target), target.lock_path),
            label=f"uv pip sync {target.lock_path} into {new}",
            timeout_seconds=3600,
        ),
        "freeze": Command(("uv", "pip", "freeze", "--python", py), label="uv pip freeze", timeout_seconds=120),
        "import_check": Command(
            (py, "-c", IMPORT_CHECK, *target.import_check), cwd=target.repo_dir, label="import check", timeout_seconds=600
        ),
        "image_packages": Command(
            (py, "-c", IMAGE_PROBE, *target.import_check), cwd=target.repo_dir, label="packages from the image", timeout_seconds=120
        ),
    }
    # The steps that write into the venv: a killed recovery's leftover must not race the next build.
    return {k: tracked(target, c) if k in ("create", "install", "import_check") else c for k, c in plan.items()}


def plan_mark(target: Target, stamp: str, detail: BuildDetail) -> Command:
    return script(
        MARK, aside_path(target, stamp), BUILDING_MARKER, BUILT_RECORD, stamp, detail.model_dump_json(), label="mark venv complete"
    )


def plan_swap(target: Target, stamp: str) -> dict[str, Command]:
    """The commands after the stop: the two renames, then the listing the prune decides from."""
    swap = script(
        MOVE_ASIDE,
        target.venv_dir,
        stamp,
        BUILDING_MARKER,
        aside_path(target, stamp),
        BUILT_RECORD,
        target.state_path,
        label="swap the new venv in, old venv aside",
        timeout_seconds=300,
    )
    return {"swap": swap, "siblings": script(LIST_SIBLINGS, target.venv_dir, label="list old venvs")}


def plan_rebuild(target: Target, stamp: str) -> dict[str, Command]:
    """Every command of a rebuild, build then swap (as `relaunch recover --dry-run` shows them)."""
    return {**plan_build(target, stamp), **plan_swap(target, stamp)}


def plan_create(target: Target, marker: str | None, folder: str | None = None) -> Command:
    """`uv venv --relocatable` at `folder` (the venv itself by default) as the target asks, marked half-done with `marker`."""
    return script(
        CREATE,
        target.python,
        folder or target.venv_dir,
        marker or "",
        "1" if target.system_site_packages else "0",
        INTERPRETER_SITE,
        target.venv_dir,
        BUILT_RECORD,
        label="uv venv",
        timeout_seconds=300,
    )


def image_view(probe_stdout: str, installed: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """What the venv takes from the image: the import-checked modules' distributions found only outside the venv,
    with versions; and, as lines a person reads, each package the lock installs over another version in the image."""
    seen = json.loads(probe_stdout)
    image = {_norm(n): v for n, v in seen["image"].items()}
    used = {_norm(n) for n in seen["used"]}
    from_image = {n: v for n, v in sorted(image.items()) if n in used and n not in installed}
    shadowed = [f"{n}: lock {v} shadows the image's {image[n]}" for n, v in sorted(installed.items()) if n in image and image[n] != v]
    return from_image, shadowed


def old_venvs_to_remove(venv_dir: str, siblings: list[str], keep: int) -> list[str]:
    """Names of `VENV.old-STAMP` beyond the newest `keep` (stamps sort in time order)."""
    prefix = PurePosixPath(venv_dir).name + ".old-"
    old = sorted((n for n in siblings if n.startswith(prefix)), reverse=True)
    return old[keep:]


def _norm(name: str) -> str:
    return canonicalize_name(name)


def parse_pins(text: str) -> dict[str, str]:
    """`name==version` lines of a lock or a freeze, names normalised; comments, options and unpinned lines skipped."""
    pins = {}
    for line in text.splitlines():
        # A comment, a pip option line (`-e`, `--index-url`), a line's `--hash` options, a continuation backslash.
        line = line.split("#", 1)[0].split(" --", 1)[0].strip().rstrip("\\").strip()
        if not line or line.startswith("-"):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        specs = list(req.specifier)
        if len(specs) == 1 and specs[0].operator in ("==", "==="):
            pins[_norm(req.name)] = specs[0].version
    return pins


def drift(lock: dict[str, str], installed: dict[str, str]) -> list[str]:
    """Differences between the lock and the venv, as lines a person reads."""
    lines = [f"{n}: lock {v}, installed {installed[n]}" for n, v in sorted(lock.items()) if n in installed and installed[n] != v]
    lines += [f"{n}: in lock ({v}), not installed" for n, v in sorted(lock.items()) if n not in installed]
    lines += [f"{n}: installed ({v}), not in lock" for n, v in sorted(installed.items()) if n not in lock]
    return lines
