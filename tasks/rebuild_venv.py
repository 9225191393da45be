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

from relaunch.config import Target
from relaunch.errors import PreflightFailed, is_transient
from relaunch.plans.rebuild_venv import (
    BUILT_RECORD,
    PUT_BACK,
    REMOVE_OLD,
    aside_path,
    drift,
    image_view,
    lock_problems,
    old_venvs_to_remove,
    parse_pins,
    plan_build,
    plan_mark,
    plan_swap,
)
from relaunch.runlayout import utc_stamp
from relaunch.steps import BuildDetail, RebuildDetail, StepRecord, counted
from relaunch.tasks.common import Progress, artifact_key, execute, log, step_task, timed
from relaunch.tasks.leftovers import stop_earlier_try
from relaunch.vocabulary import Step
from relaunch.wire.commands import Command, script


def prune(target: Target, plan: dict[str, Command]) -> list[str]:
    siblings = execute(target, plan["siblings"]).stdout.split("\0")
    doomed = old_venvs_to_remove(target.venv_dir, siblings, target.keep_old_venvs)
    if not doomed:
        return []
    out = execute(target, script(REMOVE_OLD, target.venv_dir, *doomed, label="prune old venvs")).stdout
    return [r.removeprefix("removed ") for r in out.split("\0") if r.startswith("removed ")]


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
        progress.update(100, f"venv built aside ({counted(detail.packages, 'package')}); swapped in after the stop")
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
        progress.update(100, f"venv ready ({counted(detail.packages, 'package')})")
    return StepRecord(step=Step.REBUILD_VENV, seconds=clock.seconds, detail=detail)
