"""What every device of a run of several pipelines trains: the stage specs of a
:class:`~orchestrator.runplan.RunPlan` (docs/architecture.md, "Runs beyond a chain").

A device gets one :class:`~orchestrator.protocol.StageSpec` per stage it serves, in any
pipeline (a split-learning client holds stages 0 and 2 of its own pipeline, a helper stage 1
of each client it serves); each is sent in a ``deploy`` of its own, and the agent answers
each one. A stage in an aggregation group is told its round, its group's members in ring
order and its FedAvg weight; with ``shard_split`` each pipeline trains its own shard of the
training set; a device that takes turns (a split-learning helper, orchestrator.sl.deploy)
gets its order in every one of its stages' specs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.protocol import StageSpec
from orchestrator.runplan import RunPlan

Turns = tuple[tuple[int, str, int, int, int], ...]


def run_plan_specs(run_plan: RunPlan, *, shared: Mapping[str, Any],
                   turns: Mapping[str, Turns] | None = None,
                   shard_split: str | None = None,
                   shards: Sequence[tuple[int, int]] | None = None,
                   batch_sizes: Sequence[int] | None = None) -> tuple[StageSpec, ...]:
    """Every stage spec of ``run_plan``, by pipeline, stage and device. ``shared`` holds the
    fields every spec has alike (run, model, dataset, batch size, SGD settings, seed, ...);
    ``turns`` the order of a device's stages' passes (orchestrator.sl.turns.run_turns), in
    each of its specs. With ``shard_split``, pipeline p trains shard ``shards[p]`` (index,
    count) of the training set, by default (p, pipelines). ``batch_sizes``: each pipeline's
    micro-batch size, when they differ (PipeLearn's ``B // N``), else ``shared``'s."""
    if shards is not None and len(shards) != len(run_plan.pipelines):
        raise ValueError(f"shards: needs one (index, count) per pipeline "
                         f"({len(run_plan.pipelines)}), got {len(shards)}")
    if batch_sizes is not None and len(batch_sizes) != len(run_plan.pipelines):
        raise ValueError(f"batch_sizes: needs one per pipeline ({len(run_plan.pipelines)}), "
                         f"got {len(batch_sizes)}")
    taking_turns = turns or {}
    specs = []
    for p, plan in enumerate(run_plan.pipelines):
        stage_devices = tuple(s.devices for s in plan.stages)
        for k, stage in enumerate(plan.stages):
            group = run_plan.group_of(p, k)
            grouped: dict[str, Any] = {}
            if group is not None:
                member = group.members.index((p, k))
                grouped = {"round_every": group.every[member],
                           "group": tuple((run_plan.pipelines[q].stages[s].devices[0], q, s)
                                          for q, s in group.members),
                           "group_weight": group.weight(member)}
            sized = {} if batch_sizes is None else {"batch_size": batch_sizes[p]}
            for device in stage.devices:
                specs.append(StageSpec(
                    **{**shared, **sized}, device=device, stage=k, layers=stage.layers,
                    schedule=plan.schedule, stage_devices=stage_devices,
                    stage_times_s=tuple((1.0,) * len(s.devices) for s in plan.stages),
                    microbatches=run_plan.microbatches[p], flush_every=plan.microbatches,
                    inflight=plan.inflight, pipeline=p, **grouped,
                    shard=None if shard_split is None else (
                        shards[p] if shards is not None else (p, len(run_plan.pipelines))),
                    shard_split=shard_split or "iid",
                    turns=taking_turns.get(device, ())))
    return tuple(specs)
