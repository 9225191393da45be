"""Put relaunch's automations (automations.yaml) on the Prefect server, and keep paused schedules paused.

    relaunch automations sync [--file automations.yaml]   # after `prefect deploy` (make serve runs it)
    relaunch automations save-paused                        # before `prefect deploy`

The automations file ships inside the package (relaunch/cli/automations.yaml; the repository's automations.yaml
links to it), so `relaunch deploy` puts the same automations on a server from an installed wheel.

`sync`, in order:
  1. re-pauses what `save-paused` recorded (a deployment paused as a whole, a schedule switched off) if
     `prefect deploy` switched it back on, then removes the record;
  2. with RELAUNCH_NOTIFY_URL set, creates or updates the notification block `relaunch-notify`: a Custom
     Webhook block that POSTs {"subject", "body", "text"} as JSON to that URL;
  3. creates or updates every automation in the file, and a dead-man alarm for every scheduled deployment
     tagged `nightly` (relaunch/records/deadman.py; the file's `deadman:` sets its slack), by name: one that exists
     is updated in place (its enabled/paused flag is kept as a person left it), extra copies of the same
     name are deleted, a new one is created; a dead-man alarm whose deployment is gone is deleted. A
     send-notification action names its block (`block: relaunch-notify`); when no notification block of
     that name exists, the automation gets a do-nothing action and this says so.

Uses PREFECT_API_URL like any Prefect client. Exit 0 when everything is in place, 1 (with the reason)
otherwise. Safe to run any number of times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

# Beside this module, in the wheel too.
AUTOMATIONS_FILE = Path(__file__).resolve().parent / "automations.yaml"
NOTIFY_BLOCK = "relaunch-notify"
URL_VARIABLE = "RELAUNCH_NOTIFY_URL"
# What the webhook receives: Prefect's Custom Webhook block fills {{subject}} and {{body}}; `text` is
# what Slack-, Mattermost- and Discord-style incoming webhooks read.
WEBHOOK_JSON = {"subject": "{{subject}}", "body": "{{body}}", "text": "{{subject}}\n{{body}}"}


def paused_record() -> Path:
    from prefect.settings import PREFECT_HOME

    return Path(PREFECT_HOME.value()) / "relaunch-paused.json"


def load_spec(path: Path) -> list[dict[str, Any]]:
    spec = yaml.safe_load(path.read_text()) or {}
    automations = spec.get("automations") if isinstance(spec, dict) else spec
    if not isinstance(automations, list) or not all(isinstance(a, dict) and a.get("name") for a in automations):
        raise SystemExit(f"{path}: expected `automations:` as a list of automations, each with a name")
    names = [a["name"] for a in automations]
    if len(set(names)) != len(names):
        raise SystemExit(f"{path}: an automation name appears twice: {names}")
    return automations


# --------------------------------------------------------------------------------------------------
# Paused schedules and deployments across `prefect deploy`.


async def _all_deployments(client) -> list:
    found, offset = [], 0
    while True:
        page = await client.read_deployments(limit=200, offset=offset)
        found += page
        if len(page) < 200:
            return found
        offset += 200


async def save_paused(client, record: Path) -> list[str]:
    """Record every paused deployment and every inactive schedule; merged with a record a failed deploy left."""
    entries: dict[str, dict[str, Any]] = {}
    if record.exists():
        for entry in json.loads(record.read_text()):
            entries[json.dumps(entry, sort_keys=True)] = entry
    for d in await _all_deployments(client):
        if d.paused:
            entry = {"deployment_id": str(d.id), "deployment": d.name, "paused": True}
            entries[json.dumps(entry, sort_keys=True)] = entry
        for s in d.schedules or []:
            if not s.active:
                entry = {"deployment_id": str(d.id), "deployment": d.name, "slug": s.slug, "schedule": s.schedule.model_dump(mode="json")}
                entries[json.dumps(entry, sort_keys=True)] = entry
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(list(entries.values()), indent=1))
    return [_describe(e) for e in entries.values()]


def _describe(entry: dict[str, Any]) -> str:
    if entry.get("paused"):
        return f"deployment {entry['deployment']} (paused)"
    what = entry.get("slug") or entry["schedule"].get("cron") or entry["schedule"].get("interval") or entry["schedule"].get("rrule")
    return f"deployment {entry['deployment']}: schedule {what} (off)"


async def restore_paused(client, record: Path) -> list[str]:
    """Pause again what `save-paused` recorded and `prefect deploy` switched on; returns what it re-paused."""
    from prefect.exceptions import ObjectNotFound

    if not record.exists():
        return []
    repaused = []
    for entry in json.loads(record.read_text()):
        try:
            d = await client.read_deployment(entry["deployment_id"])
        except ObjectNotFound:
            continue  # deleted since: nothing to keep paused
        if entry.get("paused"):
            if not d.paused:
                await client.pause_deployment(d.id)
                repaused.append(_describe(entry))
            continue
        for s in d.schedules or []:
            same = s.slug == entry["slug"] if entry.get("slug") else s.schedule.model_dump(mode="json") == entry["schedule"]
            if same and s.active:
                await client.update_deployment_schedule(d.id, s.id, active=False)
                repaused.append(_describe(entry))
    record.unlink()
    return repaused


# --------------------------------------------------------------------------------------------------
# The notification block and the automations.


async def notification_blocks(client, name: str) -> list[dict[str, Any]]:
    """Block documents of that name whose type can notify (any type: Custom Webhook, Slack, Sendgrid email, ...)."""
    response = await client.request(
        "POST",
        "/block_documents/filter",
        json={"block_documents": {"name": {"any_": [name]}}, "block_schemas": {"block_capabilities": {"all_": ["notify"]}}},
    )
    response.raise_for_status()
    return sorted(response.json(), key=lambda b: b.get("updated") or "", reverse=True)


async def ensure_webhook_block(url: str) -> None:
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    block = CustomWebhookNotificationBlock(name="relaunch", url=url, method="POST", json_data=WEBHOOK_JSON, timeout=10)
    await block.asave(NOTIFY_BLOCK, overwrite=True)


async def resolve_blocks(client, automations: list[dict[str, Any]], url: str | None, say) -> dict[str, str | None]:
    """Block name -> block document id (None when there is none), for every `block:` the automations name."""
    wanted = sorted({a["block"] for auto in automations for a in auto.get("actions") or [] if "block" in a})
    if url and NOTIFY_BLOCK not in wanted:
        wanted.append(NOTIFY_BLOCK)
    ids: dict[str, str | None] = {}
    for name in wanted:
        if url and name == NOTIFY_BLOCK:
            await ensure_webhook_block(url)
        found = await notification_blocks(client, name)
        if url and name == NOTIFY_BLOCK:
            found = [b for b in found if (b.get("block_type") or {}).get("slug") == "custom-webhook"] or found
        if not found:
            ids[name] = None
            say(
                f"no notification block {name!r}: its automations fire but notify nobody (set {URL_VARIABLE}, or create a notification block named {name!r}, then run `relaunch automations sync` again)"
            )
            continue
        if len(found) > 1:
            say(f"{len(found)} notification blocks are named {name!r}; using the {found[0]['block_type']['slug']} one, updated last")
        block = found[0]
        ids[name] = block["id"]
        target = f" -> {_redacted(url)}" if url and name == NOTIFY_BLOCK else ""
        say(f"notification block {name!r} ({block['block_type']['slug']}){target}")
    return ids


def _redacted(url: str) -> str:
    """The URL without its path and query (a Slack or Discord webhook URL is a secret)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/..." if parts.path not in ("", "/") or parts.query else url


def with_blocks(spec: dict[str, Any], block_ids: dict[str, str | None]):
    """The automation as Prefect's AutomationCore: `block: NAME` becomes `block_document_id`, or do-nothing."""
    from prefect.events.schemas.automations import AutomationCore

    def action(a: dict[str, Any]) -> dict[str, Any]:
        if "block" not in a:
            return a
        block_id = block_ids.get(a["block"])
        if block_id is None:
            return {"type": "do-nothing"}
        return {**{k: v for k, v in a.items() if k != "block"}, "block_document_id": block_id}

    data = dict(spec)
    for key in ("actions", "actions_on_trigger", "actions_on_resolve"):
        if key in data:
            data[key] = [action(a) for a in data[key] or []]
    return AutomationCore.model_validate(data)


async def upsert(client, automation) -> str:
    """Create or update by name; never a second automation of the same name."""
    from prefect.events.schemas.automations import Automation

    response = await client.request(
        "POST", "/automations/filter", json={"sort": "CREATED_DESC", "automations": {"name": {"any_": [automation.name]}}}
    )
    response.raise_for_status()
    # Oldest first: the first one made keeps its id (links to it stay good); later copies go.
    existing = [a for a in reversed(Automation.model_validate_list(response.json())) if a.name == automation.name]
    if not existing:
        await client.create_automation(automation)
        return "created"
    keep, *extra = existing
    for duplicate in extra:
        await client.delete_automation(duplicate.id)
    # A person's pause (UI, `prefect automation pause`) outlives `make serve`.
    await client.update_automation(keep.id, automation.model_copy(update={"enabled": keep.enabled}))
    return "updated" + (f", {len(extra)} duplicate(s) deleted" if extra else "") + ("" if keep.enabled else " (kept paused)")


# --------------------------------------------------------------------------------------------------
# The dead-man alarm: one Proactive automation per scheduled nightly deployment (relaunch/records/deadman.py).


def load_deadman(path: Path) -> dict[str, Any]:
    """The file's `deadman:` settings: `slack_seconds` (default 7200), `block`, `tag` (default nightly)."""
    spec = yaml.safe_load(path.read_text()) or {}
    found = (spec.get("deadman") if isinstance(spec, dict) else None) or {}
    return {"slack_seconds": 7200.0, "block": NOTIFY_BLOCK, "tag": "nightly", **found}


async def schedule_interval_seconds(schedules: list[Any]) -> float | None:
    """The longest gap between two runs the deployment's schedules (on or off) would make next: a paused schedule is
    what the alarm is for. None where it has no schedule."""
    from prefect.server.schemas import schedules as server

    kinds = {"IntervalSchedule": server.IntervalSchedule, "CronSchedule": server.CronSchedule, "RRuleSchedule": server.RRuleSchedule}
    dates: list[Any] = []
    for s in schedules:
        kind = kinds.get(type(s.schedule).__name__)
        if kind is not None:
            dates += await kind.model_validate(s.schedule.model_dump()).get_dates(n=16)
    dates.sort()
    gaps = [(b - a).total_seconds() for a, b in zip(dates, dates[1:])]
    return max(gaps) if gaps else None


async def deadman_specs(client, settings: dict[str, Any]) -> list[dict[str, Any]]:
    """One dead-man automation per target of each deployment tagged `settings['tag']` that has a schedule: its
    `target` parameter (check-training) or each of its `targets` (check-fleet)."""
    from relaunch.records.deadman import deadman_automation

    specs = []
    for d in await _all_deployments(client):
        parameters = d.parameters or {}
        targets = [parameters.get("target"), *(parameters.get("targets") or [])]
        names = [t["name"] for t in targets if isinstance(t, dict) and t.get("name")]
        if settings["tag"] not in (d.tags or []) or not names:
            continue
        interval = await schedule_interval_seconds(d.schedules or [])
        if interval is None:
            continue
        flow = await client.read_flow(d.flow_id)
        slack = float(settings["slack_seconds"])
        specs += [deadman_automation(name, f"{flow.name}/{d.name}", interval, slack, settings["block"]) for name in names]
    return specs


async def remove_stale_deadmen(client, keep: set[str]) -> list[str]:
    """Dead-man automations of deployments that are gone (or no longer nightly): deleted, so none fires forever."""
    from relaunch.records.deadman import NAME_PREFIX

    stale = [a for a in await client.read_automations() if a.name.startswith(NAME_PREFIX) and a.name not in keep]
    for automation in stale:
        await client.delete_automation(automation.id)
    return [a.name for a in stale]


async def prune_deadmen(client, spec_path: Path) -> list[str]:
    """Delete the dead-man alarms no scheduled nightly deployment on the server needs any more (`relaunch undeploy`)."""
    return await remove_stale_deadmen(client, {a["name"] for a in await deadman_specs(client, load_deadman(spec_path))})


async def sync(spec_path: Path, record: Path, say) -> None:
    from prefect.client.orchestration import get_client

    url = os.environ.get(URL_VARIABLE) or None
    async with get_client() as client:
        for line in await restore_paused(client, record):
            say(f"kept paused: {line}")
        automations = load_spec(spec_path) + await deadman_specs(client, load_deadman(spec_path))
        for name in await remove_stale_deadmen(client, {a["name"] for a in automations}):
            say(f"automation {name!r} deleted: its nightly deployment is gone")
        block_ids = await resolve_blocks(client, automations, url, say)
        for spec in automations:
            core = with_blocks(spec, block_ids)
            outcome = await upsert(client, core)
            notifies = [
                block for block, bid in block_ids.items() if bid and any(a.get("block") == block for a in spec.get("actions") or [])
            ]
            say(f"automation {core.name!r} {outcome}" + (f", notifies through {', '.join(notifies)}" if notifies else ", notifies nobody"))


async def save(record: Path, say) -> None:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        for line in await save_paused(client, record):
            say(f"paused before deploy: {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", default="sync", choices=["sync", "save-paused"])
    parser.add_argument(
        "--file",
        type=Path,
        default=AUTOMATIONS_FILE,
        help="the automations file (default: the one relaunch ships, automations.yaml)",
    )
    parser.add_argument(
        "--paused-record",
        type=Path,
        default=None,
        help="where save-paused writes and sync reads (default: $PREFECT_HOME/relaunch-paused.json)",
    )
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, flush=True)

    record = args.paused_record or paused_record()
    try:
        asyncio.run(sync(args.file, record, say) if args.command == "sync" else save(record, say))
    except SystemExit:
        raise
    except Exception as exc:  # one line with what went wrong, not a wall of traceback
        print(f"relaunch automations {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
