"""The run page's WebSocket, through the real ASGI application (session cookie, routing)."""

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from tests.webapp.factories import RunFactory, UserFactory
from webapp.asgi import application
from webapp.runs import services
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def session_headers() -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(UserFactory())
    cookie = client.cookies["sessionid"].value
    return [(b"cookie", f"sessionid={cookie}".encode()), (b"origin", b"http://testserver")]


async def receive_until(page: WebsocketCommunicator, kind: str) -> dict:
    """The next message of type ``kind``, skipping others (pausing also sends the run_paused
    control event, which may arrive before or after an answer)."""
    while True:
        message = await page.receive_json_from(timeout=5)
        if message["type"] == kind:
            return message


def test_a_logged_in_page_gets_a_snapshot_then_the_runs_events():
    run = RunFactory(state=Run.State.RUNNING)
    headers = session_headers()

    async def scenario() -> tuple[dict, dict, dict, dict]:
        page = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/", headers=headers)
        connected, _ = await page.connect()
        assert connected
        snapshot = await page.receive_json_from(timeout=5)
        await database_sync_to_async(services.run_pause)(run=run)
        event = await receive_until(page, "run")
        await page.send_json_to({"type": "snapshot"})
        again = await receive_until(page, "snapshot")
        await page.send_json_to({"type": "gantt please"})
        error = await receive_until(page, "error")
        await page.disconnect()
        return snapshot, event, again, error

    snapshot, event, again, error = async_to_sync(scenario)()
    assert snapshot["type"] == "snapshot" and snapshot["run"]["id"] == run.pk
    assert snapshot["run"]["state"] == "running" and snapshot["plans"] == []
    assert event["type"] == "run" and event["run"]["state"] == "paused"
    assert again["type"] == "snapshot" and again["run"]["state"] == "paused"
    assert error["type"] == "error"


@pytest.mark.parametrize(("logged_in", "exists", "code"), [
    (False, True, 4401),
    (True, False, 4404),
])
def test_a_page_without_a_session_or_run_is_closed(logged_in, exists, code):
    run_id = RunFactory().pk if exists else 999
    headers = session_headers() if logged_in else [(b"origin", b"http://testserver")]

    async def scenario() -> tuple[bool, int]:
        page = WebsocketCommunicator(application, f"/ws/runs/{run_id}/", headers=headers)
        connected, close_code = await page.connect()
        return connected, close_code

    assert async_to_sync(scenario)() == (False, code)


def test_an_event_while_the_snapshot_is_read_reaches_the_page_after_it(monkeypatch):
    # the consumer read the snapshot, then joined the run's group: an event in between
    # reached neither; now it joins first, and the event follows the snapshot
    from channels.layers import get_channel_layer

    from webapp.dashboard import consumers
    from webapp.runs.events import run_group

    run = RunFactory(state=Run.State.RUNNING)
    headers = session_headers()
    read = consumers._snapshot
    between = {"type": "metrics", "points": [{"at": 1.0, "kind": "loss", "device": "",
                                              "value": 0.5}]}

    async def snapshot_with_an_event_meanwhile(run_id: int):
        snapshot = await read(run_id)
        await get_channel_layer().group_send(run_group(run_id),
                                             {"type": "run.event", "event": between})
        return snapshot

    monkeypatch.setattr(consumers, "_snapshot", snapshot_with_an_event_meanwhile)

    async def scenario() -> tuple[dict, dict]:
        page = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/", headers=headers)
        connected, _ = await page.connect()
        assert connected
        first = await page.receive_json_from(timeout=5)
        second = await page.receive_json_from(timeout=5)
        await page.disconnect()
        return first, second

    first, second = async_to_sync(scenario)()
    assert first["type"] == "snapshot" and second == between


def test_a_runs_event_goes_to_the_page_without_a_hop_to_the_database_thread(monkeypatch):
    # Channels hops to its database thread before every message a consumer handles; on SQLite
    # that thread also stores the agents' events, and each delta waited behind them
    # (bench/live.py). A run's event needs no database: it is forwarded at once.
    import channels.consumer
    from channels.layers import get_channel_layer

    from webapp.runs.events import run_group

    run = RunFactory(state=Run.State.RUNNING)
    headers = session_headers()
    hops: list[str] = []
    close_old = channels.consumer.aclose_old_connections

    async def counted() -> None:
        hops.append("hop")
        await close_old()

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted)
    event = {"type": "metrics", "points": [{"at": 2.0, "kind": "loss", "device": "",
                                            "value": 0.25}], "seq": 1}

    async def scenario() -> tuple[dict, int, int]:
        page = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/", headers=headers)
        connected, _ = await page.connect()
        assert connected
        await page.receive_json_from(timeout=5)  # the snapshot
        before = len(hops)
        await get_channel_layer().group_send(run_group(run.pk),
                                             {"type": "run.event", "event": event})
        forwarded = await page.receive_json_from(timeout=5)
        after = len(hops)
        await page.disconnect()
        return forwarded, before, after

    forwarded, before, after = async_to_sync(scenario)()
    assert forwarded == event
    assert before >= 1 and after == before  # the connection hopped; the event did not


def test_a_delta_repeating_rows_of_the_snapshot_adds_none():
    from webapp.runs.events import snapshot_apply

    row = {"run": 1, "device": "a", "stage": 0, "kind": "forward", "microbatch": 3,
           "version": 0, "start": 1.0, "end": 1.5, "bytes": 0}
    snapshot = {"timeline": [row], "timeline_limit": 100, "metrics": [], "faults": []}
    after = snapshot_apply(snapshot, {"type": "timeline",
                                      "events": [dict(row), {**row, "microbatch": 4}]})
    assert [e["microbatch"] for e in after["timeline"]] == [3, 4]


def test_the_deltas_are_numbered_and_a_dropped_one_shows_as_a_gap_a_snapshot_fills():
    # a channel layer drops a consumer's messages without a word when its buffer is full
    # (channels_redis: 100); here one is dropped by numbering it and not sending it
    from orchestrator.events import FaultEvent as FaultRecord
    from webapp.runs import events
    from webapp.runs.services import fault_events_store

    run = RunFactory(state=Run.State.RUNNING)
    headers = session_headers()

    def dropped() -> None:
        fault_events_store(run=run, records=[FaultRecord(
            run=run.pk, at=3.0, kind="device_joined", device="lost-in-transit", detail={})])
        events.run_seq_next(run.pk)

    async def scenario() -> list[dict]:
        page = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/", headers=headers)
        connected, _ = await page.connect()
        assert connected
        got = [await page.receive_json_from(timeout=5)]
        await database_sync_to_async(services.run_pause)(run=run)  # run, idle, faults
        got += [await page.receive_json_from(timeout=5) for _ in range(3)]
        await database_sync_to_async(dropped)()
        await database_sync_to_async(lambda: services.run_start(run=Run.objects.get(pk=run.pk)))()
        while not await page.receive_nothing(timeout=0.5):  # resumed: faults, run
            got.append(await page.receive_json_from(timeout=5))
        await page.send_json_to({"type": "snapshot"})
        got.append(await receive_until(page, "snapshot"))
        await page.disconnect()
        return got

    snapshot, *deltas, fresh = async_to_sync(scenario)()
    # Assert: one number after the other from the snapshot's, then one skipped
    first = snapshot["seq"]
    assert [d["seq"] for d in deltas] == [first + k for k in (1, 2, 3, 5, 6)]
    page = snapshot
    gaps = []
    for delta in deltas:
        gaps.append(events.snapshot_gap(page, delta))
        page = events.snapshot_apply(page, delta)
    assert gaps == [False, False, False, True, False]
    assert "lost-in-transit" not in {f["device"] for f in page["faults"]}
    # the snapshot asked for holds what was dropped, and numbers on from the newest delta
    assert fresh["seq"] == first + 6 == page["seq"]
    assert "lost-in-transit" in {f["device"] for f in fresh["faults"]}
