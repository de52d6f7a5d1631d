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
from orchestrator.formats import SCHEDULES, synchronous
from orchestrator.planformat import Bound, Plan, Stage, freeze_beta

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
    predicted = evaluate(cm, stages, beta=frozen, schedule=schedule)
    inflight = choose_inflight(cm, stages, predicted, beta=frozen)
    windows = replica_inflight(cm, stages, predicted, inflight, beta=frozen)
    lag = choose_lag(cm, stages, predicted, inflight, beta=frozen)
    return Plan(algorithm=algorithm, schedule=schedule, microbatches=microbatches, stages=stages,
                beta=frozen, predicted=predicted, planner_s=time.perf_counter() - started,
                bound=bound, inflight=inflight,
                notes=(*notes, *staleness_notes(stages, inflight, lag, schedule)), lag=lag,
                replica_inflight=MappingProxyType(windows) if windows else None)


def staleness_notes(stages: Sequence[Stage], inflight: Sequence[int],
                    lag: Sequence[int] | None, schedule: str) -> list[str]:
    """Under asynchronous 1F1B a replicated stage forwards its micro-batches ``lag`` behind
    (every replica applies every update, and waits for none of them): say so where that is
    staler than the first stage's own depth, which a single device would need anyway. At a
    high learning rate such staleness slows or stops training (the MLP on digits at lr 0.1
    did not learn with its forwards 11 behind: loss 2.1 after 1,200 micro-batches, against
    0.02 with 1)."""
    if lag is None or synchronous(schedule):
        return []
    stale = [(k, g) for k, (g, stage) in enumerate(zip(lag, stages, strict=True))
             if len(stage.devices) > 1 and g > inflight[0]]
    return [f"stage {k}'s replicas forward each micro-batch on weights {g} updates old "
            "(asynchronous 1F1B: every replica applies every update, waiting for none): a "
            "high learning rate may need lowering; under 1f1b-sync or gpipe the "
            "replicas train synchronously" for k, g in stale]
