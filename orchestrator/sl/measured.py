"""A split run's figures from what it recorded (timeline events and metric points as
mappings): each round's training loss and accuracy, and the measured batch makespan against
the plan's.

- **Rounds.** The clients' part-3 report a ``loss`` and an ``accuracy`` point per batch. A
  point that names its micro-batch is in round ``microbatch // batches_per_round``. The
  server stores none with its micro-batch, so a point goes by its time instead: a round ends
  with an ``aggregate`` event (FedAvg) on every stage of every pipeline, and a client's
  point is in round r when it comes after r of its own device's aggregates began (a part-3's
  loss of the round's last batch comes before its FedAvg, the next round's first after it).
  A point of a device without aggregate events goes by the run's: the k-th boundary is the
  earliest start of any stage's k-th aggregate. A round's figure is the mean of its points.
- **Batch makespan**, as the paper's and bench/split_runtime.py's: batch m runs from the
  earliest start of a client's part-1 (stage 0) forward of m to the latest end of a client's
  part-1 backward of m, over every client (pipeline). The measured figure is the median
  over the batches after the first (the first pays for warming up); planned is the plan's
  ``makespan_s``. The agents release each batch to every client at once (a stage spec's
  ``batch_sync``), as the paper's model does. A second figure: each round's time (from its
  first part-1 forward to its last part-1 backward, over every client) over its batches, the
  median over the rounds (the first included: a round's first batch only warms it up): the
  pace, with the barrier's own cost in it.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

ROUND_METRICS = ("loss", "accuracy")


def _aggregate_starts(events: Sequence[Mapping[str, Any]], batches_per_round: int
                      ) -> tuple[dict[str, list[float]], list[float]]:
    """Round boundaries, by the round each aggregate ends (its micro-batch): per device, the
    earliest start of its stages' aggregates of round k; and the run's, the earliest over
    every stage's. By the micro-batch, not by the count: after a recovery a client's
    pipeline has another number, and an interrupted round has no aggregate."""
    per_round: dict[str, dict[int, float]] = defaultdict(dict)
    everyone: dict[int, float] = {}
    for e in events:
        if e["kind"] != "aggregate":
            continue
        k = (int(e["microbatch"]) + 1) // max(1, batches_per_round) - 1
        for target in (per_round[e["device"]], everyone):
            target[k] = min(target.get(k, math.inf), e["start"])
    return ({device: [rounds[k] for k in sorted(rounds)] for device, rounds in per_round.items()},
            [everyone[k] for k in sorted(everyone)])


def round_metrics(*, events: Sequence[Mapping[str, Any]],
                  metrics: Iterable[Mapping[str, Any]], batches_per_round: int,
                  rounds: int) -> list[dict[str, Any]]:
    """Each round's mean ``loss`` and ``accuracy`` over its batches' points, and how many
    points each mean is of ({round, points, loss, accuracy}; rounds from 0, the figures None
    for a round with no point). ``events``: timeline events (device, stage, pipeline, kind,
    start); ``metrics``: points (at, kind, device, value; microbatch when known)."""
    per_device, everyone = _aggregate_starts(events, batches_per_round)
    sums: dict[tuple[int, str], list[float]] = defaultdict(list)
    for p in metrics:
        if p["kind"] not in ROUND_METRICS or not math.isfinite(p["value"]):
            continue
        if p.get("microbatch") is not None:
            r = int(p["microbatch"]) // max(1, batches_per_round)
        else:
            r = bisect.bisect_right(per_device.get(p.get("device") or "", everyone), p["at"])
        if 0 <= r < rounds:
            sums[(r, p["kind"])].append(float(p["value"]))
    out = []
    for r in range(rounds):
        row: dict[str, Any] = {"round": r, "points": len(sums[(r, "loss")])}
        for kind in ROUND_METRICS:
            values = sums[(r, kind)]
            row[kind] = sum(values) / len(values) if values else None
        out.append(row)
    return out


def batch_spans(events: Iterable[Mapping[str, Any]], *, pipelines: int | None
                ) -> dict[int, tuple[float, float]]:
    """Each batch's span (start, end; its makespan is end - start), for the batches at least
    ``pipelines`` clients (any number with None) forwarded on their part-1 (stage 0) and
    every one of them backwarded (after a recovery, fewer clients train a batch)."""
    starts: dict[int, dict[int, float]] = defaultdict(dict)
    ends: dict[int, dict[int, float]] = defaultdict(dict)
    for e in events:
        if e["stage"] != 0 or e["kind"] not in ("forward", "backward"):
            continue
        j, m = e.get("pipeline", 0), e["microbatch"]
        if e["kind"] == "forward":
            starts[m][j] = min(starts[m].get(j, math.inf), e["start"])
        else:
            ends[m][j] = max(ends[m].get(j, -math.inf), e["end"])
    return {m: (min(starts[m].values()), max(ends[m].values())) for m in sorted(starts)
            if set(ends.get(m, {})) >= set(starts[m])
            and len(starts[m]) >= (pipelines or 0)}


def round_batch_s(spans_by_batch: Mapping[int, tuple[float, float]], *,
                  batches_per_round: int) -> list[float]:
    """Each complete round's time per batch: from the earliest start to the latest end of its
    batches' spans ({batch: (start, end)}), over its ``batches_per_round`` batches."""
    rounds: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for m, span in spans_by_batch.items():
        rounds[m // max(1, batches_per_round)].append(span)
    return [(max(e for _, e in spans) - min(s for s, _ in spans)) / batches_per_round
            for _, spans in sorted(rounds.items()) if len(spans) == batches_per_round]


def split_figures(*, events: Sequence[Mapping[str, Any]],
                  metrics: Iterable[Mapping[str, Any]], pipelines: int | None,
                  batches_per_round: int, rounds: int,
                  planned_makespan_s: float | None) -> dict[str, Any]:
    """The summary's split figures: ``rounds`` (round_metrics), ``batches_trained`` (batches
    every client trained on its part-1), ``makespan_measured_s`` (the median batch makespan
    after the first batch; the first's when it is the only one; None without any),
    ``makespan_planned_s``, ``makespan_ratio`` (measured / planned), ``round_batch_s`` (the
    median of round_batch_s) and ``round_batch_ratio`` (it / planned); a ratio is None
    unless both of its figures are positive."""
    spans = batch_spans(events, pipelines=pipelines)
    makespans = {m: end - start for m, (start, end) in spans.items()}
    after_first = [span for m, span in makespans.items() if m > 0] or list(makespans.values())
    measured = statistics.median(after_first) if after_first else None
    per_round = round_batch_s(spans, batches_per_round=batches_per_round)
    by_rounds = statistics.median(per_round) if per_round else None
    planned = planned_makespan_s if planned_makespan_s and planned_makespan_s > 0 else None
    return {"rounds": round_metrics(events=events, metrics=metrics,
                                    batches_per_round=batches_per_round, rounds=rounds),
            "batches_trained": len(spans),
            "makespan_measured_s": measured, "makespan_planned_s": planned,
            "makespan_ratio": _ratio(measured, planned),
            "round_batch_s": by_rounds, "round_batch_ratio": _ratio(by_rounds, planned)}


def _ratio(measured: float | None, planned: float | None) -> float | None:
    return measured / planned if measured and planned else None
