"""What keeps hundreds of agents cheap on the gateway (bench/load.py measures it): events
batches that queued up behind each other are stored together (services.agent_events) yet each
answered on its own and in order, and a heartbeat that changes nothing is written at most every
HEARTBEAT_WRITE_S (services.heartbeat_write_due)."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from orchestrator.eventcolumns import to_columns
from orchestrator.events import parse_event
from tests.webapp.factories import DATA_KEY, DeviceFactory, ModelSpecFactory, RunFactory
from webapp.asgi import application
from webapp.common.exceptions import InvalidInput
from webapp.devices.models import Device
from webapp.gateway import services
from webapp.runs import recovery
from webapp.runs.models import MetricPoint, Run, RunDevice, TimelineEvent

pytestmark = pytest.mark.django_db(transaction=True)


def running(count: int = 2) -> tuple[Run, list[Device]]:
    """A running run of ``count`` devices, one stage each."""
    devices = [DeviceFactory() for _ in range(count)]
    run = RunFactory(model_spec=ModelSpecFactory(), devices=devices, algorithms=["ftpipehd"])
    Run.objects.filter(pk=run.pk).update(state=Run.State.RUNNING)
    for stage, device in enumerate(devices):
        RunDevice.objects.filter(run=run, device=device).update(stage=stage,
                                                                stage_state="running")
    return Run.objects.get(pk=run.pk), devices


def batch(run: Run, device: Device, seq: int, n: int = 3, **extra: Any) -> dict[str, Any]:
    """The ``seq``-th events batch of ``device``'s stream: ``n`` forward events numbered on."""
    first = (seq - 1) * n
    timeline = [{"run": run.pk, "device": device.uid, "stage": 0, "kind": "forward",
                 "microbatch": first + j, "version": 0, "start": 1.0, "end": 1.1, "bytes": 0}
                for j in range(n)]
    return {"type": "events", "run": run.pk, "stream": "s1", "seq": seq, "timeline": timeline,
            **extra}


def test_batches_stored_together_are_each_answered_and_stored_once() -> None:
    # Prepare
    run, (device, _) = running()

    # Execute: four batches together, then two of them again (after a reconnect) and two new
    first = services.agent_events(device_id=device.pk,
                                  messages=[batch(run, device, s) for s in (1, 2, 3, 4)])
    again = services.agent_events(device_id=device.pk,
                                  messages=[batch(run, device, s) for s in (3, 4, 5, 6)])

    # Assert: each batch gets its own stored, the ones sent again store nothing
    assert [(a.seq, a.timeline) for a in first] == [(1, 3), (2, 3), (3, 3), (4, 3)]
    assert [(a.seq, a.timeline) for a in again] == [(3, 0), (4, 0), (5, 3), (6, 3)]
    stored = TimelineEvent.objects.filter(run=run).values_list("microbatch", flat=True)
    assert sorted(stored) == list(range(18))
    assert RunDevice.objects.get(run=run, device=device).events_seq == 6


def test_batches_stored_together_read_the_devices_membership_once() -> None:
    # the gateway locked the membership, then run_events_store locked it again: two more
    # round trips to the database per merged batch on PostgreSQL
    run, (device, _) = running()
    with CaptureQueriesContext(connection) as queries:
        answers = services.agent_events(device_id=device.pk,
                                         messages=[batch(run, device, s) for s in (1, 2, 3)])
    assert [a.timeline for a in answers] == [3, 3, 3]
    reads = [q["sql"] for q in queries.captured_queries
             if q["sql"].startswith("SELECT") and 'FROM "runs_rundevice"' in q["sql"]]
    assert len(reads) == 1, reads
    assert RunDevice.objects.get(run=run, device=device).events_seq == 3


def test_a_bad_batch_among_them_is_refused_alone() -> None:
    # Prepare: the second batch names another device; the fourth an unknown run
    run, (device, other) = running()
    bad = batch(run, device, 2)
    bad["timeline"][1]["device"] = other.uid
    messages = [batch(run, device, 1), bad, batch(run, device, 3),
                {"type": "events", "run": 999_999, "timeline": []}]

    # Execute
    answers = services.agent_events(device_id=device.pk, messages=messages)

    # Assert: the others are stored, the bad ones refused naming their field
    assert (answers[0].seq, answers[0].timeline) == (1, 3)
    assert isinstance(answers[1], InvalidInput)
    assert answers[1].errors[0].field == "timeline[1].device"
    assert (answers[2].seq, answers[2].timeline) == (3, 3)
    assert isinstance(answers[3], InvalidInput)
    assert TimelineEvent.objects.filter(run=run).count() == 6


def in_columns(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with its timeline in columns, as agents send it (orchestrator.eventcolumns)."""
    rows = message.pop("timeline")
    columns = to_columns([parse_event(e) for e in rows])
    return {**message, "timeline_columns": columns}


def test_batches_in_columns_are_stored_together_as_the_device_s_events() -> None:
    # Prepare: batches in columns, one as objects among them, one with an update
    run, (device, _) = running()
    messages = [in_columns(batch(run, device, 1)), batch(run, device, 2),
                in_columns(batch(run, device, 3))]
    messages[2]["timeline_columns"]["kind"][2] = "update"
    checked: list[int] = []
    original = recovery.run_repartition_check

    def check(*, run_id: int, progress: int, seen: Any = None) -> None:
        checked.append(progress)
        original(run_id=run_id, progress=progress, seen=seen)

    # Execute
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(recovery, "run_repartition_check", check)
        answers = services.agent_events(device_id=device.pk, messages=messages)

    # Assert: every event stored as the device's, each batch answered with its count, and the
    # update in columns moved the dynamic re-partition's clock
    assert [(a.seq, a.timeline) for a in answers] == [(1, 3), (2, 3), (3, 3)]
    stored = TimelineEvent.objects.filter(run=run).order_by("microbatch")
    assert [(e.device, e.microbatch, e.kind) for e in stored] == [
        (device.uid, m, "update" if m == 8 else "forward") for m in range(9)]
    assert checked == [8]


def test_a_bad_column_is_refused_naming_its_item_and_the_others_are_stored() -> None:
    run, (device, _) = running()
    bad = in_columns(batch(run, device, 2))
    bad["timeline_columns"]["end"][1] = 0.5  # before its start
    answers = services.agent_events(device_id=device.pk, messages=[
        in_columns(batch(run, device, 1)), bad, in_columns(batch(run, device, 3))])
    assert isinstance(answers[1], InvalidInput)
    assert answers[1].errors[0].field == "timeline_columns.end[1]"
    assert [(a.seq, a.timeline) for a in (answers[0], answers[2])] == [(1, 3), (3, 3)]
    assert TimelineEvent.objects.filter(run=run).count() == 6


def test_metric_points_in_columns_are_stored_and_a_bad_one_refused_alone() -> None:
    run, (device, _) = running()
    points = {"at": [1.0, 1.1], "kind": ["loss", "accuracy"], "device": [device.uid] * 2,
              "value": [2.5, 0.25]}
    bad = {**points, "value": [float("nan"), 0.5]}
    answers = services.agent_events(device_id=device.pk, messages=[
        in_columns(batch(run, device, 1, metrics_columns=points)),
        in_columns(batch(run, device, 2, metrics_columns=points)),
        in_columns(batch(run, device, 3, metrics_columns=bad))])
    assert [(a.seq, a.timeline, a.metrics) for a in answers] == [(1, 3, 2), (2, 3, 2),
                                                                 (3, 3, 1)]
    assert [r["field"] for r in answers[2].refused] == ["metrics_columns.value[0]"]
    stored = MetricPoint.objects.filter(run=run).order_by("pk")
    assert [(p.kind, p.value, p.device) for p in stored] == [
        ("loss", 2.5, device.uid), ("accuracy", 0.25, device.uid)] * 2 + [
        ("accuracy", 0.5, device.uid)]


def test_a_refused_metric_point_is_answered_on_its_own_batch() -> None:
    # Prepare: the second batch carries a NaN loss
    run, (device, _) = running()
    good = batch(run, device, 1, metrics=[{"at": 1.0, "kind": "loss", "value": 0.5}])
    nan = batch(run, device, 2, metrics=[{"at": 1.0, "kind": "loss", "value": float("nan")}])

    # Execute
    answers = services.agent_events(device_id=device.pk,
                                     messages=[good, nan, batch(run, device, 3)])

    # Assert: the NaN point is refused in its own batch's answer, the events all stored
    assert [a.metrics for a in answers] == [1, 0, 0]
    assert answers[1].refused and answers[1].refused[0]["field"].startswith("metrics[0]")
    assert TimelineEvent.objects.filter(run=run).count() == 9


def test_the_consumer_answers_queued_batches_and_pings_in_the_order_sent() -> None:
    # Prepare
    run, (device, _) = running()

    async def scenario() -> list[dict[str, Any]]:
        link = WebsocketCommunicator(application, "/ws/agent/", headers=[
            (b"authorization", f"Device {device.uid}:{device.key}".encode())])
        assert (await link.connect())[0]
        await link.send_json_to({"type": "hello", "data_key": DATA_KEY,
                                 "data_address": "tcp://127.0.0.1:6000"})
        assert (await link.receive_json_from(timeout=5))["type"] == "welcome"
        for seq in range(1, 8):
            await link.send_json_to(batch(run, device, seq))
        await link.send_json_to({"type": "ping", "id": 9})
        await link.send_json_to(batch(run, device, 8))
        await link.send_json_to({"type": "heartbeat", "status": "busy"})
        await link.send_json_to({"type": "ping", "id": 10})
        replies = [await link.receive_json_from(timeout=10) for _ in range(10)]
        await link.disconnect()
        return replies

    # Execute
    replies = async_to_sync(scenario)()

    # Assert: batches queued behind each other are still answered one by one, in order
    answered = [(r["type"], r.get("seq", r.get("id"))) for r in replies]
    assert answered == ([("stored", s) for s in range(1, 8)]
                        + [("pong", 9), ("stored", 8), ("pong", 10)])
    assert TimelineEvent.objects.filter(run=run).count() == 24


@pytest.mark.parametrize(("status", "written", "now", "due"), [
    ("online", None, 0.0, True),  # none written on this connection yet
    ("online", ("online", 10.0), 12.0, False),  # the same, 2 s later
    ("online", ("online", 10.0), 15.0, True),  # the same, HEARTBEAT_WRITE_S later
    ("busy", ("online", 10.0), 10.5, True),  # a change of status, at once
])
def test_a_heartbeat_is_written_when_due(status: str, written: tuple[str, float] | None,
                                         now: float, due: bool) -> None:
    assert services.heartbeat_write_due(status=status, written=written, now=now) is due


@override_settings(DEVICE_OFFLINE_AFTER_S=8)
def test_heartbeats_are_written_well_within_the_offline_deadline() -> None:
    # a quarter of DEVICE_OFFLINE_AFTER_S when that is shorter than HEARTBEAT_WRITE_S
    assert services.heartbeat_write_due(status="online", written=("online", 0.0), now=2.0)
    assert not services.heartbeat_write_due(status="online", written=("online", 0.0), now=1.9)


def test_a_repeated_heartbeat_is_not_written_but_a_change_is() -> None:
    # Prepare: a connection whose first heartbeat was written; its heartbeat time is cleared
    device = DeviceFactory()
    forget_heartbeat = database_sync_to_async(
        lambda: Device.objects.filter(pk=device.pk).update(last_heartbeat_at=None))
    last_heartbeat = database_sync_to_async(
        lambda: Device.objects.get(pk=device.pk).last_heartbeat_at)

    async def scenario() -> None:
        link = WebsocketCommunicator(application, "/ws/agent/", headers=[
            (b"authorization", f"Device {device.uid}:{device.key}".encode())])
        assert (await link.connect())[0]
        await link.send_json_to({"type": "heartbeat", "status": "online"})  # the first: written
        await link.send_json_to({"type": "ping", "id": 1})
        await link.receive_json_from(timeout=5)
        await forget_heartbeat()
        # Execute: the same status again, then a change, each followed by a ping
        await link.send_json_to({"type": "heartbeat", "status": "online"})
        await link.send_json_to({"type": "ping", "id": 2})
        await link.receive_json_from(timeout=5)
        seen.append(await last_heartbeat())
        await link.send_json_to({"type": "heartbeat", "status": "busy"})
        await link.send_json_to({"type": "ping", "id": 3})
        await link.receive_json_from(timeout=5)
        seen.append(await last_heartbeat())
        await link.disconnect()

    seen: list[Any] = []
    async_to_sync(scenario)()

    # Assert: the repeat did not touch the row; the change wrote it
    assert seen[0] is None
    assert seen[1] is not None


def test_a_fresh_heartbeat_time_means_the_hello_with_its_address_was_stored() -> None:
    # a restarted agent's connection marked a fresh heartbeat before its hello: the demo, which
    # waits for one, measured the links at the agents' old data-plane addresses, and every
    # probe timed out (CI, test_fault_tolerance[last] and test_groups[pipedream])
    device = DeviceFactory()
    Device.objects.filter(pk=device.pk).update(last_heartbeat_at=None,
                                               data_address="tcp://127.0.0.1:1")
    row = database_sync_to_async(lambda: Device.objects.get(pk=device.pk))

    async def scenario() -> list[Device]:
        link = WebsocketCommunicator(application, "/ws/agent/", headers=[
            (b"authorization", f"Device {device.uid}:{device.key}".encode())])
        assert (await link.connect())[0]
        seen = [await row()]
        await link.send_json_to({"type": "hello", "data_key": DATA_KEY,
                                 "data_address": "tcp://127.0.0.1:6001"})
        assert (await link.receive_json_from(timeout=5))["type"] == "welcome"
        seen.append(await row())
        await link.disconnect()
        return seen

    connected, greeted = async_to_sync(scenario)()
    assert connected.status == Device.Status.ONLINE and connected.last_heartbeat_at is None
    assert greeted.last_heartbeat_at is not None
    assert greeted.data_address == "tcp://127.0.0.1:6001"
