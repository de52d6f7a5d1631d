"""A helper's turns: what of its clients' tasks it runs at each segment of its schedule.

The split-learning schedule may preempt a task: a helper runs part of client j's forward,
then k's, then the rest of j's. A pass can be cut only between layers, so each segment of a
task becomes the run of consecutive layers of the client's part-2 whose share of the pass's
time is closest to the segment's share of the task's slots (a forward from its first layer
up, a backward from its last layer down). A segment too short for a layer of its own runs
with the next one; the reload slots a resumed segment starts with
(``switch_slots``) are not work. :func:`helper_turns` lists every turn of a helper in the
order of its segments' starts: the order an agent acting as that helper follows
(agent.turns).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.cost import CostModel
from orchestrator.runplan import RunPlan
from orchestrator.sl.formats import Instance, Schedule
from orchestrator.sl.runtime import HelperTask, helper_task_order


@dataclass(frozen=True)
class HelperTurn:
    """One turn of a helper: client ``client``'s ``kind`` pass over the model's layers
    ``layers`` (first, last; a backward runs them from the last down), at slot ``start``."""

    client: int
    kind: str
    layers: tuple[int, int]
    start: int


def task_layers(*, task: HelperTask, layers: tuple[int, int], layer_s: Sequence[float],
                switch_slots: int = 0) -> tuple[tuple[int, tuple[int, int]], ...]:
    """(segment index, (first, last) layers) for each part of ``task`` over part-2's
    ``layers``, in the order the helper runs them; ``layer_s`` holds the pass's time of each
    layer first..last."""
    first, last = layers
    count = last - first + 1
    if count < 1 or len(layer_s) != count:
        raise ValueError(f"layer_s: needs one time per layer {first}..{last}, got "
                         f"{len(layer_s)}")
    order = list(range(first, last + 1))
    weights = list(layer_s)
    if task.kind == "backward":
        order.reverse()
        weights.reverse()
    work = [max(0, (b - a) - (switch_slots if k else 0)) for k, (a, b) in enumerate(
        task.segments)]
    total_work, total_s = sum(work), sum(weights)
    if len(work) == 1 or total_work == 0:
        return ((0, (first, last)),)
    layer_at = [sum(weights[:c]) / total_s if total_s > 0 else c / count
                for c in range(count + 1)]  # the pass's share done after c layers
    parts = []
    done = 0  # layers run by the segments so far
    for k in range(len(work)):
        if k == len(work) - 1:
            cut = count
        else:
            share = sum(work[:k + 1]) / total_work
            cut = min(range(done, count + 1), key=lambda c: (abs(layer_at[c] - share), c))
        if cut > done:
            chunk = order[done:cut]
            parts.append((k, (min(chunk), max(chunk))))
            done = cut
    return tuple(parts)


def helper_turns(*, instance: Instance, schedule: Schedule, helper: int,
                 parts2: Sequence[tuple[int, int]], forward_s: Sequence[float],
                 backward_s: Sequence[float], switch_slots: int = 0) -> tuple[HelperTurn, ...]:
    """Every turn of ``helper`` under ``schedule``, in the order of their segments' starts.
    ``parts2[j]``: client j's part-2 layers; ``forward_s``/``backward_s``: the helper's time
    of each of the model's layers."""
    if len(parts2) != instance.clients:
        raise ValueError(f"parts2: needs one layer range per client ({instance.clients}), "
                         f"got {len(parts2)}")
    turns = []
    for task in helper_task_order(instance=instance, schedule=schedule, helper=helper):
        a, e = parts2[task.client]
        times = forward_s if task.kind == "forward" else backward_s
        for segment, layers in task_layers(task=task, layers=(a, e),
                                           layer_s=list(times[a:e + 1]),
                                           switch_slots=switch_slots):
            turns.append(HelperTurn(client=task.client, kind=task.kind, layers=layers,
                                    start=task.segments[segment][0]))
    return tuple(sorted(turns, key=lambda t: t.start))


def run_turns(*, cm: CostModel, instance: Instance, schedule: Schedule, run_plan: RunPlan,
              helpers: Sequence[str]) -> dict[str, tuple[tuple[int, str, int, int, int], ...]]:
    """Each helper's turns as its stage specs carry them, by device id: (client's pipeline,
    kind, that pipeline's micro-batches, first layer, last layer), a preempted task cut by
    the helper's own layer times in the cost model. ``run_plan`` is the schedule's
    (runtime.split_run_plan: pipeline j is client j's, stage 1 its part-2)."""
    parts2 = [plan.stages[1].layers for plan in run_plan.pipelines]
    out = {}
    for i, helper in enumerate(helpers):
        d = cm.index(helper)
        order = helper_turns(
            instance=instance, schedule=schedule, helper=i, parts2=parts2,
            forward_s=[float(t) for t in np.diff(cm.fwd_prefix[d])],
            backward_s=[float(t) for t in np.diff(cm.bwd_prefix[d])],
            switch_slots=schedule.switch_slots[i] if schedule.switch_slots else 0)
        if order:
            out[helper] = tuple((t.client, t.kind, run_plan.microbatches[t.client], *t.layers)
                                for t in order)
    return out
