"""What a recovery or a check tells a person: attempts, steps, evidence; as JSON and as markdown."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

from pydantic import BaseModel, Field

from relaunch.deciding.gang import NodeHealth
from relaunch.judging.findings import Metrics, cause_line
from relaunch.judging.snapshot import GpuSample
from relaunch.records.goodput import Observation
from relaunch.steps import StepRecord
from relaunch.vocabulary import Action, Cause, Verdict


class Attempt(BaseModel):
    number: int
    verdict: Verdict = Field(description="What the health check found before this attempt's action.")
    cause: Cause | None = None
    package: str | None = None
    summary: str = ""
    action: Action = Field(description="What relaunch did about it (with `acted` false: what it would do).")
    acted: bool = Field(
        True, description="False: nothing was done, the action is only what relaunch would do (a check not asked to recover)."
    )
    why: str = Field("", description="The playbook's reason for the action.")
    evidence: list[str] = Field(default_factory=list)
    metrics: Metrics = Field(default_factory=Metrics)
    steps: list[StepRecord] = Field(default_factory=list, description="Steps run for the action, with durations.")
    run_id: str | None = Field(None, description="Launch this attempt started, if any.")
    observation: Observation | None = Field(
        None, description="The health check before it, as goodput reads it: when, and what it saw of the step lines."
    )
    nodes: list[NodeHealth] = Field(default_factory=list, description="A run of several nodes: each node as that check found it.")
    repo_dir_missing: str | None = Field(None, description="The target's repo_dir, where the check found no such folder on the host.")


class Report(BaseModel):
    target: str
    host: str
    flow: str = Field(description="recover-training or check-training.")
    verdict: Verdict | None = Field(None, description="Final verdict.")
    cause: Cause | None = None
    ok: bool = Field(False, description="The run ends healthy (or finished).")
    started_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    finished_at: str | None = None
    attempts: list[Attempt] = Field(default_factory=list)
    preflight: list[StepRecord] = Field(default_factory=list)
    gpus: list[GpuSample] = Field(default_factory=list)
    message: str = Field("", description="What a person should know or do next.")
    refusal: str | None = Field(
        None, description="The error that refused the run (CheckpointUnusable, PreflightFailed, ...): it ended escalated, not crashed."
    )

    def finish(self, message: str = "") -> Report:
        last = self.attempts[-1] if self.attempts else None
        self.verdict = last.verdict if last else None
        self.cause = last.cause if last else None
        self.ok = self.verdict in (Verdict.HEALTHY, Verdict.FINISHED)
        self.finished_at = datetime.now(UTC).isoformat(timespec="seconds")
        self.message = message or self.message
        return self

    def acted(self) -> bool:
        """Some attempt ran steps on the host (a check's own "would do" attempt runs none)."""
        return any(a.steps for a in self.attempts)

    def outcome(self) -> str:
        """What happened, in a word or two: escalated, recovered, not recovered, failed; "" where nothing needed doing."""
        last = self.attempts[-1] if self.attempts else None
        if self.refusal == "HostBusy":
            return "busy"
        if self.refusal or (last is not None and last.action is Action.ESCALATE):
            return "escalated"
        if self.verdict is not None and self.verdict.is_fine():
            return "recovered" if self.acted() else ""
        return "failed" if self.acted() else "not recovered"

    def headline(self) -> str:
        """What was found and what came of it, for the flow run's name: `crashed (killed) -> recovered`, `healthy`,
        `crashed (disk_full) -> escalated`, `crashed (killed) -> escalated (CheckpointUnusable)`, `escalated (PreflightFailed)`."""
        first = self.attempts[0] if self.attempts else None
        outcome = self.outcome()
        if self.refusal:
            outcome += f" ({self.refusal})"
        elif outcome == "recovered" and self.verdict is not Verdict.HEALTHY and self.verdict is not None:
            outcome += f" ({self.verdict.value})"
        if first is None:  # refused before any check (a preflight, a lock held)
            return outcome or "no verdict"
        found = first.verdict.value + (f" ({first.cause.value})" if first.cause else "")
        last = self.attempts[-1]
        said = cause_line(last.evidence) if outcome == "escalated" and not self.refusal else ""
        # An escalation's name carries the root cause's own line: what a person must read is in the run list itself.
        said = f": {_elided(' '.join(said.split()), HEADLINE_CAUSE_CHARS)}" if said else ""
        return f"{found} -> {outcome}{said}" if outcome else found

    def timeline(self) -> list[str]:
        lines = []
        for a in self.attempts:
            cause = f" ({a.cause.value}{': ' + a.package if a.package else ''})" if a.cause else ""
            lines.append(f"attempt {a.number}: {a.verdict.value}{cause} -> {_action(a)}  {a.summary}")
            lines += [f"    {n.line()}" for n in a.nodes]
            for s in a.steps:
                lines.append(f"    {s.step.value:<16} {s.seconds:8.1f} s{_on_node(s)}")
                # What the markdown report's notes say (the checkpoint resumed from and why, what was skipped, where a
                # venv was moved aside), at most a few lines a step: the terminal says what the UI says.
                notes = s.detail.notes()
                lines += [f"        {note}" for note in notes[:TIMELINE_NOTES]]
                lines += [f"        (+{len(notes) - TIMELINE_NOTES} more in the report)"] if len(notes) > TIMELINE_NOTES else []
        return lines

    def markdown(self) -> str:
        head = f"# {self.flow}: {self.target} on {self.host}\n\n**Verdict: {self.verdict.value if self.verdict else 'none'}**"
        head += f" ({self.cause.value})" if self.cause else ""
        # A markdown table is one block: its lines joined by single newlines, never blank lines.
        rows = ["| # | verdict | cause | action | summary |", "| --- | --- | --- | --- | --- |"]
        for a in self.attempts:
            rows.append(
                f"| {a.number} | {a.verdict.value} | {a.cause.value if a.cause else ''}{' (' + a.package + ')' if a.package else ''} | {_action(a)} | {_cell(a.summary)} |"
            )
        parts = [head, self.message, "## Attempts", "\n".join(rows)]
        if self.attempts and self.attempts[-1].nodes:
            parts += ["## Nodes", _node_table(self.attempts[-1].nodes)]
        for a in self.attempts:
            parts.append(
                f"### Attempt {a.number}: {a.verdict.value}\n{a.why}\n\nEvidence:\n```\n" + "\n".join(a.evidence or ["(none)"]) + "\n```"
            )
            if a.nodes and a is not self.attempts[-1]:
                parts.append(_node_table(a.nodes))
            if a.steps:
                parts.append(_step_table(a.steps))
        return "\n\n".join(p for p in parts if p)


def _action(attempt: Attempt) -> str:
    """The action as done (`relaunch`), or as only proposed (`would do relaunch (nothing done)`)."""
    if attempt.acted or attempt.action is Action.NONE:
        return attempt.action.value
    return f"would do {attempt.action.value} (nothing done)"


# The root cause's line in a headline (a flow run's name holds 200 characters in all).
HEADLINE_CAUSE_CHARS = 140


def _elided(text: str, most: int) -> str:
    """TEXT in at most MOST characters, its middle left out: an error's start and its end (the file, the errno's words) both stay."""
    if len(text) <= most:
        return text
    keep = (most - 1) // 2
    return f"{text[:keep]}…{text[len(text) - (most - 1 - keep) :]}"


# Notes of one step shown in the terminal's timeline; the markdown report has them all.
TIMELINE_NOTES = 4


def _step_table(steps: list[StepRecord]) -> str:
    if all(s.node is None for s in steps):
        return "| step | seconds | notes |\n| --- | --- | --- |\n" + "\n".join(
            f"| {s.step.value} | {s.seconds:.1f} | {_notes(s)} |" for s in steps
        )
    return "| step | node | seconds | notes |\n| --- | --- | --- | --- |\n" + "\n".join(
        f"| {s.step.value} | {'' if s.node is None else s.node} | {s.seconds:.1f} | {_notes(s)} |" for s in steps
    )


def _on_node(step: StepRecord) -> str:
    return "" if step.node is None else f"  node {step.node}"


def _node_table(nodes: list[NodeHealth]) -> str:
    """A row per node under the run."""
    rows = ["| node | host | verdict | cause | summary |", "| --- | --- | --- | --- | --- |"]
    for n in nodes:
        d = n.diagnosis
        verdict = d.verdict.value if d else "unknown"
        cause = d.cause.value if d and d.cause else ""
        summary = d.summary if d else f"cannot be reached: {n.unreachable}"
        rows.append(f"| {n.node} | {_cell(n.host)} | {verdict} | {cause} | {_cell(summary)} |")
    return "\n".join(rows)


def _notes(step: StepRecord) -> str:
    return _cell("<br>".join(step.detail.notes()))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# The fleet's models live here, not in flows/fleet.py: a worker loads a deployment's entrypoint file as a module
# of its own name (`fleet`), so a result pickled from a class defined there could be read back nowhere else.
class FleetRow(BaseModel):
    """One target's line in the fleet table."""

    target: str
    host: str
    found: Verdict | None = Field(None, description="What the check found (None: the check itself failed).")
    cause: Cause | None = None
    action: Action | None = Field(None, description="What the playbook says for what was found.")
    recovered: bool = Field(False, description="A recover-training subflow ran for this target.")
    verdict: Verdict | None = Field(None, description="Final verdict: the recovery's if one ran, else the check's.")
    ok: bool = Field(False, description="Ends healthy or finished (a starting run is not yet ok).")
    polls: int = Field(0, description="Health round trips the check made.")
    check_seconds: float = Field(0.0, description="Time the check waited for its verdict to settle.")
    incident: str | None = Field(None, description="The fleet incident (verdict/cause on several hosts) this target was part of.")
    message: str = ""
    nodes: list[NodeHealth] = Field(default_factory=list, description="A run of several nodes: each node as the last check found it.")


class FleetReport(BaseModel):
    """What check-fleet returns and publishes as its table artifact."""

    started_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    finished_at: str | None = None
    targets: int = 0
    max_concurrent: int = 1
    check_phase_seconds: float = Field(0.0, description="Wall time of all checks together.")
    recovery_phase_seconds: float = 0.0
    checks_per_minute: float = 0.0
    rows: list[FleetRow] = Field(default_factory=list)
    incidents: list[str] = Field(default_factory=list, description="One line per incident: the same failure on several hosts at once.")
    reports: list[Report] = Field(default_factory=list, description="One per target: the check, and the recovery's attempts where one ran.")

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def table(self) -> list[dict[str, object]]:
        """The fleet table: a row per target, and under a run of several nodes a row per node (`big node 1`)."""
        out: list[dict[str, object]] = []
        for row in self.rows:
            line = {k: (v.value if hasattr(v, "value") else v) for k, v in row.model_dump(exclude={"nodes"}).items()}
            out.append(line)
            for n in row.nodes:
                d = n.diagnosis
                verdict = d.verdict.value if d else "unknown"
                blank = dict.fromkeys(line, None) | {"recovered": False, "ok": verdict in ("healthy", "finished"), "polls": 0}
                out.append(
                    blank
                    | {
                        "target": f"{row.target} node {n.node}",
                        "host": n.host,
                        "found": verdict,
                        "cause": d.cause.value if d and d.cause else None,
                        "verdict": verdict,
                        "check_seconds": 0.0,
                        "message": d.summary if d else f"cannot be reached: {n.unreachable}",
                    }
                )
        return out

    def headline(self) -> str:
        """The fleet's outcome, for its flow run's name: `3 targets: 2 healthy, 1 crashed; 1 recovered; 1 incident`."""
        count: dict[str, int] = defaultdict(int)
        for r in self.rows:
            count[r.verdict.value if r.verdict else "error"] += 1
        verdicts = ", ".join(f"{n} {v}" for v, n in sorted(count.items())) or "none"
        recovered = sum(r.recovered for r in self.rows)
        parts = [f"{self.targets} target{'s' if self.targets != 1 else ''}: {verdicts}"]
        parts += [f"{recovered} recovered"] if recovered else []
        parts += [f"{len(self.incidents)} incident{'s' if len(self.incidents) != 1 else ''}"] if self.incidents else []
        return "; ".join(parts)

    def summary(self) -> str:
        count: dict[str, int] = defaultdict(int)
        for r in self.rows:
            count[r.verdict.value if r.verdict else "error"] += 1
        recovered = sum(r.recovered for r in self.rows)
        verdicts = ", ".join(f"{n} {v}" for v, n in sorted(count.items()))
        return f"{self.targets} targets: {verdicts}; {recovered} recovered; checks {self.check_phase_seconds:.1f} s ({self.checks_per_minute:.0f}/min)"
