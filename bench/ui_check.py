"""The Prefect UI of a real server after a real recovery, seen by headless Chromium: screenshots and what the pages show.

    .venv/bin/python bench/ui_check.py [--out docs/ui]

Starts `prefect server start` (UI on, its own PREFECT_HOME, no telemetry) on a free port of 127.0.0.1, starts
relaunch/testing/targets.py's bash trainer with a fault (it exits 3 at step 2), runs `relaunch recover TARGET.yaml` as a
subprocess against that server, then `relaunch check` on the recovered trainer; a second trainer crashes the same way
with a checkpoint_dir relaunch must not guess about (one step saved as two files), so its `relaunch recover` is refused
and ends Failed, named Escalated. Then opens pages in headless Chromium (Debian's `chromium`) in Prefect's default
(React, /v2/) UI: the flow runs list (each run named by what happened, the names read back from the API), the
recovered run's Task Runs tab (task runs named `step@host`), its Artifacts tab, the report artifact's own page, the
recovered run's Details tab (its state badge, Recovered, and state message), and the escalated run's Logs tab (its
badge, Escalated, and the ERROR line that says what to do). One command-line Chromium per page writes the rendered DOM
(`--dump-dom`, read for its text) and the screenshot (`--screenshot`, into --out) after
`--virtual-time-budget` of page time: Chromium holds virtual time while fetches are pending, so the SPA's API
calls have answered when the DOM is taken. Prints JSON: the URLs, the phrases each page must show and any
missing, the seconds each part took; exits 1 when a phrase is missing. Both trainers are stopped and the server's
process group is gone at the end. About 70 s on 2 cores. `chromium`: apt-get install -y chromium.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"

PREFECT = str(Path(sys.executable).parent / "prefect")
CHROMIUMS = ("chromium", "chromium-browser", "google-chrome")
SERVER_BOOT_SECONDS = 120  # migrations on a fresh SQLite database, on a busy 2-core host
SERVER_STOP_SECONDS = 15
RECOVER_SECONDS = 180
PAGE_SECONDS = 60
# Virtual time: Chromium runs the page's clock (timers) fast, holds it while a fetch is pending, and takes the DOM
# and the screenshot once this much page time has passed: the React UI's API calls have answered by then.
VIRTUAL_TIME_MS = 15000
WINDOW = "1440,1000"
FLOW = "recover-training"
TARGET_NAME = "nightly"
# The second target, whose recovery is refused: its crashed run saved one step as two files, and relaunch never guesses
# which one the trainer loads (tasks/launch.py pick_checkpoint: CheckpointUnusable, an escalation, nothing launched).
ESCALATED_NAME = "unresumable"
AMBIGUOUS_CHECKPOINT = ("step_1000_model.pt", "step_1000_optim.pt")


def find_chromium() -> str | None:
    return next((path for name in CHROMIUMS if (path := shutil.which(name))), None)


def log(message: str) -> None:
    print(f"ui_check: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# A real Prefect server, UI on.


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(home: Path, base: str) -> dict[str, str]:
    """No PREFECT_* of the caller's (a test's API URL, a profile): only what this server needs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        DO_NOT_TRACK="1",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="true",
        PREFECT_UI_API_URL=f"{base}/api",
        PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT="false",
    )
    return env


@contextmanager
def prefect_server(home: Path, boot_seconds: float = SERVER_BOOT_SECONDS) -> Iterator[str]:
    """`prefect server start` on a free port, in its own process group; yields http://127.0.0.1:PORT once /api/health answers."""
    import httpx

    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    output = home / "server.log"
    with open(output, "wb") as out:
        proc = subprocess.Popen(
            [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=server_env(home, base),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + boot_seconds
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prefect server exited {proc.returncode} before it was healthy:\n{output.read_text()[-3000:]}")
            try:
                if httpx.get(f"{base}/api/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                raise RuntimeError(f"prefect server not healthy after {boot_seconds:.0f} s:\n{output.read_text()[-3000:]}")
            time.sleep(0.25)
        yield base
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (the server and anything it forked), SIGKILL after a grace period."""
    from relaunch.testing.faults import group_members

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(SERVER_STOP_SECONDS)
            break
        except subprocess.TimeoutExpired:
            continue
    # A member left after the leader was reaped keeps the group id in use, so it is still ours to end.
    if group_members(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# A real recovery: a trainer that crashed, then `relaunch recover` as typed, its flow run on the server.


@dataclass
class Recovery:
    returncode: int
    seconds: float
    report: dict = field(default_factory=dict)  # the --json output: the report, or the error object of a refusal
    output: str = ""


def relaunch_cli(command: str, target_file: Path, work: Path, api_url: str) -> Recovery:
    """`relaunch COMMAND --json TARGET.yaml` as typed, against the server; its exit code, seconds and JSON."""
    from relaunch.testing.faults import RELAUNCH, cli_env

    start = time.monotonic()
    proc = subprocess.run(
        [RELAUNCH, command, "--json", str(target_file)],
        env=cli_env(work / "cli-home", api_url),
        capture_output=True,
        text=True,
        timeout=RECOVER_SECONDS,
        cwd=ROOT,
    )
    seconds = time.monotonic() - start
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = {}
    return Recovery(proc.returncode, round(seconds, 1), report, (proc.stdout + proc.stderr)[-3000:])


@contextmanager
def crashed_trainer(folder: Path, name: str) -> Iterator[tuple]:
    """A bash trainer that crashed for real (exit 3 at step 2), and its target file; relaunched without the fault's
    environment it keeps running. Whatever runs of it is stopped at the end."""
    from relaunch.tasks.launch import launch
    from relaunch.testing.faults import write_target
    from relaunch.testing.targets import shell_target, stop_all, wait_for_exit

    target = shell_target(folder, name=name)
    target_file = write_target(target, folder.parent / f"{name}.yaml")
    try:
        launch.fn(target.model_copy(update={"env": {"EXIT_AT": "2", "EXIT_CODE": "3"}}), 1)
        wait_for_exit(target)
        yield target, target_file
    finally:
        stop_all(target)


def recover_crashed_trainer(work: Path, api_url: str) -> tuple[Recovery, Recovery]:
    """The crashed trainer recovered, then `relaunch check` of it while it runs on: a check run for the runs list,
    named by its verdict; it changes nothing."""
    with crashed_trainer(work / "target", TARGET_NAME) as (_, target_file):
        recovery = relaunch_cli("recover", target_file, work, api_url)
        check = relaunch_cli("check", target_file, work, api_url) if recovery.returncode == 0 else Recovery(-1, 0.0)
    return recovery, check


def escalate_crashed_trainer(work: Path, api_url: str) -> Recovery:
    """The second trainer crashed the same way, but its checkpoint_dir holds one step saved as two files: the recovery
    refuses to guess which one to resume from, launches nothing, and its flow run ends Failed named Escalated, with an
    ERROR line that says what to do (flows/outcome.py conclude). The CLI exits 1 with the refusal as its JSON."""
    with crashed_trainer(work / "escalated", ESCALATED_NAME) as (target, target_file):
        checkpoints = Path(target.checkpoint_dir)
        checkpoints.mkdir(parents=True, exist_ok=True)
        for name in AMBIGUOUS_CHECKPOINT:
            (checkpoints / name).write_bytes(b"x" * 64)
        return relaunch_cli("recover", target_file, work, api_url)


@dataclass
class RunOnServer:
    flow_run_id: str
    flow_run_name: str
    state: str
    task_runs: list[str]
    report_artifact_id: str | None
    report_artifact_key: str | None
    state_type: str = ""
    state_message: str = ""
    tags: list[str] = field(default_factory=list)


def find_flow_run(api_url: str, target: str = TARGET_NAME) -> RunOnServer:
    """The one recover-training flow run of the target on the server (its `target:NAME` tag, set as the CLI creates
    it), its task run names and its markdown report artifact."""
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterType,
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterTags,
    )

    async def read() -> RunOnServer:
        async with PrefectClient(api_url) as client:
            runs = await client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[FLOW])),
                flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"target:{target}"])),
            )
            if len(runs) != 1:
                raise RuntimeError(f"expected one {FLOW} flow run of {target} on {api_url}, found {len(runs)}")
            run = runs[0]
            tasks = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
            artifacts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]), type=ArtifactFilterType(any_=["markdown"])
                )
            )
            report = next((a for a in artifacts if a.key and a.key.startswith(FLOW)), None)
            return RunOnServer(
                str(run.id),
                run.name,
                run.state.name if run.state else "",
                sorted(t.name for t in tasks),
                str(report.id) if report else None,
                report.key if report else None,
                run.state.type.value if run.state else "",
                (run.state.message or "") if run.state else "",
                sorted(run.tags),
            )

    return asyncio.run(read())


def flow_runs_named(api_url: str) -> list[dict[str, str]]:
    """Every flow run on the server, newest first, as the runs list shows it: its name (set by what happened) and state."""
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.sorting import FlowRunSort

    async def read() -> list[dict[str, str]]:
        async with PrefectClient(api_url) as client:
            runs = await client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC)
            return [{"name": r.name, "state": r.state.name if r.state else "", "type": r.state.type.value if r.state else ""} for r in runs]

    return asyncio.run(read())


# ---------------------------------------------------------------------------------------------
# Headless Chromium.


def chromium(
    browser: str, url: str, *action: str, profile: Path, budget_ms: int = VIRTUAL_TIME_MS, timeout: float = PAGE_SECONDS
) -> subprocess.CompletedProcess:
    """One headless Chromium for one page: `--dump-dom` (the rendered DOM on stdout) and/or `--screenshot=PATH`."""
    args = [
        browser,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-extensions",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--window-size={WINDOW}",
        f"--virtual-time-budget={budget_ms}",
        *action,
        url,
    ]
    # Its own process group: on a timeout the browser and its renderer, GPU and zygote processes all go.
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError(f"chromium did not finish {url} in {timeout:.0f} s") from None
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def page_text(dom: str) -> str:
    """The visible text of a dumped DOM, whitespace collapsed: enough to ask whether a phrase is on the page."""
    dom = re.sub(r"(?is)<(script|style|svg)\b.*?</\1>", " ", dom)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())


@dataclass
class Page:
    name: str
    url: str
    expect: list[str]  # phrases the rendered page must show
    text: str = ""
    screenshot: str | None = None
    seconds: float = 0.0
    tries: int = 0

    @property
    def missing(self) -> list[str]:
        return [phrase for phrase in self.expect if phrase not in self.text]


def look(browser: str, page: Page, out: Path | None, work: Path, tries: int = 3) -> Page:
    """Render the page once for its DOM and, when `out` is given, its screenshot (one Chromium does both);
    once more, with twice the virtual time, when an expected phrase is missing (a slow fetch on a loaded host)."""
    start = time.monotonic()
    path = out / f"{page.name}.png" if out is not None else None
    for attempt in range(1, tries + 1):
        action = ["--dump-dom"]
        if path:
            path.unlink(missing_ok=True)
            action.append(f"--screenshot={path}")
        done = chromium(browser, page.url, *action, profile=work / f"chromium-{page.name}-{attempt}", budget_ms=VIRTUAL_TIME_MS * attempt)
        if done.returncode != 0 or (path and not path.is_file()):
            raise RuntimeError(f"chromium {page.url} exited {done.returncode}: {done.stderr[-2000:]}")
        page.text, page.tries = page_text(done.stdout), attempt
        if not page.missing:
            break
    page.screenshot = str(path) if path else None
    page.seconds = round(time.monotonic() - start, 1)
    return page


def pages_of(base: str, run: RunOnServer, verdict: str, escalated: RunOnServer, runs: list[dict[str, str]], what_to_do: str) -> list[Page]:
    """The React UI (Prefect 3.9's default: / redirects to /v2/; routes from its bundle, prefect/server/ui-v2/assets):
    the runs list, the recovered run's Task Runs and Artifacts tabs, the report, its Details tab (state and message),
    and the escalated run's Logs tab (the flow run page's default tab)."""
    flow_run = f"{base}/v2/runs/flow-run/{run.flow_run_id}"
    # The state names are what relaunch sets (flows/outcome.py final_state), spelled here rather than read back: a run
    # that ended plain Completed or Failed is the regression this page is for. Capitalised, they are the badges: the run
    # names say `recovered` and `escalated` in lower case.
    message = " ".join(run.state_message.split())[:80] or "(no state message)"
    return [
        Page("runs-list", f"{base}/v2/runs/?tab=flow-runs", [*(r["name"] for r in runs), "Recovered", "Escalated"]),
        Page("flow-run-task-runs", f"{flow_run}?tab=TaskRuns", [run.flow_run_name, *run.task_runs]),
        Page("flow-run-artifacts", f"{flow_run}?tab=Artifacts", [run.report_artifact_key or "(no report artifact)", f"{verdict}:"]),
        Page("report-artifact", f"{base}/v2/artifacts/artifact/{run.report_artifact_id}", [f"Verdict: {verdict}", "Attempt 1: crashed"]),
        Page(
            "flow-run-recovered",
            f"{flow_run}?tab=Details",
            [run.flow_run_name, "Recovered", "State Message", message, f"target:{TARGET_NAME}"],
        ),
        Page(
            "flow-run-escalated",
            f"{base}/v2/runs/flow-run/{escalated.flow_run_id}?tab=Logs",
            # The ERROR line of flows/outcome.py conclude: what was refused, then what to do (its first words).
            [escalated.flow_run_name, "Escalated", "ERROR", "nothing was launched", f"what to do: {' '.join(what_to_do.split()[:6])}"],
        ),
    ]


# ---------------------------------------------------------------------------------------------


def ui_check(out: Path | None, work: Path, browser: str | None = None) -> dict:
    """Everything above, once; `out` None takes no screenshots. Returns what was found (each page's full text too)."""
    browser = browser or find_chromium()
    if browser is None:
        raise RuntimeError("no chromium on PATH; install it: apt-get update && apt-get install -y chromium")
    work.mkdir(parents=True, exist_ok=True)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    seconds = {}
    t0 = time.monotonic()
    with prefect_server(work / "server-home") as base:
        api_url = f"{base}/api"
        seconds["server_boot"] = round(time.monotonic() - t0, 1)
        log(f"server up at {base} ({seconds['server_boot']} s)")
        recovery, check = recover_crashed_trainer(work, api_url)
        seconds["recovery"], seconds["check"] = recovery.seconds, check.seconds
        if recovery.returncode != 0:
            raise RuntimeError(f"relaunch recover exited {recovery.returncode}:\n{recovery.output}")
        if check.returncode != 0:
            raise RuntimeError(f"relaunch check of the recovered trainer exited {check.returncode}:\n{check.output}")
        escalation = escalate_crashed_trainer(work, api_url)
        seconds["escalation"] = escalation.seconds
        # Exit 1 with the refusal's JSON is the escalation; 0 would be a guess made, 3 a crash of relaunch itself.
        if escalation.returncode != 1 or escalation.report.get("error") != "checkpoint_unusable":
            raise RuntimeError(f"relaunch recover of {ESCALATED_NAME} exited {escalation.returncode}, not refused:\n{escalation.output}")
        run = find_flow_run(api_url)
        log(f"flow run {run.flow_run_name} {run.state}: {', '.join(run.task_runs)}")
        if run.report_artifact_id is None:
            raise RuntimeError(f"flow run {run.flow_run_name} has no markdown report artifact")
        escalated = find_flow_run(api_url, ESCALATED_NAME)
        log(f"flow run {escalated.flow_run_name} {escalated.state_type} {escalated.state}")
        runs = flow_runs_named(api_url)
        verdict = recovery.report.get("verdict")
        what_to_do = escalation.report.get("what_to_do") or "(no what to do)"
        pages = [look(browser, page, out, work) for page in pages_of(base, run, verdict, escalated, runs, what_to_do)]
        seconds["pages"] = round(sum(p.seconds for p in pages), 1)
    seconds["total"] = round(time.monotonic() - t0, 1)
    return {
        "chromium": subprocess.run([browser, "--version"], capture_output=True, text=True).stdout.strip(),
        "server": base,
        "verdict": verdict,
        "check_verdict": check.report.get("verdict"),
        "escalation": {
            "exit_code": escalation.returncode,
            "error": escalation.report.get("error"),
            "what_to_do": what_to_do,
        },
        "flow_run": run.__dict__,
        "escalated_run": escalated.__dict__,
        "flow_runs": runs,
        "pages": {
            p.name: {
                "url": p.url,
                "screenshot": p.screenshot,
                "seconds": p.seconds,
                "tries": p.tries,
                "expect": p.expect,
                "missing": p.missing,
                "text": p.text,
            }
            for p in pages
        },
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "ui", help="Folder for the screenshots.")
    parser.add_argument("--chromium", default=None, help="The browser binary (default: chromium on PATH).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="relaunch-ui-") as work:
        os.environ.setdefault("PREFECT_HOME", str(Path(work) / "prefect-home"))  # this process's; the server and the CLI get their own
        result = ui_check(args.out.resolve(), Path(work), args.chromium)
    for page in result["pages"].values():
        page["text"] = page["text"][:400] + ("..." if len(page["text"]) > 400 else "")
    print(json.dumps(result, indent=2))
    sys.exit(1 if any(page["missing"] for page in result["pages"].values()) else 0)


if __name__ == "__main__":
    main()
