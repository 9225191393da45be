"""Step 3: build a fresh venv holding exactly the lock, aside, while the run still runs; after the stop, swap it in.

A recovery must never leave a run dead for a venv it could not build (the incident's nightly check stopped a
healthy run, then failed on a `git+https` lock line). So the build is split in two:

- `build_venv` (before the stop): create `VENV.new-STAMP` with `uv venv --relocatable`, install the lock into
  it, compare it with the lock, import-check it. The user's venv and the trainer are not touched; a build that
  fails leaves the run exactly as it was and fails the recovery with the installer's own error. The failed
  build is kept as `VENV.failed-STAMP`.
- `rebuild_venv` (after the stop): move the user's venv aside as `VENV.old-STAMP` and rename `VENV.new-STAMP`
  into its place: two renames in one folder, nothing that needs space or network. With no build aside for
  its stamp (a caller that did not run `build_venv` first) it builds one first, the same way.

Why a relocatable venv renamed into place rather than a proof build thrown away before a second, real build
after the stop: the build runs once, the run is down only for the renames, and nothing after the stop can fail
for the lock's sake. uv writes a relocatable venv's console scripts and activate scripts relative to their own
folder and records `relocatable = true` in pyvenv.cfg, so later `uv pip install`s into it (install_package)
write relocatable scripts too; `bin/python` links to the interpreter, not into the venv; compiled bytecode
gets its file names from where it is imported; the system-site-packages .pth names the interpreter's folders.
"""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from relaunch.commands import Command, script
from relaunch.config import Target
from relaunch.errors import PreflightFailed, is_transient
from relaunch.host import host_script
from relaunch.runfiles import utc_stamp
from relaunch.steps import BuildDetail, RebuildDetail, Step, StepRecord
from relaunch.tasks.common import Progress, artifact_key, execute, log, step_task, timed
from relaunch.tasks.leftovers import stop_earlier_try, tracked

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


def completed_build(target: Target, stamp: str, folder: str | None = None) -> BuildDetail | None:
    """The findings of this stamp's build in `folder` (the build aside by default) if it completed, else None.

    The record is written last, so a build cut off at any point has none.
    """
    where = folder or aside_path(target, stamp)
    got = execute(target, Command(("cat", "--", f"{where}/{BUILT_RECORD}"), label="read the build's record"), check=False)
    first, _, rest = got.stdout.partition("\n")
    if got.exit_code != 0 or first.strip() != stamp:
        return None
    return BuildDetail.model_validate_json(rest.strip())


def build_aside(target: Target, stamp: str, progress: Progress) -> BuildDetail:
    """Build `VENV.new-STAMP` from the lock without touching the venv or the trainer; raise with the host's error."""
    found = completed_build(target, stamp)
    if found:
        # A retry after a dropped connection whose first try finished the build: keep it.
        log().info("the venv built aside at %s is complete: kept", found.built)
        return found.model_copy(update={"reused": True})
    plan = plan_build(target, stamp)
    new = aside_path(target, stamp)
    detail = BuildDetail(built=new)
    text = execute(target, Command(("cat", "--", target.lock_path), label=f"read {target.lock_path}")).stdout
    problems = lock_problems(target, text)
    if problems:
        # Before anything is created: a lock that cannot be built offline is refused up front, its lines named.
        raise PreflightFailed(target.host.label, problems)
    lock = parse_pins(text)
    # What was wrong with the venv being replaced: the incident's drift (transformers 5.8.1
    # instead of 5.6.0) is exactly this list. A venv that cannot be frozen reports nothing.
    before = execute(target, plan["freeze_old"], check=False)
    detail.old_venv_drift = drift(lock, parse_pins(before.stdout)) if before.exit_code == 0 else []
    if detail.old_venv_drift:
        log().warning("the venv being replaced differs from the lock: %s", "; ".join(detail.old_venv_drift))
    try:
        progress.update(10, f"creating a fresh venv aside at {new} (the run goes on)")
        created = execute(
            target, plan["create"], advice="check that uv (0.4 or newer: --relocatable) and the python interpreter exist on the host"
        )
        for line in created.stdout.splitlines():
            log().warning("%s", line)
        progress.update(25, "installing exactly the lock")
        execute(
            target,
            plan["install"],
            advice="the lock cannot be installed as pinned: fix the lock or the package indexes; the venv in use was not touched",
        )
        progress.update(70, "comparing installed versions with the lock")
        installed = parse_pins(execute(target, plan["freeze"]).stdout)
        detail.drift = drift(lock, installed)
        detail.packages = len(installed)
        if target.import_check:
            progress.update(80, "import-checking " + ", ".join(target.import_check))
            execute(
                target,
                plan["import_check"],
                advice="a key module does not import in the fresh venv: the lock is incomplete; the venv in use was not touched",
            )
        if target.system_site_packages:
            # The lock does not pin what the image brings (its torch): record the versions the venv runs with.
            detail.system_site_packages = True
            detail.from_image, detail.shadowed = image_view(execute(target, plan["image_packages"]).stdout, installed)
            log().info("from the image: %s", ", ".join(f"{n} {v}" for n, v in detail.from_image.items()) or "nothing imported")
        execute(target, plan_mark(target, stamp, detail))
    except Exception as exc:
        # The host said no: keep the failed build for a look. A dropped connection leaves it as it is: the
        # retry first stops what the first try left running in it, then keeps it as .incomplete-*.
        if not is_transient(exc):
            execute(target, script(PUT_BACK, target.venv_dir, new, stamp, label="keep the failed build aside"), check=False)
        raise
    if detail.drift:
        log().warning("the new venv differs from the lock: %s", "; ".join(detail.drift))
    return detail


@step_task("build_venv", retries=1)
def build_venv(target: Target, stamp: str) -> StepRecord:
    """Before the stop: build the new venv aside from the lock; a failure leaves the run and its venv as they were.

    `stamp` is the rebuild's: the `rebuild_venv` after the stop, given the same stamp, swaps this build in.
    """
    stop_earlier_try(target)
    progress = Progress(artifact_key(target.name, "build-venv"), "building the venv aside")
    with timed() as clock:
        detail = build_aside(target, stamp, progress)
        progress.update(100, f"venv built aside ({detail.packages} packages); swapped in after the stop")
    return StepRecord(step=Step.BUILD_VENV, seconds=clock.seconds, detail=detail)


@step_task("rebuild_venv", retries=1)
def rebuild_venv(target: Target, stamp: str | None = None) -> StepRecord:
    """After the stop: swap the venv built aside for `stamp` in (building it first if no complete one is there).

    `stamp` names the build and the venv moved aside; fixed by the caller, a retry after a dropped connection
    finds the first try's.
    """
    stop_earlier_try(target)
    stamp = stamp or utc_stamp()
    progress = Progress(artifact_key(target.name, "rebuild-venv"), "rebuilding the venv")
    with timed() as clock:
        # Already swapped in by a first try whose answer was lost, or built aside by build_venv before the stop.
        built = completed_build(target, stamp, target.venv_dir) or completed_build(target, stamp)
        prepared = built is not None
        if built is None:
            built = build_aside(target, stamp, progress)
        plan = plan_swap(target, stamp)
        progress.update(90, "moving the old venv aside and the new one into place")
        aside = execute(
            target, plan["swap"], advice="see the output: the venv was left as it was; stop the trainer first if it still runs"
        ).stdout.strip()
        fields = built.model_dump(exclude={"kind", "reused"})
        detail = RebuildDetail(**fields, old_venv=aside.splitlines()[-1] if aside else "none", prepared=prepared)
        detail.pruned = prune(target, plan)
        progress.update(100, f"venv ready ({detail.packages} packages)")
    return StepRecord(step=Step.REBUILD_VENV, seconds=clock.seconds, detail=detail)
