"""`relaunch deploy TARGET` / `relaunch undeploy TARGET`: a target's deployments from the installed package.

What one `relaunch deploy` puts on the Prefect server, each created or updated in place (run it again after editing
the target file; nothing is duplicated, a paused schedule or deployment stays paused):

* `check-training/nightly-NAME`: the nightly check (`recover: true`) on a cron schedule (slug `nightly`), one run at
  a time (a run due while the last still recovers is cancelled, never queued);
* `recover-training/NAME`: a recovery on demand (`prefect deployment run 'recover-training/NAME'`), no schedule;
* with `--watch`, `watch-training/watch-NAME`: the watch (a look every `--watch-interval-seconds`; a death starts
  recover-training at once), a run of WATCH_RUN_SECONDS started every WATCH_RUN_SECONDS (slug `watch`), one at a time;
* the work pool (a process pool, created when missing, an existing one left as it is);
* the host's global concurrency limit `relaunch-host-HOSTNAME` of 1 (one recovery per host across all workers);
* relaunch's automations (relaunch/cli/automations.yaml: escalations and failed nightly checks tell a person).

Both deployments name their flows by module path (`relaunch.flows.check.check_training`) and have no pull step: a
worker needs `pip install relaunch` and nothing else, no checkout. The target file's content is the deployments'
`target` parameter (docs/operations.md, "Deploying a target": why parameters rather than a block).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from relaunch.config import Target
from relaunch.errors import ConfigError, RelaunchError

NIGHTLY_SLUG = "nightly"
DEFAULT_POOL = "relaunch"
DEFAULT_CRON = "0 3 * * *"
WATCH_SLUG = "watch"
# One watch run's length, and its schedule's interval: a worker restart costs at most this much watching, and each
# run is a flow run of its own in the UI (its handovers in its logs) rather than one that never ends.
WATCH_RUN_SECONDS = 600.0
# relaunch's own log lines (SSH connects and reconnects, host-key notes) reach the flow run's logs.
JOB_VARIABLES = {"env": {"PREFECT_LOGGING_EXTRA_LOGGERS": "relaunch"}}


class Deployed(BaseModel):
    """What `relaunch deploy` left on the server."""

    target: str = Field(description="The target's name.")
    source: str = Field(description="The target file the deployments' parameters were read from.")
    check_deployment: str = Field(description="flow/deployment name of the nightly check.")
    recover_deployment: str = Field(description="flow/deployment name of the recovery on demand.")
    check_deployment_id: str
    recover_deployment_id: str
    cron: str = Field(description="The nightly check's cron schedule.")
    timezone: str = Field(description="The time zone the cron schedule is read in.")
    schedule_active: bool = Field(description="False: a person paused the nightly schedule, and it stays paused.")
    pool: str = Field(description="The work pool both deployments run on.")
    host_limit: str = Field(description="The host's global concurrency limit (limit 1).")
    automations: list[str] = Field(default_factory=list, description="What the automations sync said, one line each.")
    watch_deployment: str | None = Field(None, description="flow/deployment name of the watch (deployed with --watch).")
    watch_interval_seconds: float | None = Field(None, description="Seconds between the watch's looks at the target.")


def deployment_names(name: str) -> tuple[str, str]:
    """(nightly check, recovery) as `flow/deployment`."""
    return f"check-training/nightly-{name}", f"recover-training/{name}"


def watch_deployment_name(name: str) -> str:
    return f"watch-training/watch-{name}"


def require_api(command: str, why: str = "deployments on a temporary server vanish with it") -> str:
    """The configured Prefect API; deploying onto a temporary server would vanish with it, so none is refused.

    `command`: the relaunch command that asked (`deploy`, `automations sync`), named in the advice; `why` a temporary
    server will not do for it."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        raise ConfigError(
            f"no Prefect API is configured, and {why}\n"
            "  what to do: point PREFECT_API_URL at your server (e.g. export PREFECT_API_URL=http://127.0.0.1:4200/api; "
            f"`relaunch services --systemd` writes units that run one), then run `relaunch {command}` again"
        )
    return url


def deploy(
    target: Target,
    source: Path,
    cron: str,
    timezone: str,
    pool: str,
    say: Callable[[str], None],
    watch_interval_seconds: float | None = None,
) -> Deployed:
    """Create or update everything the target's nightly check needs on the server (see the module's docstring);
    with `watch_interval_seconds`, its watch too."""
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule
    from prefect.deployments.runner import EntrypointType, RunnerDeployment

    from relaunch.cli.automations import AUTOMATIONS_FILE, paused_record, sync
    from relaunch.flows.check import check_training
    from relaunch.flows.outcome import run_tags
    from relaunch.flows.recover import host_limit_name, recover_training
    from relaunch.flows.watch import watch_training

    require_api("deploy")
    try:
        schedule = CronSchedule(cron=cron, timezone=timezone)
    except ValueError as exc:
        raise ConfigError(f"--cron {cron!r} --timezone {timezone!r}: {exc.errors()[0]['msg'] if hasattr(exc, 'errors') else exc}") from None
    check_name, recover_name = deployment_names(target.name)
    asyncio.run(_ensure_pool_and_limit(pool, host_limit_name(target), say))
    parameters = target.model_dump(mode="json")
    tags = ["relaunch", *run_tags(target)]
    common: dict[str, Any] = dict(
        entrypoint_type=EntrypointType.MODULE_PATH,
        work_pool_name=pool,
        job_variables=JOB_VARIABLES,
        enforce_parameter_schema=True,
    )
    # With a slug the schedule is updated in place, and with `active` left unset a paused one stays paused.
    nightly = DeploymentScheduleCreate.model_construct(schedule=schedule, slug=NIGHTLY_SLUG, _fields_set={"schedule", "slug"})
    check = RunnerDeployment.from_flow(
        check_training,
        name=check_name.split("/", 1)[1],
        description=f"Nightly health check of {target.name} on {target.host.label} (from {source}); recovers it when crashed, stalled, degraded or never launched.",
        tags=[*tags, "nightly"],
        parameters={"target": parameters, "recover": True},
        schedules=[nightly],
        concurrency_limit=ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW),
        **common,
    )
    recover = RunnerDeployment.from_flow(
        recover_training,
        name=recover_name.split("/", 1)[1],
        description=f"Recover {target.name} on {target.host.label} (from {source}): diagnose, act through the playbook, check again.",
        tags=tags,
        parameters={"target": parameters, "force": False},
        **common,
    )
    ids = [_paused_kept(d) for d in (check, recover)]
    for name, deployment_id in zip((check_name, recover_name), ids):
        say(f"deployment {name} ({deployment_id}) on pool {pool!r}")
    watch_name = watch_deployment_name(target.name) if watch_interval_seconds else None
    if watch_name and watch_interval_seconds:
        every = DeploymentScheduleCreate.model_construct(
            schedule=IntervalSchedule(interval=timedelta(seconds=WATCH_RUN_SECONDS)), slug=WATCH_SLUG, _fields_set={"schedule", "slug"}
        )
        watch = RunnerDeployment.from_flow(
            watch_training,
            name=watch_name.split("/", 1)[1],
            description=f"Watch {target.name} on {target.host.label} (from {source}): a look every {watch_interval_seconds:g} s; a death starts recover-training at once.",
            tags=[*tags, "watch"],
            parameters={"target": parameters, "interval_seconds": watch_interval_seconds, "duration_seconds": WATCH_RUN_SECONDS},
            schedules=[every],
            # A run due while the last still watches (or waits for its recovery) is cancelled: one watch per target.
            concurrency_limit=ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW),
            **common,
        )
        say(f"deployment {watch_name} ({_paused_kept(watch)}) on pool {pool!r}: a look every {watch_interval_seconds:g} s")
    lines: list[str] = []
    asyncio.run(sync(AUTOMATIONS_FILE, paused_record(), lines.append))
    for line in lines:
        say(line)
    active = asyncio.run(_schedule_active(check_name))
    say(f"nightly schedule: {cron} ({timezone})" + ("" if active else " - paused, and left paused"))
    return Deployed(
        target=target.name,
        source=str(source),
        check_deployment=check_name,
        recover_deployment=recover_name,
        check_deployment_id=str(ids[0]),
        recover_deployment_id=str(ids[1]),
        cron=cron,
        timezone=timezone,
        schedule_active=active,
        pool=pool,
        host_limit=host_limit_name(target),
        automations=lines,
        watch_deployment=watch_name,
        watch_interval_seconds=watch_interval_seconds,
    )


def _paused_kept(deployment: Any) -> Any:
    """Apply; a deployment a person paused as a whole stays paused (an update sends `paused: false` otherwise)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            was_paused = client.read_deployment_by_name(deployment.full_name).paused
        except ObjectNotFound:
            was_paused = False
    deployment.paused = was_paused
    return deployment.apply()


async def _ensure_pool_and_limit(pool: str, limit_name: str, say: Callable[[str], None]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate, WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    async with get_client() as client:
        try:
            existing = await client.read_work_pool(pool)
            say(f"work pool {pool!r} ({existing.type}) exists: left as it is")
        except ObjectNotFound:
            try:
                await client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
                say(f"work pool {pool!r} (process) created: start a worker with `prefect worker start --pool {pool}`")
            except ObjectAlreadyExists:  # created meanwhile by another deploy
                pass
        try:
            await client.read_global_concurrency_limit_by_name(limit_name)
            await client.update_global_concurrency_limit(limit_name, GlobalConcurrencyLimitUpdate(limit=1, active=True))
        except ObjectNotFound:
            await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=limit_name, limit=1))
        say(f"concurrency limit {limit_name} = 1 (one recovery on the host at a time)")


async def _schedule_active(check_name: str) -> bool:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        d = await client.read_deployment_by_name(check_name)
    return any(s.active for s in d.schedules if s.slug == NIGHTLY_SLUG)


def undeploy(name: str, say: Callable[[str], None]) -> list[str]:
    """Delete the target's two deployments (their scheduled runs go with them); the host's limit goes when no other
    relaunch deployment names that host, and the nightly check's dead-man alarm with it (else it would tell a person,
    every day, that a check nobody wants did not run). Runs already going finish; the other automations stay (they
    serve every target)."""
    require_api("undeploy")
    return asyncio.run(_undeploy(name, say))


async def _undeploy(name: str, say: Callable[[str], None]) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    from relaunch.cli.automations import AUTOMATIONS_FILE, prune_deadmen

    removed: list[str] = []
    hosts: set[str] = set()
    async with get_client() as client:
        for full in (*deployment_names(name), watch_deployment_name(name)):
            try:
                d = await client.read_deployment_by_name(full)
            except ObjectNotFound:
                if full != watch_deployment_name(name):  # deployed only with --watch: its absence is no news
                    say(f"deployment {full}: none")
                continue
            hosts |= _host_limit_of(d.parameters)
            await client.delete_deployment(d.id)
            removed.append(full)
            say(f"deployment {full} deleted")
        if not removed:
            raise RelaunchError(f"no deployment of target {name!r} on this server (looked for {', '.join(deployment_names(name))})")
        for alarm in await prune_deadmen(client, AUTOMATIONS_FILE):
            say(f"automation {alarm} deleted: the dead-man alarm of a nightly check that is gone")
        still_used = {limit for d in await client.read_deployments() for limit in _host_limit_of(d.parameters)}
        for limit in sorted(hosts - still_used):
            try:
                await client.delete_global_concurrency_limit_by_name(limit)
                say(f"concurrency limit {limit} deleted (no other target on that host)")
            except ObjectNotFound:
                pass
    return removed


def _host_limit_of(parameters: dict[str, Any] | None) -> set[str]:
    """The host limit a deployment's `target` parameter needs; none for another flow's or a templated one."""
    from pydantic import ValidationError

    from relaunch.flows.recover import host_limit_name

    target = (parameters or {}).get("target")
    try:
        return {host_limit_name(Target.model_validate(target))} if isinstance(target, dict) else set()
    except ValidationError:
        return set()
