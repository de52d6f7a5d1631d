"""The run group's events: sent after commit, and enough to keep a page's snapshot current."""

import asyncio
import json

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from tests.webapp.factories import DeviceFactory, LayerProfileFactory, ModelSpecFactory, RunFactory
from webapp.runs import events, selectors, services
from webapp.runs.models import Run, TimelineEvent


def drain(channel: str) -> list[dict]:
    """Every message waiting on ``channel``."""
    layer = get_channel_layer()
    received = []

    async def pull() -> None:
        while True:
            try:
                received.append(await asyncio.wait_for(layer.receive(channel), timeout=0.2))
            except TimeoutError:
                return

    async_to_sync(pull)()
    return received


def subscribe(run_id: int) -> str:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(events.run_group(run_id), channel)
    return channel


def test_group_name():
    assert events.run_group(42) == "run-42"


@pytest.mark.django_db(transaction=True)
def test_applying_the_events_to_an_old_snapshot_gives_the_fresh_snapshot():
    # Prepare: a profiled run, a page that took its snapshot while the run was a draft
    spec = ModelSpecFactory()
    devices = [DeviceFactory(), DeviceFactory(), DeviceFactory()]
    for k, device in enumerate(devices):
        LayerProfileFactory(device=device, model_spec=spec, scale=1.0 + k)
    run = RunFactory(model_spec=spec, devices=devices, algorithms=["uniform", "ftpipehd"])
    old = events.run_snapshot(Run.objects.get(pk=run.pk))
    channel = subscribe(run.pk)
    # Execute: plan (tasks run eagerly on commit), plan again with another set, then start
    services.run_plan(run=run)
    services.run_plan(run=run, algorithms=["bsp", "optimal", "uniform"])
    services.run_start(run=run)
    received = [m["event"] for m in drain(channel)]
    # Assert
    assert {e["type"] for e in received} == {"run", "plan"}
    assert [e["run"]["state"] for e in received if e["type"] == "run"] == [
        "planning", "planned", "planning", "planned", "starting"]
    applied = old
    for event in received:
        applied = events.snapshot_apply(applied, event)
    fresh = events.run_snapshot(Run.objects.get(pk=run.pk))
    assert applied == fresh
    assert {p["algorithm"] for p in applied["plans"]} == {"bsp", "optimal", "uniform"}


@pytest.mark.django_db(transaction=True)
def test_nothing_is_sent_for_a_transaction_that_rolls_back():
    from django.db import transaction

    run = RunFactory(state=Run.State.RUNNING)
    channel = subscribe(run.pk)
    with pytest.raises(RuntimeError), transaction.atomic():
        services.run_pause(run=run)
        raise RuntimeError("rolled back")
    assert drain(channel) == []
    services.run_pause(run=run)
    sent = [m["event"] for m in drain(channel)]
    assert [e["run"]["state"] for e in sent if e["type"] == "run"] == ["paused"]
    assert [f["kind"] for e in sent if e["type"] == "faults" for f in e["events"]] == [
        "run_paused"]


def test_snapshot_apply_rejects_an_unknown_event():
    with pytest.raises(ValueError, match="unknown event type 'gantt'"):
        events.snapshot_apply({"run": {}, "plans": []}, {"type": "gantt"})


def agent_batch(run_id: int, device: str, t0: float, count: int) -> dict:
    timeline = []
    for m in range(count):
        start = t0 + 1.5 * m
        timeline.append({"run": run_id, "device": device, "stage": 0, "kind": "forward",
                         "microbatch": m, "version": 0, "start": start, "end": start + 0.5})
        timeline.append({"run": run_id, "device": device, "stage": 0, "kind": "backward",
                         "microbatch": m, "version": 0, "start": start + 0.7, "end": start + 1.2})
    return {"timeline": timeline,
            "metrics": [{"at": t0 + 1.5 * count, "kind": "loss", "device": device,
                         "value": 2.0 - t0 / 100}],
            "faults": [{"run": run_id, "at": t0, "kind": "device_joined", "device": device,
                        "detail": {"t0": t0}}] if t0 == 0 else []}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("limit", "metrics_limit", "delta_rows"), [(None, None, None),
                                                                     (25, 3, 7)])
def test_a_live_page_brought_forward_by_deltas_equals_a_fresh_snapshot(
        limit: int | None, metrics_limit: int | None, delta_rows: int | None,
        monkeypatch: pytest.MonkeyPatch):
    # Prepare: a running run and a page that connected before any event (with limits, the
    # page keeps only the newest events and metric points: a busy run's minute exceeded a
    # WebSocket message; and an agent's batch reaches it in several deltas)
    if limit is not None:
        monkeypatch.setattr(selectors, "LIVE_MAX_EVENTS", limit)
    if metrics_limit is not None:
        monkeypatch.setattr(selectors, "LIVE_MAX_METRICS", metrics_limit)
    if delta_rows is not None:
        monkeypatch.setattr(events, "DELTA_MAX_ROWS", delta_rows)
    devices = [DeviceFactory(), DeviceFactory()]
    run = RunFactory(devices=devices, state=Run.State.RUNNING)
    old = events.run_snapshot(Run.objects.get(pk=run.pk))
    assert old["timeline"] == [] and old["idle"]["devices"] == {}
    channel = subscribe(run.pk)
    # Execute: batches from both devices over 150 s of run time (more than the 60 s window)
    for t0 in range(0, 150, 30):
        for device in devices:
            services.run_events_store(run=run, device=device,
                                      **agent_batch(run.pk, device.uid, float(t0), 20))
    received = [m["event"] for m in drain(channel)]
    # Assert
    assert {e["type"] for e in received} == {"timeline", "metrics", "faults", "idle"}
    applied = old
    for event in received:
        applied = events.snapshot_apply(applied, event)
    fresh = events.run_snapshot(Run.objects.get(pk=run.pk))
    assert applied == fresh
    newest = max(e["end"] for e in fresh["timeline"])
    assert min(e["end"] for e in fresh["timeline"]) >= newest - events.WINDOW_S
    if limit is not None:
        assert len(fresh["timeline"]) == limit
        stored = sorted(TimelineEvent.objects.filter(run=run).values_list("end", flat=True))
        assert min(e["end"] for e in fresh["timeline"]) == stored[-limit]
        assert fresh["idle"]["window"][0] == stored[-limit]  # the idle of what the page shows
    if metrics_limit is not None:
        assert [p["at"] for p in fresh["metrics"]] == [120.0, 150.0, 150.0]
        assert fresh["metrics_limit"] == metrics_limit
    if delta_rows is not None:  # each batch of 40 events came in parts of at most 7
        parts = [len(e["events"]) for e in received if e["type"] == "timeline"]
        assert max(parts) == delta_rows and sum(parts) == 10 * 40
    assert len(fresh["faults"]) == 2  # every fault is kept, not only the window's
    idle = fresh["idle"]["devices"][devices[0].uid]
    assert idle["busy_s"] + idle["idle_s"] == pytest.approx(
        fresh["idle"]["window"][1] - fresh["idle"]["window"][0])
    assert idle["upstream_s"] > 0  # gaps before forwards: waiting for activations


def test_a_snapshot_too_large_for_a_websocket_message_keeps_its_newest_rows():
    # long device names make each row larger: the limits halve until the snapshot fits, and
    # the page trims its deltas by the limits the snapshot says
    name = "d" * 400
    timeline = [{"run": 1, "device": name, "stage": 0, "kind": "forward", "microbatch": m,
                 "version": 0, "start": m * 0.01, "end": m * 0.01 + 0.005} for m in range(3000)]
    metrics = [{"at": m * 0.01, "kind": "loss", "device": name, "value": 1.0}
               for m in range(2000)]
    snapshot = {"type": "snapshot", "timeline_limit": 3000, "timeline": timeline,
                "metrics_limit": 2000, "metrics": metrics, "faults": []}
    bounded = events.snapshot_bounded(snapshot, events.SNAPSHOT_MAX_BYTES)
    # measured as the consumer sends it (json.dumps' default separators)
    assert len(json.dumps(bounded).encode()) <= events.SNAPSHOT_MAX_BYTES < events.WS_MAX_BYTES
    assert (bounded["timeline_limit"], bounded["metrics_limit"]) == (750, 500)
    assert bounded["timeline"] == timeline[-750:] and bounded["metrics"] == metrics[-500:]
    assert events.snapshot_bounded(bounded, events.SNAPSHOT_MAX_BYTES) == bounded


def test_an_event_of_many_rows_is_sent_in_parts_that_apply_as_it_would():
    rows = [{"at": float(i), "kind": "loss", "device": "a", "value": 1.0} for i in range(5)]
    parts = events.event_parts({"type": "metrics", "points": rows}, 2)
    assert [len(p["points"]) for p in parts] == [2, 2, 1]
    assert [r for p in parts for r in p["points"]] == rows
    run_event = {"type": "run", "run": {}}
    assert events.event_parts(run_event, 2) == [run_event]


@pytest.mark.django_db(transaction=True)
def test_a_batchs_deltas_take_their_numbers_at_once_one_after_the_other(
        monkeypatch: pytest.MonkeyPatch):
    # Prepare: a running run whose page listens; every taking of numbers counted (each is a
    # statement: a batch's three deltas took three)
    device = DeviceFactory()
    run = RunFactory(devices=[device], state=Run.State.RUNNING)
    channel = subscribe(run.pk)
    taken = []
    real = events.run_seq_next
    monkeypatch.setattr(events, "run_seq_next",
                        lambda run_id, count=1: taken.append(count) or real(run_id, count))
    # Execute: two batches, each with timeline events, metric points and (the first) faults
    for t0 in (0.0, 30.0):
        services.run_events_store(run=run, device=device,
                                  **agent_batch(run.pk, device.uid, t0, 5))
    received = [m["event"] for m in drain(channel)]
    # Assert: one taking per batch, the numbers consecutive, in the order sent
    assert [e["type"] for e in received] == ["timeline", "faults", "metrics", "idle",
                                             "timeline", "metrics", "idle"]
    assert taken == [4, 3]
    assert [e["seq"] for e in received] == list(range(1, 8))
    assert events.run_seq(run.pk) == 7


@pytest.mark.django_db(transaction=True)
def test_a_runs_event_numbers_are_kept_in_the_database_one_after_the_other():
    from django.core.cache import cache

    run, other = RunFactory(), RunFactory()
    assert events.run_seq(run.pk) == 0
    assert events.run_seq_next(run.pk, 4) == 4  # the first taking: 1..4
    assert events.run_seq_next(other.pk) == 1  # each run counts its own
    cache.clear()  # they were in the cache, which may lose them; no longer
    assert events.run_seq_next(run.pk) == 5
    assert events.run_seq_next(run.pk, 3) == 8
    assert events.run_seq(run.pk) == 8 and events.run_seq(other.pk) == 1
    run.save()  # a save of the whole run does not write a stale number back
    assert events.run_seq(run.pk) == 8
    gone = run.pk
    run.delete()  # its counter with it; taking a number of a deleted run is harmless
    assert events.run_seq(gone) == 0
    assert events.run_seq_next(gone, 2) == 2
    assert events.run_seq(gone) == 0
