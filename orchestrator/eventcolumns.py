"""Timeline events and metric points in columns: how an agent sends a batch of them to the
server (the ``timeline_columns`` and ``metrics_columns`` of an ``events`` message,
orchestrator.protocol.Events).

The columns are the shared schema's fields (orchestrator.events.TimelineEvent) but ``run`` and
``device``, which every event of a batch shares: the message names the run, and the device is
the one whose connection sent it. Each column is a JSON array, one item per event, in the
events' order; ``bytes`` and ``pipeline`` may be left out when every event's is 0::

    {"stage": [0, 0], "kind": ["forward", "send"], "microbatch": [3, 3],
     "version": [0, 0], "start": [1.20, 1.21], "end": [1.21, 1.22], "bytes": [0, 16384]}

A batch of N events as objects repeats the ten field names N times: in columns the agent
encodes a third of the bytes and builds no object per event, and the server checks each
column at once (a type and a range over the whole column) and names the first bad item only
when something is wrong (docs/benchmarks.md, "Events in columns").

Metric points go the same way, in the columns ``at``, ``kind``, ``device`` (left out: "" for
every point, a figure of the whole run) and ``value``. As in the object form, a point that
does not read as a MetricSample (a NaN loss, a system figure out of its kind's range) is
refused alone, and the rest are kept.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.events import EVENT_KINDS, TimelineEvent
from orchestrator.protocol import SYSTEM_METRICS, MetricSample, ProtocolError
from orchestrator.protocol.fields import MAX_NAME
from orchestrator.validation import At, expect_integer, expect_number

COLUMNS = ("stage", "kind", "microbatch", "version", "start", "end", "bytes", "pipeline")
OPTIONAL = ("bytes", "pipeline")  # 0 for every event when left out
INTEGERS = ("stage", "microbatch", "version", "bytes", "pipeline")
_KINDS = frozenset(EVENT_KINDS)
_INT = frozenset((int,))
_STR = frozenset((str,))
_FLOAT = frozenset((float,))


def to_columns(events: Sequence[TimelineEvent]) -> dict[str, list[Any]]:
    """``events`` (one run's, one device's) as columns; ``bytes`` and ``pipeline`` left out
    when every event's is 0."""
    rows = [(e.stage, e.kind, e.microbatch, e.version, e.start, e.end, e.bytes, e.pipeline)
            for e in events]
    columns: dict[str, list[Any]] = (
        dict(zip(COLUMNS, map(list, zip(*rows, strict=True)), strict=True)) if rows
        else {name: [] for name in COLUMNS})
    for name in OPTIONAL:
        if not any(columns[name]):
            del columns[name]
    return columns


def column_count(columns: Mapping[str, Any] | None) -> int:
    """How many events ``columns`` hold (0 for None), as the ``kind`` column says."""
    if not columns:
        return 0
    kinds = columns.get("kind")
    return len(kinds) if isinstance(kinds, list) else 0


def parse_columns(raw: Any, *, run: int, device: str, limits: Mapping[str, int] | None = None,
                  file: str = "<input>", path: str = "timeline_columns"
                  ) -> list[TimelineEvent]:
    """The timeline events ``raw`` holds in columns, of ``run`` and ``device``. ``limits``:
    the most an integer column may hold (a database column's range). Raises FormatError
    naming the first bad item (``timeline_columns.end[12]``)."""
    checked = checked_columns(raw, limits=limits, file=file, path=path)
    return [TimelineEvent(run, device, *values)
            for values in zip(*(checked[name] for name in COLUMNS), strict=True)]


def checked_columns(raw: Any, *, limits: Mapping[str, int] | None = None,
                    file: str = "<input>", path: str = "timeline_columns"
                    ) -> dict[str, list[Any]]:
    """``raw``'s columns, checked as :func:`parse_columns` checks them, every one of COLUMNS
    (a column left out as 0s), without an object per event: the web server stores a batch
    from its columns and sends the page their rows (:func:`columns_json`)."""
    at = At(file, path)
    count = _column_count(raw, at, COLUMNS, OPTIONAL)
    limits = limits or {}
    zeros = [0] * count
    checked: dict[str, list[Any]] = {
        name: _integers(raw[name], limits.get(name), at.key(name)) if name in raw else zeros
        for name in INTEGERS}
    kinds = raw["kind"]
    if not (set(map(type, kinds)) <= _STR and set(kinds) <= _KINDS):
        i = next(i for i, k in enumerate(kinds) if not isinstance(k, str) or k not in _KINDS)
        raise at.key("kind").index(i).fail(f"must be one of {', '.join(EVENT_KINDS)}",
                                           kinds[i])
    starts, ends = _seconds(raw["start"], at.key("start")), _seconds(raw["end"], at.key("end"))
    if not all(map(operator.le, starts, ends)):
        i = next(i for i, (s, e) in enumerate(zip(starts, ends, strict=True)) if not s <= e)
        raise at.key("end").index(i).fail(f"is before start ({starts[i]})", raw["end"][i])
    checked.update(kind=kinds, start=starts, end=ends)
    return checked


def columns_json(checked: Mapping[str, list[Any]], *, run: int, device: str
                 ) -> list[dict[str, Any]]:
    """The events of ``checked`` columns (:func:`checked_columns`), of ``run`` and ``device``,
    as TimelineEvent.to_json writes each."""
    rows = [{"run": run, "device": device, "stage": stage, "kind": kind,
             "microbatch": microbatch, "version": version, "start": start, "end": end,
             "bytes": nbytes}
            for stage, kind, microbatch, version, start, end, nbytes in zip(
                checked["stage"], checked["kind"], checked["microbatch"], checked["version"],
                checked["start"], checked["end"], checked["bytes"], strict=True)]
    if any(checked["pipeline"]):
        for row, pipeline in zip(rows, checked["pipeline"], strict=True):
            if pipeline:
                row["pipeline"] = pipeline
    return rows


def _column_count(raw: Any, at: At, known: Sequence[str], optional: Sequence[str]) -> int:
    """How many items each of the columns ``raw`` holds: an object of arrays of one length, of
    the ``known`` columns, all there but the ``optional``; FormatError naming what is not."""
    if not isinstance(raw, dict):
        raise at.fail("must be a JSON object of columns", show_value=False)
    for name in raw:
        if name not in known:
            raise at.key(str(name)).fail(
                f"is not a known column (known: {', '.join(known)})", show_value=False)
    for name in known:
        if name not in raw and name not in optional:
            raise at.key(name).fail("is missing", show_value=False)
        if not isinstance(raw.get(name, []), list):
            raise at.key(name).fail("must be a JSON array", show_value=False)
    count = len(raw["kind"])
    for name, column in raw.items():
        if len(column) != count:
            raise at.key(name).fail(f"has {len(column)} items but kind has {count}",
                                    show_value=False)
    return count


def _integers(column: list[Any], maximum: int | None, at: At) -> list[int]:
    """The column's integers from 0 (to ``maximum``), as parse_event reads an event's (1.0 is
    1): the whole column at once, item by item only when an item is not an int."""
    if set(map(type, column)) <= _INT and (not column or min(column) >= 0):
        values: list[int] = column
    else:
        values = [expect_integer(value, at.index(i)) for i, value in enumerate(column)]
    if maximum is not None and values and max(values) > maximum:
        i = next(i for i, value in enumerate(values) if value > maximum)
        raise at.index(i).fail(f"must be at most {maximum}", column[i])
    return values


def _seconds(column: list[Any], at: At) -> list[float]:
    """The column's finite numbers from 0, as floats, as parse_event reads an event's."""
    if set(map(type, column)) <= _FLOAT and (not column or (
            min(column) >= 0 and math.isfinite(sum(column)))):  # a NaN or inf makes the sum one
        floats: list[float] = column
        return floats
    return [expect_number(value, at.index(i)) for i, value in enumerate(column)]


METRIC_COLUMNS = ("at", "kind", "device", "value")
_SYSTEM = frozenset(SYSTEM_METRICS)


def metric_columns(points: Sequence[tuple[float, str, str, float]]) -> dict[str, list[Any]]:
    """Metric points, each (at, kind, device, value), as columns."""
    if not points:
        return {name: [] for name in METRIC_COLUMNS}
    return dict(zip(METRIC_COLUMNS, map(list, zip(*points, strict=True)), strict=True))


def parse_metric_columns(raw: Any, *, file: str = "<input>", path: str = "metrics_columns"
                         ) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The metric points ``raw`` holds in columns, as MetricSample.to_json writes them, and a
    ``{field, reason}`` for each point refused (``metrics_columns.value[3]``), as a
    MetricSample reads it. Columns that are not columns raise FormatError naming them."""
    at = At(file, path)
    count = _column_count(raw, at, METRIC_COLUMNS, ("device",))
    ats, kinds, values = raw["at"], raw["kind"], raw["value"]
    devices = raw.get("device", [""] * count)
    if count == 0 or _plain_points(ats, kinds, devices, values):
        return ([{"at": a, "kind": k, "device": d, "value": v}
                 for a, k, d, v in zip(ats, kinds, devices, values, strict=True)], [])
    read = MetricSample.reader()
    kept, refused = [], []
    for i, point in enumerate(zip(ats, kinds, devices, values, strict=True)):
        try:
            kept.append(read(dict(zip(METRIC_COLUMNS, point, strict=True)), f"{path}[{i}]"
                             ).to_json())
        except ProtocolError as exc:
            column = (exc.field or "").rpartition(".")[2]
            field = f"{path}.{column}[{i}]" if column in METRIC_COLUMNS else f"{path}[{i}]"
            refused.append({"field": field, "reason": exc.reason})
    return kept, refused


def _plain_points(ats: list[Any], kinds: list[Any], devices: list[Any],
                  values: list[Any]) -> bool:
    """Whether every point reads as a MetricSample as it is, checked column by column: floats
    (a NaN or inf makes the sum one), and kinds of no system figure (whose ranges are checked
    point by point)."""
    return (set(map(type, ats)) <= _FLOAT and set(map(type, values)) <= _FLOAT
            and math.isfinite(sum(ats)) and math.isfinite(sum(values))
            and set(map(type, kinds)) <= _STR and set(map(type, devices)) <= _STR
            and _SYSTEM.isdisjoint(kinds) and min(map(len, kinds)) >= 1
            and max(map(len, kinds)) <= MAX_NAME and max(map(len, devices)) <= MAX_NAME)
