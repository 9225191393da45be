"""`relaunch doctor TARGET`: is the target reachable and sane, before the first night? Changes nothing of the user's.

The order and every reading are relaunch/plans/doctor.py's; here they are run: the route hop by hop over a
transport of the doctor's own (never the flows' pooled one), the one host script, then the Prefect API as the
flow commands probe it (relaunch/cli/tempserver.py). No host key is ever recorded here, whatever
trust_on_first_use says: the doctor tells a person about an unknown key, it does not accept it.
"""

from __future__ import annotations

from relaunch.config import Host, Target
from relaunch.errors import RelaunchError, Result
from relaunch.plans.doctor import Check, Status, api_check, host_checks, plan_doctor, route_checks, split_advice
from relaunch.wire.transport import LocalTransport, Transport

# A server that is up answers /health in milliseconds; the doctor should not sit for the flows' 10 s on a hung one.
API_TIMEOUT_SECONDS = 5.0


def strict(host: Host) -> Host:
    """The host with trust-on-first-use off on every hop: the doctor reports an unknown key rather than recording it."""
    update: dict[str, object] = {"trust_on_first_use": False}
    if host.jump:  # left unset otherwise: an unset jump is what lets ~/.ssh/config's ProxyJump apply
        update["jump"] = [j.model_copy(update={"trust_on_first_use": False}) for j in host.jump]
    return host.model_copy(update=update)


def examine(target: Target, api_url: str | None, api_timeout_seconds: float = API_TIMEOUT_SECONDS) -> list[Check]:
    """Every check, in order; `api_url` is the Prefect API the flow commands would use (None: none configured)."""
    from relaunch.cli.tempserver import api_health

    problem = api_health(api_url, api_timeout_seconds) if api_url else None
    return [*_host_side(target), api_check(api_url, problem.what if problem else None)]


def _host_side(target: Target) -> list[Check]:
    transport: Transport
    if target.host.kind == "local":
        transport = LocalTransport(target.host)
        checks = [Check(name="host", status=Status.OK, detail="this machine (kind: local)")]
    else:
        from relaunch.wire.ssh import SSHTransport
        from relaunch.wire.sshconfig import resolve

        given = resolve(target.host).host  # as ~/.ssh/config makes it (unchanged without ssh_config)
        ssh = SSHTransport(strict(target.host))
        transport = ssh
        hops = ssh.reach()
        checks = route_checks(hops, [j.trust_on_first_use for j in given.jump] + [given.trust_on_first_use])
        if hops[-1][1] is not None:
            ssh.close()
            return checks
    try:
        result: Result = transport.execute(plan_doctor(target))
    except RelaunchError as exc:
        what, advice = split_advice(exc)
        return [*checks, Check(name="host checks", status=Status.FAIL, detail=what, advice=advice or "run the doctor again")]
    finally:
        transport.close()
    return [*checks, *host_checks(target, result)]
