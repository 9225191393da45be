"""The Prefect UI of a real server after a real recovery, seen by headless Chromium: screenshots and what the pages show.

    .venv/bin/python bench/ui_check.py [--out docs/ui]

Starts `prefect server start` (UI on, its own PREFECT_HOME, no telemetry) on a free port of 127.0.0.1, starts
relaunch/testing/targets.py's bash trainer with a fault (it exits 3 at step 2), runs `relaunch recover TARGET.yaml` as a
subprocess against that server, then opens the flow run's pages in headless Chromium (Debian's `chromium`)
in Prefect's default (React, /v2/) UI: the flow run's Task Runs tab (task runs named `step@host`), its
Artifacts tab, and the report artifact's own page. One command-line Chromium per page writes the rendered DOM
(`--dump-dom`, read for its text) and the screenshot (`--screenshot`, into --out) after
`--virtual-time-budget` of page time: Chromium holds virtual time while fetches are pending, so the SPA's API
calls have answered when the DOM is taken. Prints JSON: the URLs, the phrases each page must show and any
missing, the seconds each part took; exits 1 when a phrase is missing. The trainer is stopped and the server's
process group is gone at the end. About 40 s on 2 cores. `chromium`: apt-get install -y chromium.
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
    report: dict = field(default_factory=dict)
    output: str = ""


def recover_crashed_trainer(work: Path, api_url: str) -> Recovery:
    from relaunch.tasks.launch import launch
    from relaunch.testing.faults import RELAUNCH, cli_env, write_target
    from relaunch.testing.targets import shell_target, stop_all, wait_for_exit

    target = shell_target(work / "target", name=TARGET_NAME)
    target_file = write_target(target, work / "target.yaml")
    try:
        # The run crashes for real (exit 3 at step 2); the relaunch, without the fault's environment, keeps running.
        launch.fn(target.model_copy(update={"env": {"EXIT_AT": "2", "EXIT_CODE": "3"}}), 1)
        wait_for_exit(target)
        start = time.monotonic()
        proc = subprocess.run(
            [RELAUNCH, "recover", "--json", str(target_file)],
            env=cli_env(work / "cli-home", api_url),
            capture_output=True,
            text=True,
            timeout=RECOVER_SECONDS,
            cwd=ROOT,
        )
        seconds = time.monotonic() - start
    finally:
        stop_all(target)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = {}
    return Recovery(proc.returncode, round(seconds, 1), report, (proc.stdout + proc.stderr)[-3000:])


@dataclass
class RunOnServer:
    flow_run_id: str
    flow_run_name: str
    state: str
    task_runs: list[str]
    report_artifact_id: str | None
    report_artifact_key: str | None


def find_flow_run(api_url: str) -> RunOnServer:
    """The one recover-training flow run on the server, its task run names and its markdown report artifact."""
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterType,
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterId,
    )

    async def read() -> RunOnServer:
        async with PrefectClient(api_url) as client:
            runs = await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[FLOW])))
            if len(runs) != 1:
                raise RuntimeError(f"expected one {FLOW} flow run on {api_url}, found {len(runs)}")
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
            )

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


def pages_of(base: str, run: RunOnServer, verdict: str) -> list[Page]:
    """The React UI (Prefect 3.9's default: / redirects to /v2/): the flow run's Task Runs and Artifacts tabs, the report."""
    flow_run = f"{base}/v2/runs/flow-run/{run.flow_run_id}"
    return [
        Page("flow-run-task-runs", f"{flow_run}?tab=TaskRuns", [run.flow_run_name, *run.task_runs]),
        Page("flow-run-artifacts", f"{flow_run}?tab=Artifacts", [run.report_artifact_key or "(no report artifact)", f"{verdict}:"]),
        Page("report-artifact", f"{base}/v2/artifacts/artifact/{run.report_artifact_id}", [f"Verdict: {verdict}", "Attempt 1: crashed"]),
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
        recovery = recover_crashed_trainer(work, api_url)
        seconds["recovery"] = recovery.seconds
        if recovery.returncode != 0:
            raise RuntimeError(f"relaunch recover exited {recovery.returncode}:\n{recovery.output}")
        run = find_flow_run(api_url)
        log(f"flow run {run.flow_run_name} {run.state}: {', '.join(run.task_runs)}")
        if run.report_artifact_id is None:
            raise RuntimeError(f"flow run {run.flow_run_name} has no markdown report artifact")
        verdict = recovery.report.get("verdict")
        pages = [look(browser, page, out, work) for page in pages_of(base, run, verdict)]
        seconds["pages"] = round(sum(p.seconds for p in pages), 1)
    seconds["total"] = round(time.monotonic() - t0, 1)
    return {
        "chromium": subprocess.run([browser, "--version"], capture_output=True, text=True).stdout.strip(),
        "server": base,
        "verdict": verdict,
        "flow_run": run.__dict__,
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
