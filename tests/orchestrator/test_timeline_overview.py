"""The downsampled timeline against a brute-force reading of small timelines: bars that cover
every event and nothing a bin boundary separates from it, at most max_bars per device and lane,
with the count, busy time, kind and micro-batches of the events they merge."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.events import EVENT_KINDS, TimelineEvent
from orchestrator.timeline_overview import LANES, Bar, timeline_downsample


def event(device: str, kind: str, start: float, end: float, microbatch: int = 0
          ) -> TimelineEvent:
    return TimelineEvent(run=1, device=device, stage=0, kind=kind, microbatch=microbatch,
                         version=0, start=start, end=end)


def union_length(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """The length of the union of ``intervals`` within [lo, hi], by elementary segments."""
    cuts = sorted({lo, hi, *(t for iv in intervals for t in iv if lo < t < hi)})
    return sum(b - a for a, b in pairwise(cuts)
               if any(s <= a and b <= e for s, e in intervals))


def reference(events: list[TimelineEvent], start_s: float, end_s: float, max_bars: int
              ) -> list[Bar]:
    """The bars read the slow way: for each device and lane, the clipped events' busy points
    joined into stretches (any two events that overlap or touch, transitively), then
    neighbouring stretches joined unless a bin boundary lies in the gap between them (the
    boundary a stretch ends on counts as in the gap after it)."""
    width = (end_s - start_s) / max_bars
    boundaries = [start_s + k * width for k in range(1, max_bars)]
    out: list[Bar] = []
    keys = sorted({(e.device, LANES[e.kind]) for e in events
                   if not (e.end < start_s or e.start > end_s)},
                  key=lambda k: (k[0], ("compute", "sync", "comm").index(k[1])))
    for device, lane in keys:
        mine = [(max(e.start, start_s), min(e.end, end_s), e) for e in events
                if e.device == device and LANES[e.kind] == lane
                and not (e.end < start_s or e.start > end_s)]
        # groups: the connected components of "overlap or touch, or a gap no boundary is in"
        groups: list[list[tuple[float, float, TimelineEvent]]] = [[m] for m in mine]
        joined = True
        while joined:
            joined = False
            for i in range(len(groups)):
                for j in range(i + 1, len(groups)):
                    a_lo = min(s for s, _, _ in groups[i])
                    a_hi = max(e for _, e, _ in groups[i])
                    b_lo = min(s for s, _, _ in groups[j])
                    b_hi = max(e for _, e, _ in groups[j])
                    (e_lo, e_hi), (l_lo, _) = sorted([(a_lo, a_hi), (b_lo, b_hi)])
                    # the bins, counted by boundaries: a stretch starts in the bin after the
                    # boundaries at or before its start, ends in the one after those before
                    # its end (a point on a boundary: in the bin after it)
                    ends_in = max(sum(b < e_hi for b in boundaries),
                                  sum(b <= e_lo for b in boundaries))
                    if l_lo <= e_hi or sum(b <= l_lo for b in boundaries) <= ends_in:
                        groups[i].extend(groups.pop(j))
                        joined = True
                        break
                if joined:
                    break
        for g in sorted(groups, key=lambda g: min(s for s, _, _ in g)):
            lo, hi = min(s for s, _, _ in g), max(e for _, e, _ in g)
            seconds = {k: sum(e - s for s, e, ev in g if ev.kind == k)
                       for k in {ev.kind for _, _, ev in g}}
            kind = max(seconds, key=lambda k: (seconds[k], -EVENT_KINDS.index(k)))
            out.append(Bar(device=device, lane=lane, kind=kind, start=lo, end=hi, count=len(g),
                           busy_s=union_length([(s, e) for s, e, _ in g], lo, hi),
                           first_microbatch=min(ev.microbatch for _, _, ev in g),
                           last_microbatch=max(ev.microbatch for _, _, ev in g)))
    return out


# times on a grid of whole seconds and bins of whole seconds: float division is exact there,
# so the brute force and the function agree on which side of a boundary a time is
events_strategy = st.lists(
    st.builds(lambda device, kind, start, length, mb: event(device, kind, float(start),
                                                           float(start + length), mb),
              st.sampled_from(["a", "b"]), st.sampled_from(EVENT_KINDS),
              st.integers(-3, 40), st.integers(0, 6), st.integers(0, 9)),
    max_size=14)


@settings(max_examples=300, deadline=None)
@given(events=events_strategy, start=st.integers(-2, 10), bins=st.integers(1, 9),
       width=st.integers(1, 4))
def test_downsampling_agrees_with_a_brute_force_reading(events: list[TimelineEvent],
                                                        start: int, bins: int,
                                                        width: int) -> None:
    start_s, end_s = float(start), float(start + bins * width)
    bars = timeline_downsample(events, start_s=start_s, end_s=end_s, max_bars=bins)
    expected = reference(events, start_s, end_s, bins)
    assert [(b.device, b.lane, b.kind, b.start, b.end, b.count, b.first_microbatch,
             b.last_microbatch) for b in bars] == [
        (b.device, b.lane, b.kind, b.start, b.end, b.count, b.first_microbatch,
         b.last_microbatch) for b in expected]
    for got, want in zip(bars, expected, strict=True):
        assert math.isclose(got.busy_s, want.busy_s, abs_tol=1e-9)
    for key in {(b.device, b.lane) for b in bars}:
        assert sum(1 for b in bars if (b.device, b.lane) == key) <= bins


def test_a_long_run_keeps_its_idle_gaps_and_at_most_max_bars_per_lane() -> None:
    # 10,000 forwards of 0.01 s every 0.02 s, then 100 s idle, then more: at 50 bars over
    # 400 s (8 s a bin) the busy stretch reads as a few full bars, the idle gap stays a gap
    busy = [event("a", "forward", 0.02 * k, 0.02 * k + 0.01, k) for k in range(10_000)]
    later = [event("a", "forward", 300.0 + k, 300.5 + k, 10_000 + k) for k in range(100)]
    bars = timeline_downsample(busy + later, start_s=0.0, end_s=400.0, max_bars=50)
    assert len(bars) <= 50
    assert sum(b.count for b in bars) == 10_100
    assert not any(200.0 < b.start < 300.0 or 200.0 < b.end < 300.0 for b in bars)
    first = [b for b in bars if b.end <= 200.0]
    assert first[0].start == 0.0 and math.isclose(first[-1].end, 199.99)
    assert math.isclose(sum(b.busy_s for b in first), 100.0)  # half of the time busy
    assert (first[0].first_microbatch, first[-1].last_microbatch) == (0, 9_999)


def test_few_events_come_back_one_bar_each() -> None:
    events = [event("a", "forward", 1.0, 2.0, 1), event("a", "backward", 5.0, 6.5, 1),
              event("a", "send", 2.0, 2.5, 1), event("b", "recv", 2.1, 2.6, 1)]
    bars = timeline_downsample(events, start_s=0.0, end_s=10.0, max_bars=100)
    assert [(b.device, b.lane, b.kind, b.start, b.end, b.count) for b in bars] == [
        ("a", "compute", "forward", 1.0, 2.0, 1), ("a", "compute", "backward", 5.0, 6.5, 1),
        ("a", "comm", "send", 2.0, 2.5, 1), ("b", "comm", "recv", 2.1, 2.6, 1)]


def test_events_are_clipped_to_the_span_and_those_outside_it_left_out() -> None:
    events = [event("a", "forward", 0.0, 4.0), event("a", "forward", 9.0, 12.0),
              event("a", "forward", 20.0, 21.0)]
    bars = timeline_downsample(events, start_s=2.0, end_s=10.0, max_bars=8)
    assert [(b.start, b.end, b.busy_s, b.count) for b in bars] == [(2.0, 4.0, 2.0, 1),
                                                                   (9.0, 10.0, 1.0, 1)]


@pytest.mark.parametrize(("start_s", "end_s", "max_bars", "message"), [
    (5.0, 5.0, 10, "end_s must be after start_s"),
    (5.0, 1.0, 10, "end_s must be after start_s"),
    (0.0, math.inf, 10, "end_s must be after start_s"),
    (0.0, 1.0, 0, "max_bars must be an integer of at least 1, not 0"),
    (0.0, 1.0, True, "max_bars must be an integer of at least 1, not True"),
])
def test_a_bad_span_or_bar_count_is_named(start_s: float, end_s: float, max_bars: int,
                                          message: str) -> None:
    with pytest.raises(ValueError, match=message):
        timeline_downsample([], start_s=start_s, end_s=end_s, max_bars=max_bars)
