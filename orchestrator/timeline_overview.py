"""A timeline downsampled for drawing: at most ``max_bars`` bars per device and lane over a span
of run time, so that a Gantt of a whole run (hundreds of thousands of events) draws as fast as
one of a minute, and still shows where each device was busy and where it idled.

The span is cut into ``max_bars`` equal bins. A device's events in one lane (the Gantt's
compute, sync and transfer lanes) are first joined where they overlap or touch; two busy
stretches are then merged into one bar when the gap between them lies inside one bin (too
short to see at this resolution), and kept apart when a bin boundary falls in the gap. Each
boundary separates at most one pair of bars, hence at most ``max_bars`` bars per lane; an
idle gap longer than a bin always shows. A bar keeps what it stands for: how many events it
merges, their busy time (the union of their intervals: ``busy_s`` over the bar's length is
how full it is), its kind (the kind with the most busy seconds) and its micro-batches.

No Django, no I/O: the dashboard's timeline API reads a run's events and calls
:func:`timeline_downsample`."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from orchestrator.events import EVENT_KINDS, TimelineEvent

# the lanes of a device's row on the Gantts (static/dashboard/js/charts.js draws the same)
LANES = {"forward": "compute", "backward": "compute", "update": "compute",
         "aggregate": "sync", "send": "comm", "recv": "comm", "replicate": "comm",
         "load": "comm"}
LANE_ORDER = ("compute", "sync", "comm")


@dataclass(frozen=True)
class Bar:
    """Events of one device and lane merged into one bar of the downsampled Gantt."""

    device: str
    lane: str
    kind: str  # the kind with the most busy seconds in the bar (ties: EVENT_KINDS order)
    start: float
    end: float
    count: int  # events merged into the bar
    busy_s: float  # the union of their intervals (within the span)
    first_microbatch: int
    last_microbatch: int

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "lane": self.lane, "kind": self.kind,
                "start": self.start, "end": self.end, "count": self.count,
                "busy_s": self.busy_s, "microbatches": [self.first_microbatch,
                                                         self.last_microbatch]}


@dataclass
class _Stretch:
    """Busy time being gathered into a bar."""

    start: float
    end: float
    busy_s: float
    count: int
    first_microbatch: int
    last_microbatch: int
    kinds: dict[str, float]

    def add(self, start: float, end: float, kind: str, microbatch: int) -> None:
        self.count += 1
        self.kinds[kind] = self.kinds.get(kind, 0.0) + (end - start)
        self.first_microbatch = min(self.first_microbatch, microbatch)
        self.last_microbatch = max(self.last_microbatch, microbatch)

    def absorb(self, other: _Stretch) -> None:
        self.end = max(self.end, other.end)
        self.busy_s += other.busy_s
        self.count += other.count
        self.first_microbatch = min(self.first_microbatch, other.first_microbatch)
        self.last_microbatch = max(self.last_microbatch, other.last_microbatch)
        for kind, seconds in other.kinds.items():
            self.kinds[kind] = self.kinds.get(kind, 0.0) + seconds

    def bar(self, device: str, lane: str) -> Bar:
        kind = max(self.kinds, key=lambda k: (self.kinds[k], -_KIND_RANK[k]))
        return Bar(device=device, lane=lane, kind=kind, start=self.start, end=self.end,
                   count=self.count, busy_s=self.busy_s,
                   first_microbatch=self.first_microbatch,
                   last_microbatch=self.last_microbatch)


_KIND_RANK = {kind: k for k, kind in enumerate(EVENT_KINDS)}


def _stretches(spans: list[tuple[float, float, str, int]]) -> list[_Stretch]:
    """Events (start, end, kind, micro-batch), sorted by start, joined where they overlap or
    touch: the lane's busy stretches."""
    out: list[_Stretch] = []
    for start, end, kind, microbatch in spans:
        last = out[-1] if out else None
        if last is not None and start <= last.end:
            if end > last.end:
                last.busy_s += end - last.end
                last.end = end
        else:
            last = _Stretch(start=start, end=end, busy_s=end - start, count=0,
                            first_microbatch=microbatch, last_microbatch=microbatch, kinds={})
            out.append(last)
        last.add(start, end, kind, microbatch)
    return out


def timeline_downsample(events: Iterable[TimelineEvent], *, start_s: float, end_s: float,
                        max_bars: int) -> list[Bar]:
    """The events that overlap [start_s, end_s] (clipped to it) as at most ``max_bars`` bars
    per device and lane, in (device, lane, start) order: busy stretches merged across the
    gaps that no bin boundary crosses (bins: ``max_bars`` equal parts of the span)."""
    if not (math.isfinite(start_s) and math.isfinite(end_s)) or end_s <= start_s:
        raise ValueError(f"end_s must be after start_s: [{start_s!r}, {end_s!r}]")
    if isinstance(max_bars, bool) or not isinstance(max_bars, int) or max_bars < 1:
        raise ValueError(f"max_bars must be an integer of at least 1, not {max_bars!r}")
    width = (end_s - start_s) / max_bars
    last_bin = max_bars - 1

    def first_bin(t: float) -> int:
        return min(last_bin, max(0, math.floor((t - start_s) / width)))

    def final_bin(t: float) -> int:  # the bin a stretch ending at t ends in
        return min(last_bin, max(0, math.ceil((t - start_s) / width) - 1))

    lanes: dict[tuple[str, str], list[tuple[float, float, str, int]]] = {}
    for e in events:
        if e.end < start_s or e.start > end_s:
            continue
        lane = LANES.get(e.kind, "comm")
        lanes.setdefault((e.device, lane), []).append(
            (max(e.start, start_s), min(e.end, end_s), e.kind, e.microbatch))
    bars: list[Bar] = []
    for device, lane in sorted(lanes, key=lambda k: (k[0], LANE_ORDER.index(k[1]))):
        spans = sorted(lanes[(device, lane)], key=lambda s: (s[0], s[1]))
        merged: list[_Stretch] = []
        ends_in = -1  # the bin the current bar ends in
        for stretch in _stretches(spans):
            if merged and first_bin(stretch.start) <= ends_in:
                merged[-1].absorb(stretch)
            else:
                merged.append(stretch)
            ends_in = max(final_bin(merged[-1].end), first_bin(merged[-1].start))
        bars.extend(s.bar(device, lane) for s in merged)
    return bars
