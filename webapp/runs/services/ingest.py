"""What runs produce, stored in bulk: the agents' timeline events, fault events and metric points,
and the run page's deltas sent as they are stored."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection, models, transaction

from orchestrator.errors import FormatError
from orchestrator.eventcolumns import (
    COLUMNS,
    checked_columns,
    columns_json,
    parse_metric_columns,
)
from orchestrator.events import FaultEvent as FaultRecord
from orchestrator.events import TimelineEvent as TimelineRecord
from orchestrator.events import parse_event, parse_fault
from orchestrator.protocol import MAX_REFUSALS, MetricSample, ProtocolError
from webapp.common.exceptions import Conflict, InvalidInput
from webapp.devices.models import Device
from webapp.runs import events, selectors
from webapp.runs.models import (
    FaultEvent,
    MetricPoint,
    Run,
    RunDevice,
    TimelineEvent,
)
from webapp.runs.states import ACTIVE

log = logging.getLogger(__name__)


BULK_BATCH = 2000


# what the event tables' integer columns hold
COLUMN_LIMITS = {"stage": 2**31 - 1, "pipeline": 2**31 - 1, "microbatch": 2**31 - 1,
                 "version": 2**31 - 1, "bytes": 2**63 - 1}


TIMELINE_COLUMNS = ("run_id", "device", "stage", "kind", "microbatch", "version", "start", "end",
                    "bytes", "pipeline")


METRIC_COLUMNS = ("run_id", "at", "kind", "device", "value")


def timeline_events_store(*, run: Run, records: Iterable[TimelineRecord]
                          ) -> list[TimelineRecord]:
    """Store timeline events in bulk; returns the records stored.

    One ``executemany`` per BULK_BATCH rows: the ORM's ``bulk_create`` builds a model and
    compiles its values per event, which made ingesting a busy run's events a large share of
    the web process's CPU, on the machine the agents train on."""
    stored = list(records)
    _insert_rows(TimelineEvent, TIMELINE_COLUMNS, _event_rows(run.pk, stored))
    return stored


def _event_rows(run_id: int, records: Iterable[TimelineRecord]) -> list[tuple[Any, ...]]:
    """The values of TIMELINE_COLUMNS of each of ``records``."""
    return [(run_id, e.device, e.stage, e.kind, e.microbatch, e.version, e.start, e.end,
             e.bytes, e.pipeline) for e in records]


def _insert_rows(model: type[models.Model], columns: Sequence[str],
                 rows: Sequence[tuple[Any, ...]]) -> None:
    """INSERT ``rows`` (values of ``columns``, in order) into ``model``'s table."""
    quote = connection.ops.quote_name
    sql = (f"INSERT INTO {quote(model._meta.db_table)} "
           f"({', '.join(quote(c) for c in columns)}) "
           f"VALUES ({', '.join(['%s'] * len(columns))})")
    with connection.cursor() as cursor:
        for first in range(0, len(rows), BULK_BATCH):
            cursor.executemany(sql, rows[first:first + BULK_BATCH])


def fault_events_store(*, run: Run, records: Iterable[FaultRecord]) -> list[FaultEvent]:
    return FaultEvent.objects.bulk_create(
        (FaultEvent(run=run, at=f.at, kind=f.kind, device=f.device or "",
                    detail=dict(f.detail or {})) for f in records), batch_size=BULK_BATCH)


def metric_points_store(*, run: Run, points: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Store metric points in bulk, as timeline_events_store does (``bulk_create`` took a sixth
    of a core of the web process while a three-stage MLP pipeline reported its loss and
    accuracy per micro-batch); returns them as the run page reads them
    (selectors.metric_json)."""
    stored = [{"at": p["at"], "kind": p["kind"], "device": p.get("device") or "",
               "value": p["value"]} for p in points]
    run_id = run.pk
    _insert_rows(MetricPoint, METRIC_COLUMNS, [
        (run_id, m["at"], m["kind"], m["device"], m["value"]) for m in stored])
    return stored


def _parsed(items: Sequence[Any], field: str, parse: Any, run: Run) -> list[Any]:
    out = []
    for i, raw in enumerate(items):
        try:
            record = parse(raw, file=field, path=f"{field}[{i}]")
        except FormatError as exc:
            raise InvalidInput(exc.field, exc.reason) from None
        if record.run != run.pk:
            raise InvalidInput(f"{field}[{i}].run", f"is {record.run} but the events are "
                                                    f"posted to run {run.pk}")
        for name, limit in COLUMN_LIMITS.items():
            if getattr(record, name, 0) > limit:
                raise InvalidInput(f"{field}[{i}].{name}", f"must be at most {limit}")
        out.append(record)
    return out


def _metric_points(metrics: Sequence[Any], columns: Sequence[Any] = ()
                   ) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The metric points that read as MetricSample, and {field, reason} for each one that does
    not: one point the database cannot hold (a NaN loss; SQLite stores NaN as NULL) is refused
    alone, where it failed the whole batch, timeline events included. ``columns``: more
    points, in orchestrator.eventcolumns' columns (columns that are not columns refuse the
    batch)."""
    kept, refused = [], []
    read = MetricSample.reader()
    for i, raw in enumerate(metrics):
        try:
            kept.append(read(raw, f"metrics[{i}]").to_json())
        except ProtocolError as exc:
            refused.append({"field": exc.field or f"metrics[{i}]", "reason": exc.reason})
    for raw in columns:
        try:
            points, refusals = parse_metric_columns(raw, file="metrics_columns")
        except FormatError as exc:
            raise InvalidInput(exc.field, exc.reason) from None
        kept += points
        refused += refusals
    if refused:
        log.warning("refused %d metric point(s): %s: %s", len(refused), refused[0]["field"],
                    refused[0]["reason"])
    return kept, refused


@dataclass(frozen=True)
class EventsMark:
    """A device's membership of a run (``pk``), and the newest events batch stored of it:
    ``seq`` of ``stream`` (RunDevice.events_stream and events_seq)."""

    pk: int
    events_stream: str
    events_seq: int


def run_member_lock(*, run: Run, device: Device) -> EventsMark | None:
    """(In a transaction.) The device's membership of the run, locked, for storing a batch of
    its events (None: not a member). On PostgreSQL the run's row is first locked FOR KEY
    SHARE, the lock that the batch's inserts take anyway through their foreign key: taken
    after the membership's, it reversed the order of every other writer (the run, then a
    membership), and an events batch and a stage report deadlocked (both waited a second,
    then one failed).

    Read with the cursor, as the run in webapp.gateway.services._run_of: composing the ORM's
    query took a sixth of the web server's Python time while two agents trained VGG-5, and a
    RawQuerySet's model of every column still 1 ms a batch."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT 1 FROM runs_run WHERE id = %s FOR KEY SHARE", [run.pk])
        lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
        table = connection.ops.quote_name(RunDevice._meta.db_table)
        cursor.execute(f"SELECT id, events_stream, events_seq FROM {table} "
                       f"WHERE run_id = %s AND device_id = %s{lock}", [run.pk, device.pk])
        row = cursor.fetchone()
    return None if row is None else EventsMark(*row)


# when this process asks the cache again whether a run's idle breakdown is due (a throttle on
# the question only: the answer is the cache's, shared by every web process)
_idle_asked: dict[int, float] = {}
_IDLE_ASKED_MAX = 1024


def _idle_due(run_id: int) -> bool:
    """The idle breakdown reads the whole window back from the database: recompute it at most
    every LIVE_IDLE_INTERVAL_S per run, not for every agent's batch. The mark is in the cache
    (Redis when deployed), shared by every web process: cache.add sets it only if absent.
    This process asks again only an interval after it set the mark, or a quarter of one
    after another process had (asking on every batch cost 0.3 ms on the embedded default's
    file cache, 4% of the web server's CPU while two agents trained VGG-5)."""
    now = time.monotonic()
    if now < _idle_asked.get(run_id, 0.0):
        return False
    interval = float(settings.LIVE_IDLE_INTERVAL_S)
    due = bool(cache.add(f"idle-due:{run_id}", True, timeout=interval))
    if len(_idle_asked) >= _IDLE_ASKED_MAX:
        _idle_asked.clear()
    _idle_asked[run_id] = now + (interval if due else interval / 4)
    return due


@transaction.atomic
def run_events_store(*, run: Run, device: Device, timeline: Sequence[Any] = (),
                     timeline_columns: Sequence[Any] = (), faults: Sequence[Any] = (),
                     metrics: Sequence[dict[str, Any]] = (), metrics_columns: Sequence[Any] = (),
                     stream: str | None = None, seq: int | None = None) -> dict[str, Any]:
    """Store a batch an agent reports for a run it belongs to: timeline events (its own, as
    objects in ``timeline`` and then in ``timeline_columns``, each an
    orchestrator.eventcolumns object), fault events and metric points (in ``metrics`` and
    then in ``metrics_columns``). Validated whole before anything is stored (metric points
    one by one). A batch numbered ``seq`` in the agent's
    ``stream`` is stored once: the same batch again (sent anew after a reconnect) stores
    nothing."""
    _check_active(run)
    member = None
    if stream is not None and seq is not None:
        member = run_member_lock(run=run, device=device)
        if member is not None and member.events_stream == stream and seq <= member.events_seq:
            return {"timeline": 0, "faults": 0, "metrics": 0, "refused": []}
    return run_events_store_locked(run=run, device=device, member=member, timeline=timeline,
                                   timeline_columns=timeline_columns, faults=faults,
                                   metrics=metrics, metrics_columns=metrics_columns,
                                   stream=stream, seq=seq)


def _check_active(run: Run) -> None:
    if run.state not in ACTIVE:
        raise Conflict(f"run {run.pk} is {run.state}: it takes events only while "
                       f"{', '.join(sorted(ACTIVE))}", state=run.state, action="report events")


def run_events_store_locked(*, run: Run, device: Device, member: EventsMark | None,
                            timeline: Sequence[Any] = (), timeline_columns: Sequence[Any] = (),
                            faults: Sequence[Any] = (), metrics: Sequence[dict[str, Any]] = (),
                            metrics_columns: Sequence[Any] = (), stream: str | None = None,
                            seq: int | None = None) -> dict[str, Any]:
    """(In a transaction.) :func:`run_events_store` for a caller that holds the device's
    membership locked already (``member``, from :func:`run_member_lock`) and has skipped what
    it stored before: the gateway, which merges an agent's queued batches. Locking it again
    cost two more round trips to the database per batch on PostgreSQL."""
    _check_active(run)
    records = _parsed(timeline, "timeline", parse_event, run)
    for i, record in enumerate(records):
        if record.device != device.uid:
            raise InvalidInput(f"timeline[{i}].device", f"is {record.device!r} but this device "
                                                        f"is {device.uid!r}")
    # the events as the rows stored and as the page's delta shows them; those in columns
    # (what agents send) without an object each: building a TimelineRecord per event, and
    # its JSON, were a tenth of the web server's CPU while two agents trained the MLP
    rows = _event_rows(run.pk, records)
    shown = [e.to_json() for e in records]
    for columns in timeline_columns:
        try:
            checked = checked_columns(columns, limits=COLUMN_LIMITS, file="timeline_columns")
        except FormatError as exc:
            raise InvalidInput(exc.field, exc.reason) from None
        rows += zip(repeat(run.pk), repeat(device.uid), *(checked[name] for name in COLUMNS))
        shown += columns_json(checked, run=run.pk, device=device.uid)
    faults_parsed = _parsed(faults, "faults", parse_fault, run)
    # each store only when there is something to store: most batches carry no faults, and
    # an empty bulk_create still cost a twentieth of taking in a batch
    if rows:
        _insert_rows(TimelineEvent, TIMELINE_COLUMNS, rows)
    stored_faults = (fault_events_store(run=run, records=faults_parsed) if faults_parsed
                     else [])
    points, refused = _metric_points(metrics, metrics_columns)
    stored_metrics = metric_points_store(run=run, points=points) if points else []
    # the run page's deltas, in the snapshot's own shapes, sent together when it commits
    deltas = []
    if shown:
        deltas.append(events.event_timeline(shown))
    if stored_faults:
        deltas.append(events.event_faults([selectors.fault_json(r) for r in stored_faults]))
    if stored_metrics:
        deltas.append(events.event_metrics(stored_metrics))
    if rows and _idle_due(run.pk):
        deltas.append(events.event_idle(run))
    events.run_events_send(run.pk, deltas)
    if member is not None:
        with connection.cursor() as cursor:  # member.save() composed its UPDATE every batch
            cursor.execute(f"UPDATE {connection.ops.quote_name(RunDevice._meta.db_table)} "
                           "SET events_stream = %s, events_seq = %s WHERE id = %s",
                           [stream or "", seq or 0, member.pk])
    return {"timeline": len(rows), "faults": len(stored_faults),
            "metrics": len(stored_metrics), "refused": refused[:MAX_REFUSALS]}
