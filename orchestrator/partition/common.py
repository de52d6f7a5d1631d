"""What every pipeline planner shares: turning index-based stages into a :class:`Plan` whose
``predicted`` comes from the cost model."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from orchestrator.cost import (
    CostModel,
    choose_inflight,
    choose_lag,
    evaluate,
    replica_inflight,
)
from orchestrator.formats import SCHEDULES, Bound, Plan, Stage, freeze_beta

# A stage as planners build it: (first layer, last layer, device indices).
RawStage = tuple[int, int, tuple[int, ...]]


def to_stages(cm: CostModel, raw: Sequence[RawStage]) -> tuple[Stage, ...]:
    ids = cm.devices.ids
    return tuple(Stage(layers=(a, e), devices=tuple(ids[d] for d in group))
                 for a, e, group in raw)


def check_plan_options(*, schedule: str, microbatches: int) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches must be a positive integer, got {microbatches!r}")


def finish_plan(cm: CostModel, raw: Sequence[RawStage], *, algorithm: str, schedule: str,
                microbatches: int, started: float,
                beta: Mapping[str, Mapping[str, float]] | None = None,
                bound: Bound | None = None, notes: Sequence[str] = ()) -> Plan:
    """A plan for ``raw`` with the cost model's prediction and the time since ``started``."""
    stages = to_stages(cm, raw)
    frozen = None if beta is None else freeze_beta(beta)
    predicted = evaluate(cm, stages, beta=frozen)
    inflight = choose_inflight(cm, stages, predicted, beta=frozen)
    windows = replica_inflight(cm, stages, predicted, inflight, beta=frozen)
    return Plan(algorithm=algorithm, schedule=schedule, microbatches=microbatches, stages=stages,
                beta=frozen, predicted=predicted, planner_s=time.perf_counter() - started,
                bound=bound, inflight=inflight, notes=tuple(notes),
                lag=choose_lag(cm, stages, predicted, inflight, beta=frozen),
                replica_inflight=MappingProxyType(windows) if windows else None)
