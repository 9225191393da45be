"""Being told, against a real Prefect server: a recovery that escalates -> a Failed flow run -> the
`relaunch.recovery.escalated` event -> the automation of automations.yaml -> a real HTTP receiver gets the
message. Also the failed-nightly-check automation, scripts/automations.py run twice, and what `make serve`
does to the nightly deployment (its concurrency limit, a paused schedule across `prefect deploy`).

One server for the module (`prefect server start` in its own PREFECT_HOME and port, analytics off, the
triggers and actions services on, as they are by default in 3.9.1), the automations synced once by
scripts/automations.py with RELAUNCH_NOTIFY_URL pointing at a local http.server that records every request.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from relaunch.tasks.launch import launch
from relaunch.testing.faults import ROOT, cli_env, start_cli, wait_for, write_target
from relaunch.testing.targets import runs, shell_target, stop_all, wait_for_exit

BIN = Path(sys.executable).parent
AUTOMATIONS = ("relaunch-recovery-escalated", "relaunch-nightly-check-failed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Receiver:
    """A webhook receiver: records each request's JSON body; waits on a condition, never a sleep."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(204)
                self.end_headers()
                with receiver.changed:
                    receiver.messages.append(json.loads(body))
                    receiver.changed.notify_all()

            def log_message(self, *args) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_port}/relaunch-hook"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def wait(self, predicate, timeout: float, what: str) -> dict:
        """The first message the predicate accepts, waiting until `timeout` seconds for it to arrive."""
        with self.changed:
            if not self.changed.wait_for(lambda: any(predicate(m) for m in self.messages), timeout):
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; received: {self.messages}")
            return next(m for m in self.messages if predicate(m))

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


class Server:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.log = home / "server.log"
        home.mkdir(parents=True)
        env = {
            **os.environ,
            "PREFECT_HOME": str(home),
            "PREFECT_API_URL": self.api_url,  # the server's own address, for the UI links in messages
            "DO_NOT_TRACK": "1",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_UI_ENABLED": "false",
            # Automations need the triggers and actions services (one setting, on by default) and the
            # event persister (on by default) for reading events back; said here so nobody turns them off.
            "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "true",
            "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED": "true",
            "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": "prefect.server.concurrency.lease_storage.filesystem",
            # Proactive automations (the dead-man alarm) are evaluated every 5 s by default: every second here, so a
            # test window of 10 s (Prefect's least for a Proactive trigger) fires within a second of its end.
            "PREFECT_SERVER_EVENTS_PROACTIVE_GRANULARITY": "PT1S",
        }
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def healthy(self) -> bool:
        import httpx

        assert self.process.poll() is None, f"the server exited: {self.log.read_text()[-3000:]}"
        try:
            return httpx.get(f"{self.api_url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "PREFECT_API_URL": self.api_url,
            "PREFECT_HOME": str(self.home / "client"),
            "DO_NOT_TRACK": "1",
            "PREFECT_CLI_PROMPT": "false",
            **extra,
        }

    def api(self, call):
        """Run `await call(client)` against this server, from this process."""
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        async def go():
            async with get_client() as client:
                return await call(client)

        with temporary_settings({PREFECT_API_URL: self.api_url}):
            return asyncio.run(go())

    def sync_api(self, call):
        """`call(client)` with a synchronous client of this server (what relaunch's own tasks use)."""
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: self.api_url}), get_client(sync_client=True) as client:
            return call(client)

    def run(self, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
        out = subprocess.run(list(args), cwd=ROOT, env=self.env(**env), capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, f"{args} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        return out

    def sync_automations(self, *args: str, **env: str) -> str:
        return self.run(sys.executable, "scripts/automations.py", *args, **env).stdout

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # the session this test started for the server
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory, receiver):
    s = Server(tmp_path_factory.mktemp("notify") / "home")
    try:
        wait_for(s.healthy, 180, "the Prefect server to answer /api/health", interval=0.2)
        out = s.sync_automations(RELAUNCH_NOTIFY_URL=receiver.url)
        assert "notification block 'relaunch-notify' (custom-webhook)" in out, out
        yield s
    finally:
        s.stop()


def flow_run_named(server: Server, name: str):
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    # A run is renamed by what happened as it ends (`check-nightly: crashed (error) -> not recovered`): NAME, then `: `.
    runs = server.api(lambda c: c.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=name))))
    runs = [r for r in runs if r.name == name or r.name.startswith(f"{name}: ")]
    assert len(runs) == 1, f"one flow run named {name}: {runs}"
    return runs[0]


def events(server: Server, name: str, resource_id: str) -> list:
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    page = server.api(
        lambda c: c.read_events(
            filter=EventFilter(event=EventNameFilter(name=[name]), resource=EventResourceFilter(id=[resource_id])), limit=50
        )
    )  # the server allows 50, the client asks 100 by default
    return page.events


def test_a_recovery_that_escalates_fails_its_flow_run_emits_the_event_and_the_webhook_gets_the_message(server, receiver, tmp_path):
    target = shell_target(tmp_path, name="escalates", launch_command="python3 -c \"import json; json.loads('{broken')\"", max_attempts=3)
    spec = write_target(target, tmp_path / "target.yaml")
    output = tmp_path / "recover.out"
    try:
        proc = start_cli(["recover", str(spec), "--json"], cli_env(tmp_path / "cli-home", server.api_url), output)
        code = proc.wait(timeout=240)
    finally:
        stop_all(target)
    assert code == 1, f"a recovery that gave up exits 1, not {code}:\n{output.read_text()[-4000:]}"

    run = flow_run_named(server, "recover-escalates")
    assert run.state.is_failed(), f"{run.state.type}: {run.state.message}"
    assert run.state.message.startswith("escalates on local: crashed (error): "), run.state.message

    # The receiver is waited on first: the event persister writes in batches, the automation acts at once.
    message = receiver.wait(lambda m: "escalates" in m["subject"], 60, "the escalation message")
    (event,) = wait_for(
        lambda: events(server, "relaunch.recovery.escalated", "relaunch.target.escalates"), 60, "the escalation event to be stored"
    )
    assert event.resource["relaunch.host"] == "local" and event.resource["relaunch.cause"] == "error"
    assert f"prefect.flow-run.{run.id}" in [r.id for r in event.related], "the event names the flow run"
    first_evidence = event.payload["evidence"][0]
    assert "JSONDecodeError" in first_evidence, event.payload["evidence"]

    body = message["body"]
    for line in (
        "target: escalates",
        "host: local",
        "cause: error",
        f"first evidence line: {first_evidence}",
        "flow run: recover-escalates",
    ):
        assert line in body, f"{line!r} missing from the message:\n{body}"
    assert message["subject"] == "relaunch: escalates on local needs a person (error)"
    assert message["text"] == f"{message['subject']}\n{body}", "the `text` field is what Slack-style hooks show"


def test_a_restart_storm_is_told_with_its_nights(server, receiver, tmp_path):
    """The third night of one crash from the same (no) checkpoint: the first two nights are this run's own diagnosis,
    dated back a day each and stored as the recoveries of those nights store them (docs/nights.md)."""
    from datetime import UTC, datetime, timedelta

    from prefect.client.schemas.actions import VariableCreate

    from relaunch.deciding.history import History, night_of
    from relaunch.tasks.health import poll_until_settled
    from relaunch.tasks.memory import HISTORY_TAG, history_variable

    target = shell_target(tmp_path, name="stormy", env={"EXIT_AT": "2", "EXIT_CODE": "3"})
    spec = write_target(target, tmp_path / "target.yaml")
    try:
        launch.fn(target, 1)
        wait_for_exit(target)
        found = poll_until_settled(target)
        now = datetime.now(UTC)
        history = History(target=target.name)
        for days in (2, 1):
            history = history.with_night(night_of(found.diagnosis, found.snapshot.checkpoint, now - timedelta(days=days)))
        value = history.model_dump(mode="json")
        server.api(lambda c: c.create_variable(VariableCreate(name=history_variable(target), value=value, tags=[HISTORY_TAG])))
        output = tmp_path / "recover.out"
        code = start_cli(["recover", str(spec)], cli_env(tmp_path / "cli-home", server.api_url), output).wait(timeout=240)
    finally:
        stop_all(target)
    assert code == 1, output.read_text()[-4000:]
    message = receiver.wait(lambda m: "stormy" in m["subject"], 60, "the restart storm's message")
    assert "why: restart storm: crashed/error returned 3 times within 72 h" in message["body"], message["body"]
    assert "Nights: " in message["body"] and message["body"].count("crashed/error from no checkpoint") == 3, message["body"]


def test_a_gpu_in_the_ledger_with_no_spare_is_told_by_its_bus_id_and_the_ledger(server, receiver, tmp_path):
    """Last night GPU 0 threw Xid 79 (the kernel's lines: a public capture, stored as a recovery stores them); tonight
    the run on it crashes of something else and the target has no spare: the recovery escalates, naming the GPU."""
    from datetime import UTC, datetime, timedelta

    from relaunch.deciding.ledger import Ledger, gpu_faults
    from relaunch.tasks.memory import write_ledger
    from tests.test_nights import snapshot_of

    target = shell_target(tmp_path, name="ledgered", env={"EXIT_AT": "2", "EXIT_CODE": "3", "CUDA_VISIBLE_DEVICES": "0"})
    spec = write_target(target, tmp_path / "target.yaml")
    ledger = Ledger(host=target.host.hostname).with_faults(
        gpu_faults(snapshot_of("xid79_journal.txt"), [0]), datetime.now(UTC) - timedelta(days=1), "ledgered"
    )
    assert [g.bus_id for g in ledger.gpus] == ["00000000:00:06.0"]
    server.sync_api(lambda c: write_ledger(c, ledger))
    try:
        launch.fn(target, 1)
        wait_for_exit(target)
        output = tmp_path / "recover.out"
        code = start_cli(["recover", str(spec)], cli_env(tmp_path / "cli-home", server.api_url), output).wait(timeout=240)
        launches = len(runs(target))
    finally:
        stop_all(target)
        server.sync_api(lambda c: write_ledger(c, Ledger(host=target.host.hostname)))
    assert code == 1, output.read_text()[-4000:]
    assert launches == 1, "never relaunched onto the ledgered GPU"
    run = flow_run_named(server, "recover-ledgered")
    assert run.state.is_failed() and "in the GPU ledger since" in run.state.message, run.state.message
    message = receiver.wait(lambda m: "ledgered" in m["subject"], 60, "the ledgered GPU's message")
    why = "why: GPU 0 (PCI 00000000:00:06.0, GPU-b30686fb-50e5-b296-a563-b7746cd0b24a, serial 0) in the GPU ledger since "
    assert why in message["body"] and "never given back to a relaunch" in message["body"], message["body"]


def test_a_failed_nightly_check_is_told_with_its_one_line_state_message(server, receiver, tmp_path):
    target = shell_target(tmp_path / "nightly", name="nightly", env={"EXIT_AT": "2", "EXIT_CODE": "7"})
    spec = write_target(target, tmp_path / "target.yaml")
    # The same check of another crashed target without the tag: a Failed check that is not a nightly one.
    daytime = shell_target(tmp_path / "daytime", name="daytime", env={"EXIT_AT": "2", "EXIT_CODE": "7"})
    daytime_spec = write_target(daytime, tmp_path / "daytime.yaml")
    # A flow run tagged `nightly`, as the nightly deployment's runs are; recover=False: the check finds it crashed.
    # The untagged one first: by the time the nightly message arrives, a message for it would have been sent too.
    script = (
        "import sys, yaml\n"
        "from prefect import tags\n"
        "from relaunch.flows.check import check_training\n"
        "from relaunch.config import Target\n"
        "nightly, daytime = (Target.model_validate(yaml.safe_load(open(p))) for p in sys.argv[1:3])\n"
        "untagged = check_training(daytime, recover=False, return_state=True)\n"
        "with tags('nightly'):\n"
        "    state = check_training(nightly, recover=False, return_state=True)\n"
        "sys.exit(0 if state.is_failed() and untagged.is_failed() else 4)\n"
    )
    try:
        for t in (target, daytime):
            launch.fn(t, 1)
        for t in (target, daytime):
            wait_for_exit(t)
        out = subprocess.run(
            [sys.executable, "-c", script, str(spec), str(daytime_spec)],
            cwd=ROOT,
            env=cli_env(tmp_path / "cli-home", server.api_url),
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        stop_all(target, daytime)
    assert out.returncode == 0, f"the checks did not both end Failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"

    run = flow_run_named(server, "check-nightly")
    assert run.state.is_failed() and "nightly" in run.tags
    message = receiver.wait(lambda m: "check-nightly" in m["subject"], 60, "the failed-nightly-check message")
    assert message["subject"] == "relaunch: nightly check check-nightly: crashed (error) -> not recovered Failed", message["subject"]
    assert run.state.message in message["body"] and "nightly on local: crashed" in message["body"], message["body"]
    # This test's own untagged check failed too, before it, but is not a nightly check: never told as one.
    assert flow_run_named(server, "check-daytime").state.is_failed()
    assert not [m for m in receiver.messages if "check-daytime" in m["subject"]], receiver.messages


def test_running_the_sync_twice_leaves_one_automation_of_each_name_and_keeps_a_persons_pause(server, receiver):
    from prefect.events.schemas.automations import AutomationCore

    def named(name: str) -> list:
        return [a for a in server.api(lambda c: c.read_automations_by_name(name)) if a.name == name]

    (escalated,) = named(AUTOMATIONS[0])
    # A stray copy (someone ran `prefect automation create -f` by hand) and a person's pause of the other one.
    server.api(lambda c: c.create_automation(AutomationCore.model_validate(escalated.model_dump(exclude={"id"}))))
    (nightly,) = named(AUTOMATIONS[1])
    server.api(lambda c: c.pause_automation(nightly.id))
    try:
        first = server.sync_automations(RELAUNCH_NOTIFY_URL=receiver.url)
        second = server.sync_automations(RELAUNCH_NOTIFY_URL=receiver.url)
        assert "1 duplicate(s) deleted" in first and "duplicate" not in second, first + second
        for name in AUTOMATIONS:
            assert len(named(name)) == 1, f"exactly one automation named {name}"
        assert named(AUTOMATIONS[1])[0].enabled is False and "(kept paused)" in second
        assert named(AUTOMATIONS[0])[0].id == escalated.id, "updated in place, not replaced"
        (action,) = named(AUTOMATIONS[0])[0].actions
        assert action.type == "send-notification"
    finally:
        server.api(lambda c: c.resume_automation(nightly.id))


def test_without_a_notification_block_the_automations_are_still_created_and_say_they_notify_nobody(server, tmp_path):
    import yaml

    # automations.yaml under other names, naming a block that does not exist (the server's own relaunch-notify
    # exists, wired by the fixture), synced without RELAUNCH_NOTIFY_URL.
    spec = yaml.safe_load((ROOT / "automations.yaml").read_text())
    for auto in spec["automations"]:
        auto["name"] += "-unwired"
        for action in auto["actions"]:
            if "block" in action:
                action["block"] = "nobody-listens"
    path = tmp_path / "automations.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = server.sync_automations("--file", str(path), RELAUNCH_NOTIFY_URL="")
    assert "no notification block 'nobody-listens': its automations fire but notify nobody" in out, out
    for name in AUTOMATIONS:
        assert f"automation '{name}-unwired' created, notifies nobody" in out, out
        (auto,) = server.api(lambda c: c.read_automations_by_name(f"{name}-unwired"))
        assert [a.type for a in auto.actions] == ["do-nothing"] and auto.enabled
        server.api(lambda c: c.delete_automation(auto.id))


def test_the_nightly_deployment_cancels_a_second_run_and_a_paused_schedule_survives_make_serves_deploy(server, tmp_path):
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.states import Pending
    from prefect.workers.process import ProcessWorker

    server.api(
        lambda c: c.create_work_pool(
            WorkPoolCreate(name="relaunch", type="process", base_job_template=ProcessWorker.get_default_base_job_template())
        )
    )
    demo = {
        "RELAUNCH_DEMO_DIR": str(tmp_path / "demo"),
        "RELAUNCH_WHEELHOUSE": str(tmp_path / "wheels"),
        "RELAUNCH_DEMO_PYTHON": sys.executable,
    }

    def deploy() -> None:
        server.run(str(BIN / "prefect"), "deploy", "--all", **demo)

    def nightly():
        return server.api(lambda c: c.read_deployment_by_name("check-training/nightly-demo"))

    deploy()
    d = nightly()
    assert d.global_concurrency_limit.limit == 1 and d.concurrency_options.collision_strategy.value == "CANCEL_NEW"
    (schedule,) = d.schedules
    assert (schedule.active, schedule.slug, schedule.schedule.cron) == (True, "nightly-0300", "0 3 * * *")

    # Two nightly runs at once: the second is cancelled by the server, never queued behind the first.
    first, second = (server.api(lambda c: c.create_flow_run_from_deployment(d.id)) for _ in range(2))
    assert server.api(lambda c: c.set_flow_run_state(first.id, Pending())).state.is_pending()
    refused = server.api(lambda c: c.set_flow_run_state(second.id, Pending())).state
    assert refused.is_cancelled() and refused.message == "Deployment concurrency limit reached.", refused

    # A person pauses the schedule and the whole deployment; then make serve's sequence runs again.
    async def pause(c):
        await c.update_deployment_schedule(d.id, schedule.id, active=False)
        await c.pause_deployment(d.id)

    server.api(pause)
    saved = server.sync_automations("save-paused")
    assert "nightly-demo (paused)" in saved and "schedule nightly-0300 (off)" in saved, saved
    deploy()
    after_deploy = nightly()
    assert [(s.id, s.active) for s in after_deploy.schedules] == [(schedule.id, False)], (
        "the slug keeps the schedule, and its switch, across prefect deploy"
    )
    assert after_deploy.paused is False, "prefect deploy resumes a paused deployment (what save-paused is for)"
    synced = server.sync_automations()
    assert "kept paused: deployment nightly-demo (paused)" in synced, synced
    d = nightly()
    assert d.paused is True and [(s.id, s.active) for s in d.schedules] == [(schedule.id, False)]


def verdict_about(target_name: str) -> dict:
    """A verdict event as flows/recover.py checked announces it (the alarm reads only its name and resource id)."""
    import uuid
    from datetime import UTC, datetime

    return {
        "id": str(uuid.uuid4()),
        "occurred": datetime.now(UTC).isoformat(),
        "event": "relaunch.verdict.healthy",
        "resource": {"prefect.resource.id": f"relaunch.target.{target_name}", "prefect.resource.name": target_name},
        "payload": {},
    }


def test_a_nightly_check_that_never_runs_is_told_by_its_dead_man_alarm_and_one_whose_verdicts_keep_coming_is_not(
    server, receiver, tmp_path
):
    import time

    import yaml
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.schedules import IntervalSchedule

    from relaunch.records.deadman import deadman_name

    # Two nightly deployments every 6 s, paused (a schedule switched off by mistake: no check runs at all).
    async def deploy(c) -> list:
        flow_id = await c.create_flow_from_name("check-training")
        return [
            await c.create_deployment(
                flow_id,
                f"nightly-{name}",
                tags=["relaunch", "nightly"],
                parameters={"target": {"name": name}},
                schedules=[DeploymentScheduleCreate(schedule=IntervalSchedule(interval=6), active=False)],
                paused=True,
            )
            for name in ("quiet", "busy")
        ] + [
            # A fleet's nightly deployment: one alarm per target it checks.
            await c.create_deployment(
                await c.create_flow_from_name("check-fleet"),
                "nightly-fleet",
                tags=["nightly"],
                parameters={"targets": [{"name": "fleet-a"}, {"name": "fleet-b"}]},
                schedules=[DeploymentScheduleCreate(schedule=IntervalSchedule(interval=3600))],
                paused=True,
            )
        ]

    deployments = server.api(deploy)
    spec = tmp_path / "automations.yaml"
    spec.write_text(yaml.safe_dump({"deadman": {"slack_seconds": 4}, "automations": []}))
    try:
        synced = time.monotonic()  # no alarm exists before the sync makes it
        out = server.sync_automations("--file", str(spec), RELAUNCH_NOTIFY_URL="")
        for name in ("quiet", "busy"):
            assert (
                f"automation '{deadman_name(f'check-training/nightly-{name}', name)}' created, notifies through relaunch-notify" in out
            ), out
        for name in ("fleet-a", "fleet-b"):
            assert f"automation '{deadman_name('check-fleet/nightly-fleet', name)}' created" in out, out

        def post_verdict() -> None:
            server.api(lambda c: c.request("POST", "/events", json=[verdict_about("busy")]))

        # Verdicts about `busy` every 2 s; none about `quiet`, whose alarm is due 10 s after it was made.
        quiet = None
        while quiet is None and time.monotonic() - synced < 50:
            post_verdict()
            with receiver.changed:  # the beat's pace: 2 s, or at once when quiet's alarm arrives
                receiver.changed.wait_for(lambda: any("of quiet" in m["subject"] for m in receiver.messages), 2)
            quiet = next((m for m in receiver.messages if "of quiet" in m["subject"]), None)
        assert quiet is not None, f"no dead-man message for quiet within 50 s of the sync: {receiver.messages}"
        assert time.monotonic() - synced >= 10, "fired before its window of 10 s had passed"
        assert quiet["subject"] == "relaunch: no nightly check of quiet for 10 s", quiet
        assert "prefect deployment run 'check-training/nightly-quiet'" in quiet["body"], quiet["body"]
        # busy's window ended at the same evaluation: its alarm would have been sent with quiet's; one beat more to see.
        post_verdict()
        with receiver.changed:
            receiver.changed.wait_for(lambda: any("of busy" in m["subject"] for m in receiver.messages), 3)
        assert not [m for m in receiver.messages if "of busy" in m["subject"]], "verdicts kept coming: no alarm"
    finally:
        for d in deployments:
            server.api(lambda c: c.delete_deployment(d))
        gone = server.sync_automations("--file", str(spec), RELAUNCH_NOTIFY_URL="")
        assert f"automation '{deadman_name('check-training/nightly-quiet', 'quiet')}' deleted" in gone, gone
