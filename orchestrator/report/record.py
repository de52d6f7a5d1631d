"""What a run report is made of, and how it is read back from the files a run page exports.

A :class:`RunRecord` holds a run in the shared formats (docs/architecture.md): its timeline
events, fault and control events, metric points, the plans it was planned with and, optionally,
the chosen plan's predicted events (the Gantt's ghost). The dashboard builds one from the
database; ``python -m orchestrator report`` reads one from the run page's downloads: the
timeline trace (Chrome trace JSON, or timeline events JSON such as ``simulate`` prints), the
metrics CSV and the plan JSON. Every reading error is a :class:`FormatError` naming the file.
No plotting here: :mod:`orchestrator.report.figures` draws a record.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from orchestrator.errors import FormatError
from orchestrator.events import EVENT_KINDS, FaultEvent, TimelineEvent, parse_event
from orchestrator.planformat import parse_plan_stages
from orchestrator.validation import (
    At,
    expect_integer,
    expect_list,
    expect_number,
    expect_object,
    expect_string,
    read_json,
    read_text,
)

METRICS_HEADER = ("at_s", "kind", "device", "value")
# a report's Gantt draws at most this many events, the newest (SVG bars: a long run has
# millions; the other figures account for all of them)
GANTT_MAX_EVENTS = 10_000
_LABELLED = re.compile(r"^(?P<label>.*) \((?P<uid>[^()]+)\)$")  # "pi one (a1b2)"


@dataclass(frozen=True)
class Metric:
    """One metric point: ``kind`` (throughput_sps, loss, accuracy, ...) of ``device`` ("" for
    the whole run) at ``at`` seconds of run time."""

    at: float
    kind: str
    device: str
    value: float


@dataclass(frozen=True)
class PlanSummary:
    """One row of the plans' comparison: a plan's predicted figures, or why it has none."""

    algorithm: str
    layout: str = ""
    stages: int | None = None
    period_s: float | None = None
    throughput_sps: float | None = None
    simulated_throughput_sps: float | None = None
    bottleneck: str = ""
    memory_ok: bool | None = None
    planner_s: float | None = None
    status: str = "done"
    error: str = ""
    chosen: bool = False


@dataclass(frozen=True)
class RunRecord:
    """A run in the shared formats. ``devices`` lists device ids in pipeline order (devices
    that only appear in the events follow); ``labels`` maps ids to the names shown;
    ``planned`` holds the chosen plan's predicted events in run time."""

    title: str
    schedule: str = "1f1b"
    events: tuple[TimelineEvent, ...] = ()
    faults: tuple[FaultEvent, ...] = ()
    metrics: tuple[Metric, ...] = ()
    plans: tuple[PlanSummary, ...] = ()
    devices: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    planned: tuple[TimelineEvent, ...] = ()
    batch_size: int | None = None
    source: str = ""

    def label(self, device: str) -> str:
        return self.labels.get(device) or device

    def device_order(self) -> list[str]:
        """Every device of the record: ``devices`` first, then the others by first stage."""
        order = list(dict.fromkeys(self.devices))
        first_stage: dict[str, int] = {}
        for e in (*self.events, *self.planned):
            first_stage[e.device] = min(first_stage.get(e.device, e.stage), e.stage)
        order += sorted((d for d in first_stage if d not in order),
                        key=lambda d: (first_stage[d], d))
        return order

    @property
    def chosen_plan(self) -> PlanSummary | None:
        return next((p for p in self.plans if p.chosen), None)

    @property
    def makespan_s(self) -> float:
        return max((e.end for e in self.events), default=0.0)


# --------------------------------------------------------------------------- plans


def stages_text(stages: Sequence[Mapping[str, Any]], labels: Mapping[str, str]) -> str:
    """``layers 0–3 on pi one; layers 4–9 on pi two + pi three``."""
    parts = []
    for stage in stages:
        a, e = stage["layers"]
        names = " + ".join(labels.get(d) or d for d in stage["devices"])
        parts.append(f"{'layer' if a == e else 'layers'} {a if a == e else f'{a}–{e}'} on {names}")
    return "; ".join(parts)


def _object(raw: Any, at: At, required: Sequence[str]) -> dict[str, Any]:
    """A JSON object with the ``required`` fields; others are let through (a report reads
    plans of every planner, newer ones included)."""
    if not isinstance(raw, dict):
        raise at.fail(f"must be a JSON object, not {type(raw).__name__}", show_value=False)
    return expect_object(raw, at, required, tuple(raw))


def plan_summary(raw: Any, *, file: str = "<input>", labels: Mapping[str, str] | None = None,
                 chosen: bool = False) -> PlanSummary:
    """A plan JSON document (docs/architecture.md, "Plan") as a row of the comparison."""
    at = At(file)
    obj = _object(raw, at, ("algorithm", "stages"))
    algorithm = expect_string(obj["algorithm"], at.key("algorithm"))
    stages = [{"layers": stage.layers, "devices": list(stage.devices)}
              for stage in parse_plan_stages(obj["stages"], at.key("stages"))]
    predicted = obj.get("predicted")
    figures: dict[str, Any] = {}
    if predicted is not None:
        pa = at.key("predicted")
        po = _object(predicted, pa, ())
        for name in ("period_s", "throughput_sps"):
            if po.get(name) is not None:
                figures[name] = expect_number(po[name], pa.key(name))
        if "memory_ok" in po:
            if not isinstance(po["memory_ok"], bool):
                raise pa.key("memory_ok").fail("must be true or false", po["memory_ok"])
            figures["memory_ok"] = po["memory_ok"]
        figures["bottleneck"] = str(po.get("bottleneck") or "")
    planner_s = obj.get("planner_s")
    return PlanSummary(
        algorithm=algorithm, layout=stages_text(stages, labels or {}), stages=len(stages),
        planner_s=None if planner_s is None else expect_number(planner_s, at.key("planner_s")),
        chosen=chosen, **figures)


def load_plan_summary(path: str | Path, *, chosen: bool = False) -> PlanSummary:
    return plan_summary(read_json(path), file=str(path), chosen=chosen)


# --------------------------------------------------------------------------- metrics


def _finite(text: str, at: At) -> float:
    try:
        value = float(text)
    except ValueError:
        raise at.fail("must be a number", text) from None
    if not math.isfinite(value):
        raise at.fail("must be finite", text)
    return value


def parse_metrics_csv(text: str, *, file: str = "<input>") -> tuple[Metric, ...]:
    """The run page's metrics CSV (``at_s,kind,device,value``, one point a line)."""
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None)
    if header is None or tuple(h.strip() for h in header) != METRICS_HEADER:
        raise FormatError(f"line 1: must be the header {','.join(METRICS_HEADER)}", file=file,
                          value=None if header is None else ",".join(header))
    out = []
    for n, row in enumerate(rows, start=2):
        if not row:
            continue
        at = At(file, f"line {n}")
        if len(row) != len(METRICS_HEADER):
            raise at.fail(f"must have {len(METRICS_HEADER)} fields", ",".join(row))
        when, kind, device, value = row
        if not kind.strip():
            raise at.key("kind").fail("must not be empty", show_value=False)
        out.append(Metric(at=_finite(when, at.key("at_s")), kind=kind.strip(),
                          device=device.strip(), value=_finite(value, at.key("value"))))
    return tuple(out)


def load_metrics_csv(path: str | Path) -> tuple[Metric, ...]:
    return parse_metrics_csv(read_text(path), file=str(Path(path)))


# --------------------------------------------------------------------------- timeline trace


def _trace_metadata(events: Sequence[Any], at: At) -> tuple[dict[int, str], dict[int, str]]:
    """pid -> device id and pid -> label, from the trace's process_name metadata."""
    devices: dict[int, str] = {}
    labels: dict[int, str] = {}
    for i, raw in enumerate(events):
        if not (isinstance(raw, dict) and raw.get("ph") == "M"
                and raw.get("name") == "process_name"):
            continue
        ea = at.index(i)
        pid = expect_integer(raw.get("pid"), ea.key("pid"))
        args = raw.get("args")
        if not isinstance(args, dict) or not isinstance(args.get("name"), str):
            raise ea.key("args").fail("must name the process", show_value=False)
        name = args["name"]
        if pid == 0:
            continue  # the run's own process: run-wide faults and metrics
        uid = args.get("device")
        match = _LABELLED.match(name)
        if isinstance(uid, str) and uid:
            devices[pid] = uid
            labels[pid] = match.group("label") if match and match.group("uid") == uid else name
        elif match:
            devices[pid], labels[pid] = match.group("uid"), match.group("label")
        else:
            devices[pid] = labels[pid] = name
    return devices, labels


def _seconds(raw: Any, at: At) -> float:
    return expect_number(raw, at) / 1e6


def record_from_chrome_trace(raw: Mapping[str, Any], *, file: str) -> RunRecord:
    """A run from the run page's timeline trace (Chrome trace JSON: "X" events for timeline
    events, "i" for faults, "C" counters for metrics, process names for devices)."""
    at = At(file)
    events = expect_list(raw["traceEvents"], at.key("traceEvents"), nonempty=False)
    ea = at.key("traceEvents")
    other: dict[str, Any] = raw["otherData"] if isinstance(raw.get("otherData"), dict) else {}
    run: int = other["run"] if isinstance(other.get("run"), int) else 0
    pid_device, pid_label = _trace_metadata(events, ea)

    def device_of(pid: int) -> str:
        return pid_device.get(pid, f"process {pid}") if pid else ""

    timeline: list[TimelineEvent] = []
    faults: list[FaultEvent] = []
    metrics: list[Metric] = []
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise ea.index(i).fail("must be a JSON object", show_value=False)
        phase = e.get("ph")
        if phase not in ("X", "i", "C"):
            continue
        pid = expect_integer(e.get("pid"), ea.index(i).key("pid"))
        start = _seconds(e.get("ts"), ea.index(i).key("ts"))
        if phase == "X":
            if e.get("cat") not in EVENT_KINDS:
                continue  # not a timeline event of EdgePipe's
            args: dict[str, Any] = e["args"] if isinstance(e.get("args"), dict) else {}
            xa = ea.index(i).key("args")
            timeline.append(TimelineEvent(
                run=run, device=device_of(pid), kind=e["cat"],
                stage=expect_integer(args.get("stage", 0), xa.key("stage")),
                microbatch=expect_integer(args.get("microbatch", 0), xa.key("microbatch")),
                version=expect_integer(args.get("version", 0), xa.key("version")),
                start=start, end=start + _seconds(e.get("dur"), ea.index(i).key("dur")),
                bytes=expect_integer(args.get("bytes", 0), xa.key("bytes"))))
        elif phase == "i":
            detail: dict[str, Any] = e["args"] if isinstance(e.get("args"), dict) else {}
            faults.append(FaultEvent(run=run, at=start, device=device_of(pid) or None,
                                     kind=expect_string(e.get("name"), ea.index(i).key("name")),
                                     detail=detail))
        else:
            counter = e.get("args")
            if not isinstance(counter, dict) or not counter:
                raise ea.index(i).key("args").fail("must hold the counter's value",
                                                   show_value=False)
            for kind, value in counter.items():
                metrics.append(Metric(at=start, kind=str(kind), device=device_of(pid),
                                      value=expect_number(value, ea.index(i).key("args")
                                                          .key(str(kind)))))
    name = other.get("name")
    title = f"run {run}: {name}" if run and isinstance(name, str) else (
        f"run {run}" if run else Path(file).name)
    batch_size = other.get("batch_size")
    schedule = other.get("schedule")
    return RunRecord(
        title=title, events=tuple(timeline), faults=tuple(faults), metrics=tuple(metrics),
        schedule=schedule if isinstance(schedule, str) else "1f1b",
        devices=tuple(pid_device[p] for p in sorted(pid_device)),
        labels=MappingProxyType({pid_device[p]: pid_label[p] for p in pid_device}),
        batch_size=batch_size if isinstance(batch_size, int) and batch_size > 0 else None)


def timeline_events(raw: Any, *, file: str) -> tuple[TimelineEvent, ...]:
    """Timeline events JSON: a list of events, or an object whose ``events`` is one (what
    ``python -m orchestrator simulate`` prints)."""
    at = At(file)
    if isinstance(raw, dict):
        if "events" not in raw:
            raise at.fail("must be a Chrome trace (traceEvents) or timeline events (events)",
                          show_value=False)
        raw, at = raw["events"], at.key("events")
    items = expect_list(raw, at, nonempty=False)
    return tuple(parse_event(e, file=file, path=at.index(i).path) for i, e in enumerate(items))


def read_trace(raw: Any, *, file: str = "<input>") -> RunRecord:
    """A run from its timeline: the run page's Chrome trace, or timeline events JSON."""
    if isinstance(raw, dict) and "traceEvents" in raw:
        return record_from_chrome_trace(raw, file=file)
    return RunRecord(title=Path(file).name, events=timeline_events(raw, file=file))


def load_run_record(trace: str | Path, *, metrics: str | Path | None = None,
                    plans: Iterable[str | Path] = (), planned: str | Path | None = None,
                    title: str | None = None) -> RunRecord:
    """The record of the files a run page exports: its trace, and optionally its metrics CSV
    (instead of the trace's counters), its plans (the first is the run's own) and a planned
    timeline (shifted to begin at the run's first event, as the dashboard's ghosts are)."""
    raw = read_json(trace)
    record = read_trace(raw, file=str(trace))
    other = raw.get("otherData") if isinstance(raw, dict) else None
    with_schedule = isinstance(other, dict) and isinstance(other.get("schedule"), str)
    changes: dict[str, Any] = {"source": ", ".join(
        Path(p).name for p in (trace, metrics, *plans, planned) if p is not None)}
    if metrics is not None:
        changes["metrics"] = load_metrics_csv(metrics)
    if plans:
        summaries = []
        for k, path in enumerate(plans):
            document = read_json(path)
            summaries.append(plan_summary(document, file=str(path), labels=record.labels,
                                          chosen=k == 0))
            if k == 0 and not with_schedule and isinstance(document.get("schedule"), str):
                changes["schedule"] = document["schedule"]  # the run's, for its idle time
        changes["plans"] = tuple(summaries)
    if planned is not None:
        anchor = min((e.start for e in record.events), default=0.0)
        changes["planned"] = tuple(
            replace(e, start=e.start + anchor, end=e.end + anchor)
            for e in timeline_events(read_json(planned), file=str(planned)))
    if title:
        changes["title"] = title
    return replace(record, **changes)
