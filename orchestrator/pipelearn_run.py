"""PipeLearn, SFL and FL as runs agents train (docs/architecture.md, "PipeLearn trained").

Zhang et al., "PipeLearn" (Section IV): each device keeps its data and trains layers
``[0, P)``; the server trains a copy of ``[P, L)`` per device, the copies in parallel. One
iteration splits a batch of B samples into N micro-batches of ``B // N`` (the authors'
rounding): the device runs the N forwards back to back, each activation goes up as soon as it
is ready, the server runs each micro-batch's forward and backward as it arrives, each gradient
comes down, and the device runs the N backwards once its forwards are done; then both sides
update. That is a two-stage pipeline with N micro-batches a batch, one per device, whose
server stages share the server (orchestrator.runplan), under 1F1B-sync with N micro-batches
in flight on the device and one on the server: the device's 1F1B window of N is every
forward, then every backward, and the server's of one is each micro-batch's forward then its
backward, as it arrives (Table I). Under GPipe the server ran every forward before the first
backward, so no gradient came down before the last activation went up: on a link-bound
device that was a third of the iteration. SFL is the same with
N = 1; FL one stage, the whole model, on the device. At the end of each epoch the devices'
models and the server's copies are averaged (FedAvg, weighted by samples): the run plan's
aggregation groups, one per distinct layer range of each side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from orchestrator.pipelearn import iteration_time, parallel_batches, stage_times
from orchestrator.pipelearn_plan import MethodPlan, Setting
from orchestrator.planformat import Plan, Stage
from orchestrator.runplan import AggregationGroup, RunPlan

SCHEDULE = "1f1b-sync"  # with the depths of pipeline_depths: PipeLearn's iteration


@dataclass(frozen=True)
class PipelearnRun:
    """A method's run plan (pipeline j is ``clients[j]``'s) and each pipeline's micro-batch
    size, ``B // N``."""

    method: str
    server: str
    clients: tuple[str, ...]
    run_plan: RunPlan
    microbatch_sizes: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "server": self.server, "clients": list(self.clients),
                "run_plan": self.run_plan.to_json(),
                "microbatch_sizes": list(self.microbatch_sizes)}


def common_split(setting: Setting, *, method: str) -> dict[str, tuple[int, int]]:
    """One split point P for every device (each its own N by PipeLearn's rule, 1 under SFL):
    the P whose slowest device's iteration is the shortest. A deviation from the paper,
    which lets each device choose its P: with one P every device's part and every server
    copy hold the same layers, so each epoch's FedAvg averages whole models (with per-device
    P a device alone with its P was never averaged)."""
    cm = setting.cm
    best: tuple[float, dict[str, tuple[int, int]]] | None = None
    for p in range(1, cm.num_layers):
        choices, worst = {}, 0.0
        for device in setting.clients:
            stages = stage_times(cm=cm, device=device, server=setting.server, split=p,
                                 batch_size=setting.batch_size, slowdown=setting.slowdown)
            n = 1 if method == "sfl" else parallel_batches(stages=stages,
                                                            batch_size=setting.batch_size)
            choices[device] = (p, n)
            worst = max(worst, iteration_time(stages=stages, parallel_batches=n))
        if best is None or worst < best[0]:
            best = (worst, choices)
    return {} if best is None else best[1]


def pipeline_depths(num_stages: int, parallel_batches: int) -> tuple[int, ...]:
    """Micro-batches in flight on each stage of a device's pipeline under :data:`SCHEDULE`:
    all N on the device (every forward, then every backward), one on the server (each
    micro-batch's backward right after its forward)."""
    return (parallel_batches,) if num_stages == 1 else (parallel_batches, 1)


def server_memory_need_bytes(plan: MethodPlan) -> float:
    """The memory the server needs for every client's copy of layers ``[P, L)`` (the cost
    model's count for the last of two stages: one stashed version of its weights and
    activations, the weights and their gradients)."""
    cm = plan.setting.cm
    return sum(cm.memory_need_bytes(d.split, cm.num_layers - 1, 1, 2)
               for d in plan.devices if d.split < cm.num_layers)


def pipelearn_run_plan(plan: MethodPlan, *, batches: int, epochs: int) -> PipelearnRun:
    """The run agents train under ``plan``: ``epochs`` epochs of ``batches`` iterations of
    every client. ValueError naming the field when a count is not a positive integer."""
    for name, value in (("batches", batches), ("epochs", epochs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    setting = plan.setting
    layers = setting.cm.num_layers
    pipelines, sizes, per_epoch, samples = [], [], [], []
    for d in plan.devices:
        if not 1 <= d.split <= layers:
            raise ValueError(f"split: {d.device}'s split {d.split} is outside 1..{layers}")
        if d.parallel_batches < 1:
            raise ValueError(f"parallel_batches: {d.device}'s N must be at least 1, got "
                             f"{d.parallel_batches}")
        stages = ((Stage((0, layers - 1), (d.device,)),) if d.split == layers else
                  (Stage((0, d.split - 1), (d.device,)),
                   Stage((d.split, layers - 1), (setting.server,))))
        pipelines.append(Plan(algorithm=f"pipelearn-{plan.method}", schedule=SCHEDULE,
                              microbatches=d.parallel_batches, stages=stages,
                              inflight=pipeline_depths(len(stages), d.parallel_batches)))
        size = max(1, setting.batch_size // d.parallel_batches)
        sizes.append(size)
        per_epoch.append(batches * d.parallel_batches)
        samples.append(batches * d.parallel_batches * size)
    groups: list[AggregationGroup] = []
    for k in (0, 1):
        holders: dict[tuple[int, int], list[int]] = {}
        for j, pipeline in enumerate(pipelines):
            if k < len(pipeline.stages):
                holders.setdefault(pipeline.stages[k].layers, []).append(j)
        groups.extend(AggregationGroup(members=tuple((j, k) for j in members),
                                       every=tuple(per_epoch[j] for j in members),
                                       weights=tuple(float(samples[j]) for j in members))
                      for members in holders.values() if len(members) > 1)
    run_plan = RunPlan(pipelines=tuple(pipelines),
                       microbatches=tuple(n * epochs for n in per_epoch), groups=tuple(groups))
    return PipelearnRun(method=plan.method, server=setting.server, clients=setting.clients,
                        run_plan=run_plan, microbatch_sizes=tuple(sizes))


def predicted_iteration_s(plan: MethodPlan) -> float:
    """The slowest client's iteration by the time model (an epoch is ``batches`` of them,
    then the aggregation)."""
    return max((d.iteration_s for d in plan.devices), default=math.nan)
