"""Step 3: move the old venv aside, build a fresh one holding exactly the lock, report drift, import-check."""

from __future__ import annotations

import json
from pathlib import PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from relaunch.commands import Command, script
from relaunch.config import Target
from relaunch.host import host_script
from relaunch.runfiles import utc_stamp
from relaunch.steps import RebuildDetail, Step, StepRecord
from tasks.common import Progress, artifact_key, execute, log, step_task, timed
from tasks.leftovers import stop_earlier_try, tracked

BUILDING_MARKER = ".relaunch-building"

# Move the current venv aside; one relaunch left half-built (marker still there) is named so.
MOVE_ASIDE = host_script("venv_move_aside")

# Put the previous venv back after a failed build; the failed one is kept for inspection.
PUT_BACK = host_script("venv_put_back")

# The siblings of the venv, NUL-separated: the prune decides in Python, so no name is ever split.
LIST_SIBLINGS = host_script("list_siblings")

# Remove the named old venvs; each must still be a `VENV.old-*` sibling, whatever the caller sent.
REMOVE_OLD = host_script("remove_old_venvs")

# uv venv; with system_site_packages the venv also sees the interpreter's own packages. uv builds a venv from
# its interpreter's base, so where that interpreter is itself a venv (the H200 image's python3 is
# /opt/torch/.venv/bin/python3, torch inside) `--system-site-packages` alone would show the base's bare
# site-packages: a .pth adds the interpreter's own, after the venv's, as system site-packages come.
# $1 python, $2 venv, $3 marker ('' for none), $4 1 for system site packages, $5 the site-dirs program.
CREATE = """set -e
if [ "$4" = 1 ]; then
  uv venv --system-site-packages --python "$1" "$2"
  site=$("$2/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  "$1" -c "$5" > "$site/_relaunch_interpreter_site.pth"
else
  uv venv --python "$1" "$2"
fi
if [ -n "$3" ]; then touch "$2/$3"; fi"""
INTERPRETER_SITE = "import site, sys\nif sys.prefix != sys.base_prefix:\n    print('\\n'.join(site.getsitepackages()))"

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


def installer_flags(target: Target) -> list[str]:
    flags = ["--no-index"] if target.offline else []
    for url in target.index_urls:
        flags += ["--extra-index-url", url]
    for link in target.find_links:
        flags += ["--find-links", link]
    return flags


def plan_rebuild(target: Target, stamp: str) -> dict[str, Command]:
    py = f"{target.venv_dir}/bin/python"
    plan = {
        "move_aside": script(MOVE_ASIDE, target.venv_dir, stamp, BUILDING_MARKER, label="move old venv aside", timeout_seconds=300),
        "create": plan_create(target, BUILDING_MARKER),
        "install": Command(
            ("uv", "pip", "sync", "--python", py, "--compile-bytecode", *installer_flags(target), target.lock_path),
            label="uv pip sync",
            timeout_seconds=3600,
        ),
        "freeze": Command(("uv", "pip", "freeze", "--python", py), label="uv pip freeze", timeout_seconds=120),
        "import_check": Command(
            (py, "-c", IMPORT_CHECK, *target.import_check), cwd=target.repo_dir, label="import check", timeout_seconds=600
        ),
        "image_packages": Command(
            (py, "-c", IMAGE_PROBE, *target.import_check), cwd=target.repo_dir, label="packages from the image", timeout_seconds=120
        ),
        "mark": Command(("rm", "-f", "--", f"{target.venv_dir}/{BUILDING_MARKER}"), label="mark venv complete"),
        "siblings": script(LIST_SIBLINGS, target.venv_dir, label="list old venvs"),
    }
    # The steps that write into the venv: a killed recovery's leftover must not race the next build.
    return {k: tracked(target, c) if k in ("create", "install", "import_check") else c for k, c in plan.items()}


def plan_create(target: Target, marker: str | None) -> Command:
    """`uv venv` as the target asks (system site packages or not), marked half-done with `marker` if given."""
    return script(
        CREATE,
        target.python,
        target.venv_dir,
        marker or "",
        "1" if target.system_site_packages else "0",
        INTERPRETER_SITE,
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


def prune(target: Target, plan: dict[str, Command]) -> list[str]:
    siblings = execute(target, plan["siblings"]).stdout.split("\0")
    doomed = old_venvs_to_remove(target.venv_dir, siblings, target.keep_old_venvs)
    if not doomed:
        return []
    out = execute(target, script(REMOVE_OLD, target.venv_dir, *doomed, label="prune old venvs")).stdout
    return [r.removeprefix("removed ") for r in out.split("\0") if r.startswith("removed ")]


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


@step_task("rebuild_venv", retries=1)
def rebuild_venv(target: Target, stamp: str | None = None) -> StepRecord:
    """`stamp` names the venv moved aside; fixed by the caller, a retry after a dropped connection finds the first try's."""
    stop_earlier_try(target)
    stamp = stamp or utc_stamp()
    plan = plan_rebuild(target, stamp)
    progress = Progress(artifact_key(target.name, "rebuild-venv"), "rebuilding the venv")
    detail = RebuildDetail()
    with timed() as clock:
        lock = parse_pins(execute(target, Command(("cat", target.lock_path), label="read lock")).stdout)
        # What was wrong with the venv being replaced: the incident's drift (transformers 5.8.1
        # instead of 5.6.0) is exactly this list. A venv that cannot be frozen reports nothing.
        before = execute(target, plan["freeze"], check=False)
        detail.old_venv_drift = drift(lock, parse_pins(before.stdout)) if before.exit_code == 0 else []
        if detail.old_venv_drift:
            log().warning("the venv being replaced differed from the lock: %s", "; ".join(detail.old_venv_drift))
        progress.update(5, "moving the old venv aside")
        aside = execute(target, plan["move_aside"]).stdout.strip() or "none"
        detail.old_venv = aside
        try:
            progress.update(15, "creating a fresh venv")
            execute(target, plan["create"], advice="check that uv and the python interpreter exist on the host")
            progress.update(30, "installing exactly the lock")
            execute(target, plan["install"], advice="the lock cannot be installed as pinned: fix the lock or the package indexes")
            progress.update(80, "comparing installed versions with the lock")
            installed = parse_pins(execute(target, plan["freeze"]).stdout)
            detail.drift = drift(lock, installed)
            detail.packages = len(installed)
            if target.import_check:
                progress.update(90, "import-checking " + ", ".join(target.import_check))
                execute(target, plan["import_check"], advice="a key module does not import in the fresh venv: the lock is incomplete")
            if target.system_site_packages:
                # The lock does not pin what the image brings (its torch): record the versions the venv runs with.
                detail.system_site_packages = True
                detail.from_image, detail.shadowed = image_view(execute(target, plan["image_packages"]).stdout, installed)
                log().info("from the image: %s", ", ".join(f"{n} {v}" for n, v in detail.from_image.items()) or "nothing imported")
            execute(target, plan["mark"])
        except Exception:
            execute(target, script(PUT_BACK, target.venv_dir, aside, stamp, label="put the old venv back"), check=False)
            raise
        detail.pruned = prune(target, plan)
        if detail.drift:
            log().warning("venv differs from the lock: %s", "; ".join(detail.drift))
        progress.update(100, f"venv ready ({detail.packages} packages)")
    return StepRecord(step=Step.REBUILD_VENV, seconds=clock.seconds, detail=detail)
