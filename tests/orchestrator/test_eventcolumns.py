"""orchestrator.eventcolumns: timeline events in columns read back as the same events, and a bad
item refused naming its column and index, exactly where the same event as an object is
refused by parse_event; metric points in columns read as MetricSample reads them, a bad one
refused alone."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import FormatError
from orchestrator.eventcolumns import (
    COLUMNS,
    METRIC_COLUMNS,
    checked_columns,
    column_count,
    columns_json,
    metric_columns,
    parse_columns,
    parse_metric_columns,
    to_columns,
)
from orchestrator.events import EVENT_KINDS, TimelineEvent, parse_event
from orchestrator.protocol import Events, MetricSample, ProtocolError, parse_agent_message
from orchestrator.protocol.fields import json_deeper_than, read_json_text

RUN, DEVICE = 7, "edge-a"


@st.composite
def timeline_events(draw: Any) -> TimelineEvent:
    start = draw(st.floats(min_value=0, max_value=1e6))
    return TimelineEvent(RUN, DEVICE, draw(st.integers(0, 63)), draw(st.sampled_from(EVENT_KINDS)),
                         draw(st.integers(0, 2**31 - 1)), draw(st.integers(0, 10**6)), start,
                         start + draw(st.floats(min_value=0, max_value=10)),
                         draw(st.sampled_from([0, 0, 16384, 2**40])),
                         draw(st.sampled_from([0, 0, 3])))


@settings(max_examples=200)
@given(st.lists(timeline_events(), max_size=30))
def test_columns_read_back_as_the_events_they_hold(events: list[TimelineEvent]) -> None:
    columns = json.loads(json.dumps(to_columns(events)))  # as the server receives them
    assert parse_columns(columns, run=RUN, device=DEVICE) == events
    assert column_count(columns) == len(events)


@settings(max_examples=200)
@given(st.lists(timeline_events(), max_size=30))
def test_checked_columns_show_each_event_as_its_json(events: list[TimelineEvent]) -> None:
    """What the web server stores and shows from a batch's columns, without an object per
    event: each event's values, and its JSON as TimelineEvent.to_json writes it."""
    columns = json.loads(json.dumps(to_columns(events)))
    checked = checked_columns(columns)
    assert set(checked) == set(COLUMNS)
    assert [TimelineEvent(RUN, DEVICE, *values)
            for values in zip(*(checked[name] for name in COLUMNS), strict=True)] == events
    shown = columns_json(checked, run=RUN, device=DEVICE)
    assert shown == [e.to_json() for e in events]
    assert [list(row) for row in shown] == [list(e.to_json()) for e in events]  # key order


def test_bytes_and_pipeline_are_left_out_when_every_event_s_is_zero() -> None:
    events = [TimelineEvent(RUN, DEVICE, 0, "forward", m, 0, m, m + 0.5) for m in range(3)]
    assert set(to_columns(events)) == set(COLUMNS) - {"bytes", "pipeline"}
    sent = [*events, TimelineEvent(RUN, DEVICE, 0, "send", 2, 0, 3, 3.1, 4096)]
    assert to_columns(sent)["bytes"] == [0, 0, 0, 4096] and "pipeline" not in to_columns(sent)
    assert to_columns([]) == {name: [] for name in COLUMNS if name not in ("bytes", "pipeline")}
    assert column_count(None) == 0


def columns_of(*events: dict[str, Any]) -> dict[str, list[Any]]:
    return {name: [e[name] for e in events] for name in COLUMNS}


GOOD = {"run": RUN, "device": DEVICE, "stage": 1, "kind": "send", "microbatch": 4, "version": 2,
        "start": 1.5, "end": 2.0, "bytes": 16384, "pipeline": 0}
BAD_VALUES = [("stage", -1), ("stage", True), ("stage", 1.5), ("stage", "1"), ("stage", None),
              ("microbatch", -3), ("version", 2.5), ("bytes", -1), ("pipeline", [1]),
              ("kind", "think"), ("kind", 3), ("kind", None), ("start", -0.5),
              ("start", math.nan), ("start", math.inf), ("start", "1.5"), ("end", math.nan),
              ("end", 1.0), ("end", math.inf), ("end", False)]


@pytest.mark.parametrize(("name", "value"), BAD_VALUES)
def test_a_bad_item_is_refused_where_the_same_event_as_an_object_is(name: str,
                                                                   value: Any) -> None:
    bad = {**GOOD, name: value}
    with pytest.raises(FormatError):
        parse_event(bad)
    with pytest.raises(FormatError) as refused:
        parse_columns(columns_of(GOOD, GOOD, bad, GOOD), run=RUN, device=DEVICE)
    assert refused.value.field == f"timeline_columns.{name}[2]"


@settings(max_examples=300)
@given(st.sampled_from(["stage", "microbatch", "version", "bytes", "pipeline", "start", "end",
                        "kind"]),
       st.one_of(st.integers(-5, 2**40), st.floats(allow_nan=True, allow_infinity=True),
                 st.booleans(), st.none(), st.text(max_size=10), st.sampled_from(EVENT_KINDS)))
def test_columns_accept_exactly_what_parse_event_accepts(name: str, value: Any) -> None:
    """Brute force against the reader of events as objects, one field changed at a time."""
    event = {**GOOD, name: value}
    try:
        expected: TimelineEvent | None = parse_event(event)
    except FormatError:
        expected = None
    try:
        got: list[TimelineEvent] | None = parse_columns(columns_of(event), run=RUN,
                                                       device=DEVICE)
    except FormatError:
        got = None
    assert got == (None if expected is None else [expected])


@pytest.mark.parametrize(("columns", "field", "reason"), [
    ([], "timeline_columns", "must be a JSON object"),
    ({**columns_of(GOOD), "device": ["x"]}, "timeline_columns.device", "not a known column"),
    ({k: v for k, v in columns_of(GOOD).items() if k != "end"}, "timeline_columns.end",
     "is missing"),
    ({**columns_of(GOOD), "version": [1, 2]}, "timeline_columns.version",
     "has 2 items but kind has 1"),
    ({**columns_of(GOOD), "kind": "send"}, "timeline_columns.kind", "must be a JSON array"),
    ({**columns_of(GOOD), "stage": {"0": 1}}, "timeline_columns.stage", "must be a JSON array"),
])
def test_a_malformed_set_of_columns_names_the_column(columns: Any, field: str,
                                                     reason: str) -> None:
    with pytest.raises(FormatError) as refused:
        parse_columns(columns, run=RUN, device=DEVICE)
    assert refused.value.field == field and reason in str(refused.value)


def test_a_column_beyond_its_limit_is_refused_at_its_item() -> None:
    columns = columns_of(GOOD, {**GOOD, "microbatch": 2**31})
    with pytest.raises(FormatError) as refused:
        parse_columns(columns, run=RUN, device=DEVICE, limits={"microbatch": 2**31 - 1})
    assert refused.value.field == "timeline_columns.microbatch[1]"
    assert "at most 2147483647" in str(refused.value)
    assert len(parse_columns(columns, run=RUN, device=DEVICE)) == 2  # no limit given


def test_an_events_message_carries_columns_and_bounds_them() -> None:
    events = [TimelineEvent(RUN, DEVICE, 0, "forward", m, 0, m, m + 0.5) for m in range(3)]
    message = Events(run=RUN, timeline_columns=to_columns(events), stream="s", seq=1)
    read = parse_agent_message(json.loads(json.dumps(message.to_json())))
    assert isinstance(read, Events) and read.timeline == ()
    assert parse_columns(read.timeline_columns, run=RUN, device=DEVICE) == events
    for bad, field in [({"kind": "forward"}, "timeline_columns.kind"),
                       ({f"c{i}": [] for i in range(17)}, "timeline_columns")]:
        with pytest.raises(ProtocolError) as refused:
            parse_agent_message({"type": "events", "run": RUN, "timeline_columns": bad})
        assert refused.value.field == field


def test_a_message_s_depth_is_still_measured_past_a_column_of_scalars() -> None:
    deep: Any = 1
    for _ in range(70):
        deep = [deep]
    columns = {**columns_of(GOOD), "kind": ["send", deep]}
    assert json_deeper_than(columns, 64)
    assert not json_deeper_than(copy.deepcopy(columns_of(GOOD, GOOD)), 2)
    with pytest.raises(ProtocolError):
        read_json_text(json.dumps({"type": "events", "run": RUN, "timeline_columns": columns}))


# ---- metric points


POINT = {"at": 1.25, "kind": "loss", "device": "edge-a", "value": 2.5}


def metric_columns_of(*points: dict[str, Any]) -> dict[str, list[Any]]:
    return {name: [p[name] for p in points] for name in METRIC_COLUMNS}


def test_metric_points_read_back_as_a_metric_sample_writes_them() -> None:
    rows = [(0.5, "loss", "edge-a", 2.5), (0.5, "throughput_sps", "", 320.0),
            (0.75, "cpu_pct", "edge-a", 55.0)]
    kept, refused = parse_metric_columns(json.loads(json.dumps(metric_columns(rows))))
    assert refused == [] and kept == [
        MetricSample(at=a, kind=k, device=d, value=v).to_json() for a, k, d, v in rows]
    no_device = {k: v for k, v in metric_columns(rows[:1]).items() if k != "device"}
    assert parse_metric_columns(no_device)[0] == [{**POINT, "at": 0.5, "device": ""}]
    assert metric_columns([]) == {name: [] for name in METRIC_COLUMNS}


@settings(max_examples=300)
@given(st.sampled_from(["at", "kind", "device", "value"]),
       st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5),
                 st.booleans(), st.none(), st.text(max_size=3), st.just("x" * 201),
                 st.sampled_from(["cpu_pct", "temp_c", "loss", ""])),
       st.sampled_from(["loss", "cpu_pct"]))
def test_a_point_is_refused_alone_exactly_where_a_metric_sample_refuses_it(
        name: str, value: Any, kind: str) -> None:
    """Brute force against MetricSample's reader, one field changed at a time, among good
    points (a system figure's range is checked too)."""
    point = {**POINT, "kind": kind, name: value}
    try:
        expected: dict[str, Any] | None = MetricSample.reader()(point, "p").to_json()
    except ProtocolError:
        expected = None
    kept, refused = parse_metric_columns(metric_columns_of(POINT, point, POINT))
    if expected is None:
        assert kept == [POINT, POINT] and len(refused) == 1
        assert refused[0]["field"].startswith("metrics_columns.")
        assert refused[0]["field"].endswith("[1]")
    else:
        assert refused == [] and kept == [POINT, expected, POINT]


def test_a_refused_point_names_its_column() -> None:
    kept, refused = parse_metric_columns(metric_columns_of(
        POINT, {**POINT, "value": math.nan}, {**POINT, "kind": "cpu_pct", "value": 400.0}))
    assert kept == [POINT]
    assert [r["field"] for r in refused] == ["metrics_columns.value[1]",
                                             "metrics_columns.value[2]"]


@pytest.mark.parametrize(("columns", "field"), [
    ("x", "metrics_columns"),
    ({**metric_columns_of(POINT), "stage": [0]}, "metrics_columns.stage"),
    ({k: v for k, v in metric_columns_of(POINT).items() if k != "value"},
     "metrics_columns.value"),
    ({**metric_columns_of(POINT), "at": 1.0}, "metrics_columns.at"),
    ({**metric_columns_of(POINT), "device": ["a", "b"]}, "metrics_columns.device"),
])
def test_metric_columns_that_are_not_columns_refuse_the_batch(columns: Any,
                                                              field: str) -> None:
    with pytest.raises(FormatError) as refused:
        parse_metric_columns(columns)
    assert refused.value.field == field
