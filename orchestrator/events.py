"""Timeline and fault events (docs/architecture.md, "Timeline events"), and what is computed from
them: busy and idle time per device, and the breakdown of idle time by its cause.

The simulator emits these events for a planned pipeline, the agents emit them for the real one,
and the dashboard draws both; all three use the functions here, so a planned and a measured
Gantt are read the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.formats import synchronous
from orchestrator.validation import (
    At,
    expect_integer,
    expect_number,
    expect_object,
    expect_string,
)

EVENT_KINDS = ("forward", "backward", "send", "recv", "update", "replicate", "aggregate", "load")
COMPUTE_KINDS = ("forward", "backward", "update", "aggregate")
# what the idle gap before each compute kind waited for (idle_breakdown)
_WAITS_FOR = {"forward": "upstream", "backward": "downstream", "aggregate": "sync",
              "update": "sync"}
FAULT_KINDS = ("device_lost", "device_joined", "recovery_started", "repartitioned",
               "repartition_skipped", "weights_redistributed", "recovered", "run_started",
               "run_paused", "run_finished", "run_failed", "round_evaluated")


@dataclass(frozen=True, slots=True)  # slotted: a fifth less to build, per event
class TimelineEvent:
    run: int
    device: str
    stage: int
    kind: str
    microbatch: int
    version: int
    start: float
    end: float
    bytes: int = 0
    pipeline: int = 0  # which of the run's pipelines (written only when not 0)

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    def to_json(self) -> dict[str, Any]:
        out = {"run": self.run, "device": self.device, "stage": self.stage, "kind": self.kind,
               "microbatch": self.microbatch, "version": self.version, "start": self.start,
               "end": self.end, "bytes": self.bytes}
        if self.pipeline:
            out["pipeline"] = self.pipeline
        return out


@dataclass(frozen=True)
class FaultEvent:
    run: int
    at: float
    kind: str
    device: str | None = None
    detail: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run": self.run, "at": self.at, "kind": self.kind}
        if self.device is not None:
            out["device"] = self.device
        out["detail"] = dict(self.detail or {})
        return out


_EVENT_REQUIRED = ("run", "device", "stage", "kind", "microbatch", "version", "start", "end")
_EVENT_FIELDS = frozenset((*_EVENT_REQUIRED, "bytes", "pipeline"))


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _seconds(value: Any) -> bool:
    return type(value) in (int, float) and 0 <= value < math.inf


def parse_event(raw: Any, *, file: str = "<input>", path: str = "") -> TimelineEvent:
    """Validate one timeline event (as agents send them)."""
    # the common case, checked without building an error path per field (agents send
    # thousands a second; the slow path below names what is wrong)
    if (type(raw) is dict and _EVENT_FIELDS.issuperset(raw)
            and all(k in raw for k in _EVENT_REQUIRED)
            and raw["kind"] in EVENT_KINDS and type(raw["device"]) is str
            and raw["device"].strip()
            and all(_count(raw[k]) for k in ("run", "stage", "microbatch", "version"))
            and _count(raw.get("bytes", 0)) and _count(raw.get("pipeline", 0))
            and _seconds(raw["start"]) and _seconds(raw["end"]) and raw["end"] >= raw["start"]):
        return TimelineEvent(run=raw["run"], device=raw["device"], stage=raw["stage"],
                             kind=raw["kind"], microbatch=raw["microbatch"],
                             version=raw["version"], start=float(raw["start"]),
                             end=float(raw["end"]), bytes=raw.get("bytes", 0),
                             pipeline=raw.get("pipeline", 0))
    return _parse_event_strict(raw, At(file, path))


def _parse_event_strict(raw: Any, at: At) -> TimelineEvent:
    """:func:`parse_event` field by field, each failure naming its field."""
    obj = expect_object(raw, at, _EVENT_REQUIRED, ("bytes", "pipeline"))
    kind = obj["kind"]
    if kind not in EVENT_KINDS:
        raise at.key("kind").fail(f"must be one of {', '.join(EVENT_KINDS)}", kind)
    start = expect_number(obj["start"], at.key("start"))
    end = expect_number(obj["end"], at.key("end"))
    if end < start:
        raise at.key("end").fail(f"is before start ({start})", obj["end"])
    return TimelineEvent(
        run=expect_integer(obj["run"], at.key("run")),
        device=expect_string(obj["device"], at.key("device")),
        stage=expect_integer(obj["stage"], at.key("stage")),
        kind=kind,
        microbatch=expect_integer(obj["microbatch"], at.key("microbatch")),
        version=expect_integer(obj["version"], at.key("version")),
        start=start,
        end=end,
        bytes=expect_integer(obj.get("bytes", 0), at.key("bytes")),
        pipeline=expect_integer(obj.get("pipeline", 0), at.key("pipeline")),
    )


def parse_fault(raw: Any, *, file: str = "<input>", path: str = "") -> FaultEvent:
    at = At(file, path)
    obj = expect_object(raw, at, ("run", "at", "kind"), ("device", "detail"))
    kind = obj["kind"]
    if kind not in FAULT_KINDS:
        raise at.key("kind").fail(f"must be one of {', '.join(FAULT_KINDS)}", kind)
    detail = obj.get("detail") or {}
    if not isinstance(detail, dict):
        raise at.key("detail").fail("must be a JSON object", show_value=False)
    device = obj.get("device")
    return FaultEvent(run=expect_integer(obj["run"], at.key("run")),
                      at=expect_number(obj["at"], at.key("at")), kind=kind,
                      device=None if device is None else expect_string(device, at.key("device")),
                      detail=detail)


# --------------------------------------------------------------------------- idle time


@dataclass(frozen=True)
class IdleBreakdown:
    """A device's time over a window: busy, and idle split by what it was waiting for.

    ``upstream_s``: waiting for an activation from the previous stage (it is slower, or the link
    is); ``downstream_s``: waiting for a gradient from the next stage; ``sync_s``: waiting for
    the other replicas of its stage; ``bubble_s``: pipeline fill and drain, inherent to the
    schedule (before the first forward and the first backward of each weight version under
    GPipe, or of the run under 1F1B, and after the last operation).
    """

    busy_s: float
    upstream_s: float
    downstream_s: float
    sync_s: float
    bubble_s: float

    @property
    def idle_s(self) -> float:
        return self.upstream_s + self.downstream_s + self.sync_s + self.bubble_s

    def to_json(self) -> dict[str, float]:
        return {"busy_s": self.busy_s, "idle_s": self.idle_s, "upstream_s": self.upstream_s,
                "downstream_s": self.downstream_s, "sync_s": self.sync_s,
                "bubble_s": self.bubble_s}


def busy_intervals(events: Iterable[TimelineEvent]) -> list[tuple[float, float]]:
    """The union of compute intervals (forward, backward, update, aggregate), merged."""
    return _merged(sorted((e.start, e.end) for e in events if e.kind in COMPUTE_KINDS))


def _merged(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """``spans`` (sorted by start) merged where they overlap or touch."""
    merged: list[tuple[float, float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def idle_breakdown(events: Sequence[TimelineEvent], *, window: tuple[float, float],
                   schedule: str) -> IdleBreakdown:
    """Busy and idle time of one device's events over ``window``.

    Each idle gap is charged to the operation that ends it: a forward waits upstream, a
    backward downstream, an aggregate or an update for its replicas (an update waits only for
    the gradient another replica sends); the first forward and the first
    backward of a weight version (a synchronous schedule: GPipe, 1F1B-sync) or of the run
    (asynchronous 1F1B), and the time after the last
    operation, are the bubble.
    """
    lo, hi = window
    compute = sorted((e for e in events if e.kind in COMPUTE_KINDS), key=lambda e: e.start)
    busy = [(max(s, lo), min(e, hi)) for s, e in _merged((e.start, e.end) for e in compute)
            if e > lo and s < hi]
    by_version = synchronous(schedule)
    seen_first: set[tuple[str, int]] = set()
    reason_at: dict[float, str] = {}
    for e in compute:
        reason = _WAITS_FOR[e.kind]
        if e.kind in ("forward", "backward"):
            key = (e.kind, e.version if by_version else 0)
            if key not in seen_first:
                seen_first.add(key)
                reason = "bubble"
        reason_at.setdefault(e.start, reason)
    totals = {"upstream": 0.0, "downstream": 0.0, "sync": 0.0, "bubble": 0.0}
    cursor = lo
    for start, end in busy:
        if start > cursor:
            totals[reason_at.get(start, "bubble")] += start - cursor
        cursor = max(cursor, end)
    if hi > cursor:
        totals["bubble"] += hi - cursor
    return IdleBreakdown(busy_s=sum(e - s for s, e in busy), upstream_s=totals["upstream"],
                         downstream_s=totals["downstream"], sync_s=totals["sync"],
                         bubble_s=totals["bubble"])


def steady_throughput_sps(events: Sequence[TimelineEvent], *, samples_per_microbatch: int,
                          skip: float = 0.2) -> float:
    """Samples per second through the pipeline once it is full: the last stage's backward
    completions, leaving out the first and last ``skip`` of them (fill and drain). 0 when
    there are too few to tell."""
    if not 0 <= skip < 0.5:
        raise ValueError(f"skip must be in [0, 0.5), got {skip}")
    last = max((e.stage for e in events if e.kind == "backward"), default=None)
    if last is None:
        return 0.0
    ends = sorted(e.end for e in events if e.kind == "backward" and e.stage == last)
    first, final = int(len(ends) * skip), len(ends) - 1 - int(len(ends) * skip)
    if final - first < 2 or ends[final] <= ends[first]:
        return 0.0
    return (final - first) * samples_per_microbatch / (ends[final] - ends[first])
