"""What a run's Channels group (``run-<id>``) carries: one function builds each event, one sends
it after the transaction commits, and :func:`snapshot_apply` is how a page applies them to the
snapshot it got on connecting (the dashboard's script does the same).

Events: ``run`` (its state or set of plans changed), ``plan`` (a plan was queued, started,
finished or failed), ``timeline`` (a batch of timeline events in the shared schema), ``metrics``
(a batch of metric points), ``faults`` (fault and control events) and ``idle`` (every device's
idle-time breakdown over the window, replacing the previous one).

Every event sent to a run's group carries ``seq``, the run's next number (1, 2, ...: one
counter per run, in the database the web and worker processes share), and the snapshot the
number of the newest event sent before it was read. A channel layer may drop a consumer's
messages without a word (channels_redis beyond its 100-message receive buffer): a page that sees
a number skipped asks for a fresh snapshot; nothing it missed stays missing.

A page keeps a bounded window: the timeline events that end within :data:`WINDOW_S` seconds of
the newest one (at most the snapshot's ``timeline_limit`` newest), likewise the metric points
(at most ``metrics_limit``), and every fault; the snapshot stays within SNAPSHOT_MAX_BYTES and
each delta within DELTA_MAX_ROWS rows, so that every message fits a WebSocket message. The
snapshot is that window read from the database; applying the deltas trims by the same rule, so
an old snapshot brought forward equals a fresh one (tests/webapp/runs/test_events.py)."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import IntegrityError, connection, transaction

from webapp.runs import selectors
from webapp.runs.models import Plan, Run, RunEventSeq
from webapp.runs.serializers import PlanOutput, RunOutput

Event = dict[str, Any]

WINDOW_S = selectors.LIVE_WINDOW_S


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def run_seq(run_id: int) -> int:
    """The number of the newest event sent to the run's group (0: none yet)."""
    value = RunEventSeq.objects.filter(pk=run_id).values_list("seq", flat=True).first()
    return value or 0


def run_seq_next(run_id: int, count: int = 1) -> int:
    """Take the run's next ``count`` event numbers; the last of them. One statement, atomic
    across the web and worker processes on SQLite and PostgreSQL alike: the first taking of a
    run inserts its counter, every later one adds to it. It was the cache's ``incr``, which
    on the embedded default rewrote a cache file and listed the cache's directory: 2.7 ms a
    call, 11% of the web server's samples while three agents trained the MLP. One call per
    commit, however many events it sends (an events batch sends up to four deltas)."""
    table = connection.ops.quote_name(RunEventSeq._meta.db_table)
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {table} (run_id, seq) VALUES (%s, %s) "
                           f"ON CONFLICT (run_id) DO UPDATE SET seq = {table}.seq + excluded.seq "
                           f"RETURNING seq", [run_id, count])
            row = cursor.fetchone()
    except IntegrityError:  # the run was deleted meanwhile: nobody listens to its group
        return count
    value: int = row[0]
    return value


def event_run(run: Run) -> Event:
    """The run's state changed (or its set of plans)."""
    return {"type": "run", "run": RunOutput(run).data}


def event_plan(plan: Plan) -> Event:
    """A plan was queued, started, finished or failed."""
    return {"type": "plan", "plan": PlanOutput(plan).data}


def event_timeline(events: list[dict[str, Any]]) -> Event:
    """Timeline events (shared schema) an agent reported."""
    return {"type": "timeline", "events": events}


def event_metrics(points: list[dict[str, Any]]) -> Event:
    return {"type": "metrics", "points": points}


def event_faults(faults: list[dict[str, Any]]) -> Event:
    return {"type": "faults", "events": faults}


def event_idle(run: Run) -> Event:
    """Every device's idle time over the current window (replaces the last)."""
    window, devices = selectors.run_idle(run=run)
    return {"type": "idle", "window": window, "devices": devices}


# A WebSocket message's most bytes: daphne refuses to send more (autobahn's payload limit,
# 1 MiB by default), and the page's socket closes with 1011 on each attempt to connect
WS_MAX_BYTES = 1024 * 1024
# what a snapshot may take of it (as the consumer sends it: json.dumps' default separators),
# and what one delta's rows may (DELTA_MAX_ROWS of the largest rows, timeline events of about
# 200 bytes, make about 0.4 MB)
SNAPSHOT_MAX_BYTES = WS_MAX_BYTES * 7 // 8
DELTA_MAX_ROWS = 2000


def run_snapshot(run: Run) -> Event:
    """Everything a run page shows, at once, with the number of the newest event sent before
    it was read (read first: an event numbered up to it was committed before the read).
    Within SNAPSHOT_MAX_BYTES: when the window's timeline and metric points would take more
    (long device names, many plans or faults), their limits are halved until it fits, and
    the snapshot says the limits it was read with, which the page's deltas keep."""
    seq = run_seq(run.pk)
    window, idle = selectors.run_idle(run=run)
    snapshot = {"type": "snapshot", "seq": seq, "run": RunOutput(run).data,
                "plans": PlanOutput(run.plans.all(), many=True).data,
                "window_s": WINDOW_S,
                "timeline_limit": selectors.LIVE_MAX_EVENTS,
                "timeline": selectors.run_timeline_window(run=run,
                                                          limit=selectors.LIVE_MAX_EVENTS),
                "metrics_limit": selectors.LIVE_MAX_METRICS,
                "metrics": selectors.run_metrics_window(run=run,
                                                        limit=selectors.LIVE_MAX_METRICS),
                "faults": selectors.run_faults(run=run),
                "idle": {"window": window, "devices": idle}}
    return snapshot_bounded(snapshot, SNAPSHOT_MAX_BYTES)


def snapshot_bounded(snapshot: Event, max_bytes: int) -> Event:
    """``snapshot`` with its timeline and metric limits halved (each window trimmed to its
    newest rows) until its JSON takes at most ``max_bytes``, or both limits are down to 1."""
    while (len(json.dumps(snapshot).encode()) > max_bytes
           and (snapshot["timeline_limit"] > 1 or snapshot["metrics_limit"] > 1)):
        timeline_limit = max(1, snapshot["timeline_limit"] // 2)
        metrics_limit = max(1, snapshot["metrics_limit"] // 2)
        snapshot = {
            **snapshot, "timeline_limit": timeline_limit, "metrics_limit": metrics_limit,
            "timeline": selectors.newest_events(snapshot["timeline"], timeline_limit),
            "metrics": selectors.newest_rows(snapshot["metrics"], metrics_limit,
                                             time_key="at", order=selectors.metric_order)}
    return snapshot


def _group_send(run_id: int, parts: list[Event]) -> None:
    last = run_seq_next(run_id, len(parts))
    numbered = [{"type": "run.event", "event": {**part, "seq": number}}
                for number, part in enumerate(parts, start=last - len(parts) + 1)]
    async_to_sync(_send_in_order)(run_group(run_id), numbered)


async def _send_in_order(group: str, messages: list[Event]) -> None:
    """Send ``messages`` to ``group`` in order, in one call from sync code: each
    ``async_to_sync`` call hops to the event loop's thread and back (in the web server a batch
    of agent events sent up to four deltas, each a hop)."""
    layer = get_channel_layer()
    for message in messages:
        await layer.group_send(group, message)


# the list each event that carries rows carries them in
_ROWS = {"timeline": "events", "metrics": "points", "faults": "events"}


def run_event_send(run_id: int, event: Event) -> None:
    """Send ``event`` to the run's group once the current transaction commits: as several
    events of at most DELTA_MAX_ROWS rows each when it carries more (an agent's batch may hold
    100,000 timeline events, and one message of them could not be sent to a page)."""
    run_events_send(run_id, [event])


def run_events_send(run_id: int, sent: list[Event]) -> None:
    """:func:`run_event_send` for several events of one commit, in order, numbered at once."""
    parts = [part for event in sent for part in event_parts(event, DELTA_MAX_ROWS)]
    if parts:
        transaction.on_commit(partial(_group_send, run_id, parts))


def event_parts(event: Event, max_rows: int) -> list[Event]:
    """``event`` split into events of at most ``max_rows`` rows, in order (itself when it
    carries no more); applying them one after the other is applying ``event``."""
    key = _ROWS.get(event["type"])
    rows = event.get(key) if key else None
    if rows is None or len(rows) <= max_rows:
        return [event]
    return [{**event, key: rows[i:i + max_rows]} for i in range(0, len(rows), max_rows)]


def _windowed(rows: list[dict[str, Any]], time_key: str, sort_key: Any,
              limit: int | None = None) -> list[dict[str, Any]]:
    """The rows within the window, each key once (the first): a page joins its run's group
    before it reads the snapshot, so a delta may bring rows the snapshot already holds."""
    if not rows:
        return rows
    unique: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        unique.setdefault(sort_key(r), r)
    rows = list(unique.values())
    newest = max(r[time_key] for r in rows)
    kept = [r for r in rows if r[time_key] >= newest - WINDOW_S]
    if limit is not None:
        return selectors.newest_rows(kept, limit, time_key=time_key, order=sort_key)
    return sorted(kept, key=sort_key)


def snapshot_apply(snapshot: Event, event: Event) -> Event:
    """The snapshot after ``event``: a run event replaces the run and drops the plans it no
    longer lists, a plan event replaces (or adds) that plan, timeline and metric events extend
    the window (trimmed to it), faults are added, an idle event replaces the breakdown; the
    snapshot's ``seq`` becomes the newest event's."""
    if isinstance(event.get("seq"), int) and event["seq"] > snapshot.get("seq", 0):
        snapshot = {**snapshot, "seq": event["seq"]}
    return _applied(snapshot, event)


def snapshot_gap(snapshot: Event, event: Event) -> bool:
    """Whether ``event`` skips a number after the snapshot's: an event between was lost (the
    page asks for a fresh snapshot)."""
    seq = event.get("seq")
    return isinstance(seq, int) and seq > snapshot.get("seq", 0) + 1


def _applied(snapshot: Event, event: Event) -> Event:
    if event["type"] == "timeline":
        merged = [*snapshot["timeline"], *event["events"]]
        return {**snapshot, "timeline": _windowed(merged, "end", selectors.timeline_order,
                                                  limit=snapshot["timeline_limit"])}
    if event["type"] == "metrics":
        merged = [*snapshot["metrics"], *event["points"]]
        return {**snapshot, "metrics": _windowed(merged, "at", selectors.metric_order,
                                                 limit=snapshot["metrics_limit"])}
    if event["type"] == "faults":
        return {**snapshot, "faults": sorted([*snapshot["faults"], *event["events"]],
                                             key=selectors.fault_order)}
    if event["type"] == "idle":
        return {**snapshot, "idle": {"window": event["window"], "devices": event["devices"]}}
    if event["type"] == "run":
        keep = set(event["run"]["plans"])
        plans = [p for p in snapshot["plans"] if p["id"] in keep]
        return {**snapshot, "run": event["run"], "plans": plans}
    if event["type"] == "plan":
        plan = event["plan"]
        others = [p for p in snapshot["plans"] if p["id"] != plan["id"]]
        return {**snapshot, "plans": sorted([*others, plan], key=lambda p: p["id"])}
    raise ValueError(f"unknown event type {event['type']!r}")
