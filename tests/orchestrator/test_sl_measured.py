"""A split run's figures from what it recorded (orchestrator.sl.measured): each batch's span
over the clients, each round's time per batch, each round's training figures."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.sl.measured import batch_spans, round_metrics, split_figures


def _event(kind: str, pipeline: int, m: int, start: float, end: float, *, stage: int = 0,
           device: str = "") -> dict[str, Any]:
    return {"kind": kind, "pipeline": pipeline, "microbatch": m, "start": start, "end": end,
            "stage": stage, "device": device or f"c{pipeline}"}


def test_a_batchs_makespan_spans_every_client_and_the_first_batch_is_left_out() -> None:
    recorded = [
        _event("forward", 0, 0, 0.0, 0.1), _event("backward", 0, 0, 0.3, 0.9),  # warm-up: 0.9
        _event("forward", 1, 0, 0.05, 0.1), _event("backward", 1, 0, 0.2, 0.4),
        _event("forward", 0, 1, 1.0, 1.1), _event("backward", 0, 1, 1.2, 1.3),  # 1.0 .. 1.5
        _event("forward", 1, 1, 1.1, 1.2), _event("backward", 1, 1, 1.4, 1.5),
        _event("forward", 0, 2, 2.0, 2.1), _event("backward", 0, 2, 2.2, 2.3),  # 2.0 .. 2.3
        _event("forward", 1, 2, 2.0, 2.1), _event("backward", 1, 2, 2.2, 2.3),
        _event("forward", 0, 3, 3.0, 3.1), _event("backward", 0, 3, 3.2, 3.3),  # client 1 lacks
        _event("forward", 0, 1, 1.0, 1.05, stage=1, device="h"),  # the helper's: not part-1
    ]
    figures = split_figures(events=recorded, metrics=[], pipelines=2, batches_per_round=3,
                            rounds=1, planned_makespan_s=0.2)
    assert figures["batches_trained"] == 3
    assert figures["makespan_measured_s"] == pytest.approx(0.4)  # median of 0.5 and 0.3
    assert figures["makespan_ratio"] == pytest.approx(2.0)
    assert figures["round_batch_s"] == pytest.approx(2.3 / 3)  # one complete round: 0 .. 2.3
    assert figures["round_batch_ratio"] == pytest.approx(2.3 / 3 / 0.2)
    nothing = split_figures(events=[], metrics=[], pipelines=2, batches_per_round=3, rounds=1,
                            planned_makespan_s=0.0)
    assert (nothing["makespan_measured_s"], nothing["makespan_ratio"],
            nothing["makespan_planned_s"]) == (None, None, None)


def test_points_go_to_the_round_before_their_devices_next_aggregate() -> None:
    # client c0 aggregates at 1.0 and 3.0; c1, whose link is slower, at 1.5 and 3.5
    recorded = [_event("aggregate", j, m, at, at + 0.2, stage=s)
                for j, ats in ((0, (1.0, 3.0)), (1, (1.5, 3.5))) for s in (0, 2)
                for m, at in zip((1, 3), ats, strict=True)]
    points = [{"at": at, "kind": kind, "device": device, "value": value}
              for device, at, loss in (("c0", 0.5, 2.0), ("c0", 0.9, 1.8), ("c1", 1.2, 1.6),
                                       ("c0", 1.3, 1.0), ("c1", 1.9, 0.8), ("c1", 3.4, 0.6))
              for kind, value in (("loss", loss), ("accuracy", loss / 4))]
    points.append({"at": 0.1, "kind": "cpu_pct", "device": "c0", "value": 50.0})
    rows = round_metrics(events=recorded, metrics=points, batches_per_round=2, rounds=2)
    assert [(r["round"], r["points"]) for r in rows] == [(0, 3), (1, 3)]
    assert rows[0]["loss"] == pytest.approx((2.0 + 1.8 + 1.6) / 3)
    assert rows[1]["loss"] == pytest.approx((1.0 + 0.8 + 0.6) / 3)
    assert rows[1]["accuracy"] == pytest.approx((1.0 + 0.8 + 0.6) / 12)
    # a device with no aggregate of its own goes by the run's earliest; a point that names
    # its micro-batch by it
    other = round_metrics(events=recorded, metrics=[
        {"at": 1.2, "kind": "loss", "device": "x", "value": 1.0},
        {"at": 0.2, "kind": "loss", "device": "c0", "value": 3.0, "microbatch": 3}],
        batches_per_round=2, rounds=3)
    assert [r["points"] for r in other] == [0, 2, 0] and other[2]["loss"] is None


def test_after_a_recovery_a_batch_spans_the_clients_that_began_it() -> None:
    # batch 0 by two clients, batch 1 by the one left after the other was lost
    recorded = [_event("forward", 0, 0, 0.0, 0.1), _event("backward", 0, 0, 0.3, 0.4),
                _event("forward", 1, 0, 0.0, 0.1), _event("backward", 1, 0, 0.3, 0.6),
                _event("forward", 0, 1, 1.0, 1.1), _event("backward", 0, 1, 1.2, 1.3),
                _event("forward", 0, 2, 2.0, 2.1)]  # under way: not a span yet
    assert batch_spans(recorded, pipelines=None) == {0: (0.0, 0.6), 1: (1.0, 1.3)}
    assert batch_spans(recorded, pipelines=2) == {0: (0.0, 0.6)}
    assert batch_spans(recorded, pipelines=1) == {0: (0.0, 0.6), 1: (1.0, 1.3)}


def test_a_recovery_that_renumbers_a_clients_pipeline_keeps_its_rounds() -> None:
    # c0 is pipeline 2 in the first generation (round 0 ends at batch 1) and pipeline 1 after
    # a recovery (rounds 1 and 2 end at batches 3 and 5): its boundaries are 1.0, 3.0, 5.0
    recorded = [_event("aggregate", 2, 1, 1.0, 1.1, device="c0"),
                _event("aggregate", 1, 3, 3.0, 3.1, device="c0"),
                _event("aggregate", 1, 5, 5.0, 5.1, device="c0")]
    points = [{"at": at, "kind": "loss", "device": "c0", "value": 1.0}
              for at in (0.5, 2.0, 2.5, 4.0, 4.5)]
    rows = round_metrics(events=recorded, metrics=points, batches_per_round=2, rounds=3)
    assert [r["points"] for r in rows] == [1, 2, 2]
