"""The agents' control connection, through the real ASGI application: authentication, hello,
and a run deployed, started, fed and finished by agents over their WebSockets
(test_gateway_recovery.py: the runs that lose an agent)."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from orchestrator.protocol import PROTOCOL
from tests.webapp.factories import (
    DATA_KEY,
    DeviceFactory,
    RunFactory,
)
from tests.webapp.gateway.agents import agent, connect_all, deployed, planned_run, running
from webapp.asgi import application
from webapp.devices.models import Device, LayerProfile
from webapp.runs import services
from webapp.runs.models import FaultEvent, MetricPoint, Run, RunDevice, TimelineEvent
from webapp.runs.selectors import run_planning_inputs

pytestmark = pytest.mark.django_db(transaction=True)


def test_wrong_or_missing_keys_are_refused() -> None:
    device = DeviceFactory()

    async def scenario() -> list[tuple[bool, Any]]:
        out = []
        for link in (agent(device, key="dk_wrong"),
                     WebsocketCommunicator(application, "/ws/agent/")):
            out.append(await link.connect())
        return out

    assert async_to_sync(scenario)() == [(False, 4401), (False, 4401)]


def test_ping_hello_heartbeat_and_bad_messages() -> None:
    device = DeviceFactory(data_address="", status=Device.Status.OFFLINE)

    async def scenario() -> list[dict[str, Any]]:
        link = agent(device)
        assert (await link.connect())[0]
        replies = []
        for message in ({"type": "ping", "id": 1},
                        {"type": "hello", "data_key": DATA_KEY, "data_address": "http://x"},
                        {"type": "hello", "data_key": DATA_KEY, "data_address": "tcp://10.0.0.2:5601"},
                        {"type": "heartbeat", "status": "asleep"},
                        {"type": "teleport"},
                        {"type": "events", "run": 12345, "timeline": []}):
            await link.send_json_to(message)
            replies.append(await link.receive_json_from(timeout=5))
        await link.send_json_to({"type": "heartbeat", "status": "busy"})
        await link.send_json_to({"type": "ping", "id": 2})
        replies.append(await link.receive_json_from(timeout=5))
        await link.disconnect()
        return replies

    replies = async_to_sync(scenario)()
    assert replies[0]["type"] == "pong" and replies[0]["id"] == 1 and replies[0]["server_time"] > 0
    assert replies[1]["type"] == "error" and replies[1]["field"] == "data_address"
    assert replies[2]["type"] == "welcome"
    assert replies[3]["field"] == "status"
    assert replies[4]["field"] == "type" and "hello" in replies[4]["detail"]
    assert replies[5]["field"] == "run" and "has no run 12345" in replies[5]["detail"]
    device.refresh_from_db()
    # the connection closed: offline again, its data plane forgotten
    assert device.status == Device.Status.OFFLINE and device.data_address == ""


def test_hello_stores_the_agents_measured_fixed_costs() -> None:
    device = DeviceFactory(data_address="", status=Device.Status.OFFLINE)

    async def scenario() -> list[dict[str, Any]]:
        link = agent(device)
        assert (await link.connect())[0]
        replies = []
        for message in ({"type": "hello", "data_key": DATA_KEY, "data_address": "tcp://10.0.0.2:5601",
                         "overhead_s": 0.001, "message_s": -0.5},
                        {"type": "hello", "data_key": DATA_KEY, "data_address": "tcp://10.0.0.2:5601",
                         "overhead_s": 0.001, "message_s": 0.0002}):
            await link.send_json_to(message)
            replies.append(await link.receive_json_from(timeout=5))
            if message["message_s"] < 0:  # refused whole: nothing stored
                await database_sync_to_async(device.refresh_from_db)()
                assert (device.overhead_s, device.message_s) == (0.0, 0.0)
        await database_sync_to_async(device.refresh_from_db)()
        await link.disconnect()
        return replies

    replies = async_to_sync(scenario)()
    assert replies[0]["type"] == "error" and replies[0]["field"] == "message_s"
    assert "between 0 and 10" in replies[0]["detail"]
    assert replies[1]["type"] == "welcome"
    assert (device.overhead_s, device.message_s) == (0.001, 0.0002)


def test_a_newer_agent_s_hello_is_refused_naming_the_protocol_and_an_older_one_welcomed(
        ) -> None:
    device = DeviceFactory(data_address="", status=Device.Status.OFFLINE)
    base = {"type": "hello", "data_key": DATA_KEY, "data_address": "tcp://10.0.0.2:5601"}

    async def scenario() -> list[dict[str, Any]]:
        link = agent(device)
        assert (await link.connect())[0]
        replies = []
        for message in ({**base, "protocol": PROTOCOL + 1}, base, {**base, "protocol": PROTOCOL}):
            await link.send_json_to(message)
            replies.append(await link.receive_json_from(timeout=5))
            if len(replies) == 1:  # refused whole: its data plane not stored
                await database_sync_to_async(device.refresh_from_db)()
                assert device.data_address == ""
        await link.disconnect()
        return replies

    newer, older, same = async_to_sync(scenario)()
    assert newer["type"] == "error" and newer["field"] == "protocol"
    assert newer["in_reply_to"] == "hello"
    assert f"speaks protocol {PROTOCOL + 1}" in newer["detail"]
    assert "upgrade the server" in newer["detail"]
    assert older["type"] == same["type"] == "welcome"  # no version: an older agent's, welcome


def test_a_run_is_deployed_started_fed_and_finished_by_its_agents() -> None:
    run, devices = planned_run(lr=0.05, momentum=0.9)

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]], str, str]:
        agents, deploys, starts = await deployed(devices, run)
        state = (await database_sync_to_async(Run.objects.get)(pk=run.pk)).state
        first = devices[0].uid
        await agents[0].send_json_to({"type": "events", "run": run.pk, "timeline": [
            {"run": run.pk, "device": first, "stage": 0, "kind": "forward", "microbatch": 0,
             "version": 0, "start": 0.1, "end": 0.2}],
            "metrics": [{"at": 0.2, "kind": "throughput_sps", "device": "", "value": 320.0}]})
        stored = await agents[0].receive_json_from(timeout=5)
        assert stored == {"type": "stored", "run": run.pk, "timeline": 1, "faults": 0,
                          "metrics": 1, "refused": []}
        # a point the database cannot hold (a diverged loss) is refused alone: it failed
        # the whole batch, and the device's timeline events with it
        await agents[0].send_json_to({"type": "events", "run": run.pk, "timeline": [
            {"run": run.pk, "device": first, "stage": 0, "kind": "backward", "microbatch": 0,
             "version": 0, "start": 0.2, "end": 0.3}],
            "metrics": [{"at": 0.3, "kind": "loss", "value": float("nan")},
                        {"at": 0.3, "kind": "loss", "value": 2.25}]})
        stored = await agents[0].receive_json_from(timeout=5)
        assert (stored["timeline"], stored["metrics"]) == (1, 1), stored
        assert [r["field"] for r in stored["refused"]] == ["metrics[0].value"]
        for a in agents:
            await a.send_json_to({"type": "stage_done", "run": run.pk})
        # the run finished: every agent is told to stop it (to forget its weights and its
        # peers' keys at once)
        for a in agents:
            told = await a.receive_json_from(timeout=5)
            assert (told.get("command"), told.get("run")) == ("stop", run.pk), told
        for a in agents:
            await a.disconnect()
        final = (await database_sync_to_async(Run.objects.get)(pk=run.pk)).state
        return deploys, starts, state, final

    deploys, starts, state, final = async_to_sync(scenario)()
    assert [d["command"] for d in deploys] == ["deploy"] * 3
    specs = [d["spec"] for d in deploys]
    assert [s["stage"] for s in specs] == [0, 1, 2]  # ftpipehd keeps the devices' order
    assert [s["device"] for s in specs] == [d.uid for d in devices]
    assert specs[0]["layers"][0] == 0 and specs[-1]["layers"][1] == 3  # the factory's 4 layers
    assert specs[0]["microbatches"] == 4 * 2 and specs[0]["flush_every"] == 4
    assert {(s["lr"], s["momentum"]) for s in specs} == {(0.05, 0.9)}  # the run's SGD
    assert deploys[0]["peers"] == {d.uid: f"tcp://127.0.0.1:{6000 + k}"
                                   for k, d in enumerate(devices)}
    assert {s["command"] for s in starts} == {"start"}
    assert len({s["started_at"] for s in starts}) == 1  # one common start time
    assert state == Run.State.RUNNING and final == Run.State.FINISHED
    assert TimelineEvent.objects.filter(run=run).count() == 2
    assert MetricPoint.objects.filter(run=run, kind="throughput_sps").count() == 1
    assert list(MetricPoint.objects.filter(run=run, kind="loss").values_list(
        "value", flat=True)) == [2.25]
    kinds = list(FaultEvent.objects.filter(run=run).values_list("kind", flat=True))
    assert kinds == ["run_started", "run_finished"]


def test_a_stage_the_agent_refuses_fails_the_run_and_stops_the_others() -> None:
    run, devices = planned_run()

    async def scenario() -> tuple[list[dict[str, Any]], Run]:
        agents = await connect_all(devices)
        await database_sync_to_async(services.run_start)(run=run)
        deploys = [await a.receive_json_from(timeout=5) for a in agents]
        await agents[1].send_json_to({"type": "ack", "id": deploys[1]["id"],
                                      "command": "deploy", "run": run.pk, "ok": False,
                                      "error": "no such model 'resnet999'"})
        stops = [await a.receive_json_from(timeout=5) for a in agents]
        for a in agents:
            await a.disconnect()
        return stops, await database_sync_to_async(Run.objects.get)(pk=run.pk)

    stops, failed = async_to_sync(scenario)()
    assert {s["command"] for s in stops} == {"stop"}
    assert failed.state == Run.State.FAILED
    assert devices[1].uid in failed.error and "no such model 'resnet999'" in failed.error
    assert RunDevice.objects.get(run=run, device=devices[1]).stage_state == "failed"


def test_a_stage_measures_its_devices_overhead_and_the_run_keeps_the_one_it_was_planned_with(
        ) -> None:
    run, devices = planned_run()  # planned with the devices' overhead_s (their probes'): 0

    async def scenario() -> tuple[list[dict[str, Any]], str, Run]:
        agents, _ = await running(devices, run)
        refused = []
        for bad in ({"overhead_s": -1},  # more inside the passes than in all:
                    {"overhead_s": 0.001, "pass_overhead_s": 0.002}):
            await agents[0].send_json_to({"type": "stage_done", "run": run.pk, **bad})
            refused.append(await agents[0].receive_json_from(timeout=5))
        state = (await database_sync_to_async(RunDevice.objects.get)(
            run=run, device=devices[0])).stage_state
        for k, a in enumerate(agents):
            await a.send_json_to({"type": "stage_done", "run": run.pk, **(
                {"overhead_s": 0.004, "message_s": 0.0005, "pass_overhead_s": 0.001}
                if k == 0 else {})})
        for a in agents:
            await a.disconnect()
        return refused, state, await database_sync_to_async(Run.objects.get)(pk=run.pk)

    refused, state, finished = async_to_sync(scenario)()
    assert [(r["type"], r["field"]) for r in refused] == [("error", "overhead_s"),
                                                          ("error", "pass_overhead_s")]
    assert state == "running"  # the refused messages changed nothing
    assert finished.state == Run.State.FINISHED
    # kept with the device's profile of the model (the device's probe figure stays)
    profiles = [LayerProfile.objects.get(device=d, model_spec=run.model_spec) for d in devices]
    assert [(p.overhead_s, p.message_s, p.pass_overhead_s) for p in profiles] == [
        (0.004, 0.0005, 0.001), (None, None, None), (None, None, None)]
    assert [Device.objects.get(pk=d.pk).overhead_s for d in devices] == [0.0, 0.0, 0.0]
    # the run's prediction stays the one it was planned with; a run planned now uses them
    _, planned = run_planning_inputs(run=finished)
    assert [(d.overhead_s, d.message_s) for d in planned.devices] == [(0.0, 0.0)] * 3
    again = RunFactory(model_spec=run.model_spec, devices=devices, algorithms=["ftpipehd"],
                       microbatches=4, batches=2)
    services.run_plan(run=again)
    _, planned = run_planning_inputs(run=again)
    assert [(d.overhead_s, d.message_s) for d in planned.devices] == [
        (0.004, 0.0005), (0.0, 0.0), (0.0, 0.0)]
    assert [rd.pass_overhead_s for rd in RunDevice.objects.filter(run=again)
            .order_by("position")] == [0.001, None, None]


def test_a_replaced_connection_closing_changes_nothing() -> None:
    device = DeviceFactory(data_address="")

    async def scenario() -> None:
        old, new = agent(device), agent(device)
        assert (await old.connect())[0]
        assert (await new.connect())[0]  # the agent reconnected before the old one timed out
        await new.send_json_to({"type": "hello", "data_key": DATA_KEY, "data_address": "tcp://127.0.0.1:7000"})
        await new.receive_json_from(timeout=5)
        await old.disconnect()
        await new.send_json_to({"type": "ping", "id": 3})
        assert (await new.receive_json_from(timeout=5))["type"] == "pong"
        device_now = await database_sync_to_async(Device.objects.get)(pk=device.pk)
        assert device_now.status == Device.Status.ONLINE
        assert device_now.data_address == "tcp://127.0.0.1:7000"
        await new.disconnect()

    async_to_sync(scenario)()


def test_starting_without_connected_agents_fails_clearly() -> None:
    run, devices = planned_run()
    services.run_start(run=run)
    run.refresh_from_db()
    assert run.state == Run.State.FAILED
    assert f"({devices[0].uid}) has no agent connected: start its agent" in run.error


def test_a_profile_measured_on_command_becomes_the_devices_profile() -> None:
    # Regression: the handler took get_or_create's (spec, created) pair for the spec, and the
    # exception closed the connection, losing the profile.
    device = DeviceFactory(data_address="")
    layers = [{"name": f"l{i}", "kind": "dense", "forward_s": 0.001, "backward_s": 0.002,
               "output_bytes": 100, "param_bytes": 10, "activation_bytes": 100}
              for i in range(4)]  # the mlp's four layers
    profile = {"model": "mlp", "batch_size": 16, "reference": device.uid, "layers": layers}

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        link = agent(device)
        assert (await link.connect())[0]
        await link.send_json_to({"type": "profile_result", "profile": profile,
                                 "model_spec": {"model": "mlp", "dataset": "digits",
                                                "batch_size": 16}})
        stored = await link.receive_json_from(timeout=5)
        await link.send_json_to({"type": "profile_result", "profile": {"model": "mlp"},
                                 "model_spec": {"model": "mlp", "dataset": "digits",
                                                "batch_size": 16}})
        refused = await link.receive_json_from(timeout=5)
        await link.disconnect()
        return stored, refused

    stored, refused = async_to_sync(scenario)()
    assert stored["type"] == "profile_stored"
    saved = device.profiles.get()
    assert saved.model_spec.pk == stored["model_spec"] and saved.num_layers == 4
    assert refused["type"] == "error" and refused["field"].startswith("profile")


def test_measured_links_are_stored_and_planning_uses_the_slower_direction() -> None:
    run, devices = planned_run(2)
    a, b = devices

    async def scenario() -> list[dict[str, Any]]:
        links = [agent(a), agent(b)]
        replies = []
        for link in links:
            assert (await link.connect())[0]
        await links[0].send_json_to({"type": "links", "links": [
            {"peer": b.uid, "bandwidth_bps": 5e6, "latency_s": 0.002}]})
        replies.append(await links[0].receive_json_from(timeout=5))
        await links[1].send_json_to({"type": "links", "links": [
            {"peer": a.uid, "bandwidth_bps": 2e6, "latency_s": 0.002}]})
        replies.append(await links[1].receive_json_from(timeout=5))
        await links[1].send_json_to({"type": "links", "links": [
            {"peer": "ghost", "bandwidth_bps": 1.0, "latency_s": 0.0}]})
        replies.append(await links[1].receive_json_from(timeout=5))
        await links[1].send_json_to({"type": "links", "links": [
            {"peer": a.uid, "bandwidth_bps": -1, "latency_s": 0.0}]})
        replies.append(await links[1].receive_json_from(timeout=5))
        for link in links:
            await link.disconnect()
        return replies

    replies = async_to_sync(scenario)()
    assert replies[0] == {"type": "links_stored", "count": 1} == replies[1]
    assert replies[2]["field"] == "links" and "'ghost' is not another enrolled device" in \
        replies[2]["detail"]
    assert replies[3]["field"] == "links[0].bandwidth_bps"
    from webapp.runs.selectors import run_planning_inputs

    _, device_set = run_planning_inputs(run=run)
    assert device_set.bandwidth_bps(a.uid, b.uid) == 2e6  # the slower direction


def test_devices_are_asked_to_measure_their_links_through_the_api(api) -> None:
    connected = [DeviceFactory(control_channel=f"chan-{k}") for k in range(2)]
    offline = DeviceFactory(data_address="", control_channel="")
    asked = api.post("/api/links/", {"devices": [d.pk for d in [*connected, offline]]},
                     format="json")
    assert asked.status_code == 202 and asked.json()["devices"] == [d.uid for d in connected]
    refused = api.post("/api/links/", {"devices": [offline.pk]}, format="json")
    assert refused.status_code == 409 and "needs two" in refused.json()["detail"]


def test_a_deployment_nobody_answers_fails_the_run_in_time() -> None:
    from datetime import timedelta

    from django.utils import timezone

    run, devices = planned_run()

    async def scenario() -> None:
        agents = await connect_all(devices)
        await database_sync_to_async(services.run_start)(run=run)
        deploys = [await a.receive_json_from(timeout=5) for a in agents]
        # two agents answer, the third never does
        for a, command in zip(agents[:2], deploys[:2], strict=True):
            await a.send_json_to({"type": "ack", "id": command["id"], "command": "deploy",
                                  "run": run.pk, "ok": True})
        await agents[0].send_json_to({"type": "ping", "id": 9})
        await agents[0].receive_json_from(timeout=5)
        await database_sync_to_async(Run.objects.filter(pk=run.pk).update)(
            started_at=timezone.now() - timedelta(seconds=120))
        failed = await database_sync_to_async(services.runs_fail_stalled)(older_than_s=90)
        assert failed == [run.pk]
        for a in agents:
            assert (await a.receive_json_from(timeout=5))["command"] == "stop"
            await a.disconnect()

    async_to_sync(scenario)()
    run.refresh_from_db()
    assert run.state == Run.State.FAILED
    assert f"({devices[2].uid}) did not answer the deployment within 90 s" in run.error
    assert devices[0].uid not in run.error


def test_a_malformed_message_is_refused_naming_its_field_and_the_connection_stays() -> None:
    device = DeviceFactory(data_address="", status=Device.Status.OFFLINE)
    cpu = {"kind": "cpu", "speed": 1, "backward_speed": 1}

    async def scenario() -> list[dict[str, Any]]:
        link = agent(device)
        assert (await link.connect())[0]
        replies = []
        for message in ({"type": "hello", "data_key": DATA_KEY, "data_address": "tcp://10.0.0.2:5601",
                         "resources": [cpu, cpu]},
                        {"type": "events", "run": 1, "timeline": "x"},
                        {"type": "ping", "id": "x"},
                        {"type": "hello", "data_key": DATA_KEY, "data_address": "tcp://10.0.0.2:5601",
                         "resources": [cpu, {**cpu, "kind": "gpu", "backward_speed": 3}]}):
            await link.send_json_to(message)
            replies.append(await link.receive_json_from(timeout=5))
        await database_sync_to_async(device.refresh_from_db)()
        await link.disconnect()
        return replies

    replies = async_to_sync(scenario)()
    assert [(r["type"], r.get("field"), r.get("in_reply_to")) for r in replies] == [
        ("error", "resources[1].kind", "hello"), ("error", "timeline", "events"),
        ("error", "id", "ping"), ("welcome", None, None)]
    assert "is repeated" in replies[0]["detail"]
    assert device.resources == [{"kind": "cpu", "speed": 1, "backward_speed": 1},
                                {"kind": "gpu", "speed": 1, "backward_speed": 3}]
