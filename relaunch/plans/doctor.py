"""`relaunch doctor`: the host command of its checks (relaunch/host/doctor.sh) and the pure reading of every answer
into one line per check; no Prefect, no I/O.

The checks run in the order a recovery needs them: each hop of the route, the container, then the host's tools,
GPUs, repo, disks, folders and lock in one script, then the Prefect API. A hop that fails stops the checks behind
it: they are reported as not run, naming that hop.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field

from relaunch.config import Target
from relaunch.errors import HostKeyError, Result
from relaunch.host import host_script
from relaunch.plans.rebuild_venv import installer_flags
from relaunch.wire.commands import Command, describe_container_failure, script

DOCTOR = host_script("doctor")
ADVICE = "\n  what to do: "


class Status(str, Enum):
    OK = "ok"
    FAIL = "fail"
    NOT_RUN = "not run"  # behind a hop or container that failed

    def passes(self) -> bool:
        return self is Status.OK


class Check(BaseModel):
    """One line of the doctor's report."""

    name: str = Field(description="What was checked: `hop 1`, `host`, `container`, `tmux`, `disk log_dir`, `api`.")
    status: Status = Field(description="ok, fail, or not run (behind a hop that failed).")
    detail: str = Field(description="What was found.")
    advice: str = Field("", description="What to do about a failure; empty when it passed.")

    def line(self) -> str:
        text = f"{self.status.value:<7} {self.name:<24} {self.detail}"
        return f"{text}\n{'':<33}what to do: {self.advice}" if self.advice else text


def plan_doctor(target: Target) -> Command:
    min_kb = str(int(target.min_free_disk_gb * 1024 * 1024))
    return script(
        DOCTOR,
        target.python,
        target.repo_dir,
        target.known_good_ref,
        target.lock_path,
        target.venv_dir,
        target.log_dir,
        target.checkpoint_dir or "",
        min_kb,
        str(target.thresholds.expected_gpus),
        "1" if target.offline else "0",
        *installer_flags(target),
        label="doctor",
        timeout_seconds=180,
    )


def split_advice(error: BaseException) -> tuple[str, str]:
    """(what happened, what to do) of one of relaunch's errors, which end with `what to do: ...` when they know."""
    text = str(error)
    what, _, advice = text.partition(ADVICE)
    return what.strip(), advice.strip()


def route_checks(hops: list[tuple[str, BaseException | None]], trusting: list[bool]) -> list[Check]:
    """One line per hop reached, then the hop that failed and, behind it, the host's checks as not run. `trusting`:
    whether each hop of the route (the host last) sets trust_on_first_use, which the doctor never acts on."""
    checks = []
    for i, (where, error) in enumerate(hops, 1):
        name = "host" if i == len(trusting) else f"hop {i}"
        if error is None:
            checks.append(Check(name=name, status=Status.OK, detail=f"reached {where}; host key known"))
            continue
        what, advice = split_advice(error)
        if trusting[i - 1] and isinstance(error, HostKeyError) and "unknown host key" in what:
            advice = advice.split(", or set trust_on_first_use")[0] + (
                " (trust_on_first_use is on: the first recovery would record this key without that check)"
            )
        checks.append(Check(name=name, status=Status.FAIL, detail=what, advice=advice or "check the route to this hop"))
        checks.append(not_run(f"{name} ({where})"))
    return checks


def not_run(behind: str) -> Check:
    """The host's own checks, skipped because the way to them failed."""
    return Check(name="host checks", status=Status.NOT_RUN, detail=f"not run: {behind} failed")


def host_checks(target: Target, result: Result) -> list[Check]:
    """The container's line (when there is one) and each line the doctor script printed."""
    container = target.host.container
    if result.exit_code != 0:
        if container and (why := describe_container_failure(result)):
            advice = why[why.index("(") + 1 : -1] if why.endswith(")") else f"see to {container.kind} {container.id}"
            return [Check(name="container", status=Status.FAIL, detail=why, advice=advice), not_run("the container")]
        return [
            Check(
                name="host checks",
                status=Status.FAIL,
                detail=f"the doctor's script exited {result.exit_code}: {result.tail[-500:]}",
                advice="run it again with --debug; if it persists, report it with this output",
            )
        ]
    checks = [Check(name="container", status=Status.OK, detail=f"{container.kind} {container.id} running")] if container else []
    for line in result.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 5 and parts[0] == "CHECK":
            _, name, status, detail, advice = parts
            ok = status == Status.OK.value
            checks.append(Check(name=name, status=Status.OK if ok else Status.FAIL, detail=detail, advice="" if ok else advice))
    return checks


def api_check(api_url: str | None, problem: str | None) -> Check:
    """The Prefect API's line: `problem` is why `GET /health` failed (None: it answered)."""
    if not api_url:
        return Check(
            name="api",
            status=Status.OK,
            detail="no PREFECT_API_URL configured: each command uses your server at 127.0.0.1:4200 when it runs, else a temporary one",
        )
    if problem is None:
        return Check(name="api", status=Status.OK, detail=f"{api_url} answers")
    return Check(name="api", status=Status.FAIL, detail=f"the Prefect API at {api_url} {problem}", advice=api_advice())


def api_advice(start: str = "`make serve`") -> str:
    """What to do about a Prefect API that does not answer (the doctor's line, and every command's: relaunch/cli/root.py).
    `start`: how this install starts a server of its own."""
    return (
        f"start that server ({start}, or `prefect server start`) or see to it (its log, `prefect server status`), "
        "or point PREFECT_API_URL at one that answers"
    )


def passed(checks: list[Check]) -> bool:
    return bool(checks) and all(c.status.passes() for c in checks)


def render(target: Target, checks: list[Check]) -> str:
    failed = [c for c in checks if not c.status.passes()]
    summary = (
        f"all {len(checks)} checks passed"
        if not failed
        else f"{sum(c.status is Status.FAIL for c in checks)} failed, {sum(c.status is Status.NOT_RUN for c in checks)} not run, "
        f"of {len(checks)} checks"
    )
    return "\n".join([f"doctor: {target.name} on {target.host.label}", *(c.line() for c in checks), summary])
