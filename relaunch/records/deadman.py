"""The dead-man alarm: a Prefect automation that tells a person when a nightly check did not run at all.

Every health check announces `relaunch.verdict.<verdict>` about its target (flows/recover.py checked). A nightly
check that never ran (its worker dead, the server down, the schedule paused by mistake) announces nothing, and
nothing else would say so: this automation is Proactive, so the server fires it when fewer than one such event
came within the deployment's schedule interval plus a slack. Pure: the automation as automations.yaml writes one
(`block: NAME` for its notification block); relaunch/cli/automations.py (`make serve`, `relaunch deploy`) puts it on
the server, and `relaunch undeploy` takes it away.
"""

from __future__ import annotations

import re
from typing import Any

NAME_PREFIX = "relaunch-deadman-"
# Prefect refuses a Proactive trigger's window shorter than this.
MIN_WITHIN_SECONDS = 10.0


def deadman_name(deployment: str, target_name: str) -> str:
    """`relaunch-deadman-check-training-nightly-demo-relaunch-demo` for the target `relaunch-demo` of the deployment
    `check-training/nightly-demo` (a fleet's deployment has one per target)."""
    return NAME_PREFIX + re.sub(r"[^a-z0-9]+", "-", f"{deployment} {target_name}".lower()).strip("-")


def deadman_automation(
    target_name: str, deployment: str, schedule_interval_seconds: float, slack_seconds: float, block: str = "relaunch-notify"
) -> dict[str, Any]:
    """The Proactive automation for one nightly deployment: no verdict about `target_name` within the schedule's
    interval plus `slack_seconds` tells a person through the notification block `block`."""
    within = max(MIN_WITHIN_SECONDS, schedule_interval_seconds + slack_seconds)
    hours = within / 3600
    return {
        "name": deadman_name(deployment, target_name),
        "description": f"No health check of {target_name} within {hours:.1f} h (the schedule of {deployment} plus a slack): the nightly check did not run.",
        "enabled": True,
        "trigger": {
            "type": "event",
            "posture": "Proactive",
            "expect": ["relaunch.verdict.*"],
            "match": {"prefect.resource.id": f"relaunch.target.{target_name}"},
            "threshold": 1,
            "within": within,
        },
        "actions": [
            {
                "type": "send-notification",
                "block": block,
                "subject": f"relaunch: no nightly check of {target_name} for {_duration(within)}",
                "body": (
                    f"No health check of {target_name} reported a verdict within {_duration(within)} "
                    f"(the schedule of {deployment}, {_duration(schedule_interval_seconds)}, plus {_duration(slack_seconds)} of slack).\n"
                    "The nightly check itself did not run. Look, in this order: is the deployment or its schedule paused "
                    f"(`prefect deployment inspect '{deployment}'`), is a worker polling its work pool (`prefect worker ls` / "
                    "`prefect work-pool inspect relaunch`), did its last flow run end Crashed or stay Scheduled/Late? "
                    f"Then run it now: `prefect deployment run '{deployment}'`."
                ),
            }
        ],
    }


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"
