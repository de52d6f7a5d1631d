"""Pipeline schedules as data: for each device, the ordered list of actions it executes.

The simulator and the agent's stage executor consume the same lists (as in
``torch.distributed.pipelining.schedules``), so what the planner predicts and what the devices
run cannot drift apart. An action is (stage, kind, micro-batch) with the short string form
``"1F5"``, which round-trips through :func:`Action.parse`:

- ``F``: forward pass of a micro-batch (then send the activation downstream);
- ``B``: backward pass (then send the gradient upstream);
- ``A``: all-reduce of the stage's gradients among its replicas (stages on several devices);
- ``U``: apply the update to the stage's weights (a new weight version).

Schedules:

- ``1f1b`` (PipeDream / FTPipeHD, asynchronous): stage k keeps S - k micro-batches in flight
  (the memory model's stash depth), then alternates one backward and one forward; each backward
  is followed by its update, so each micro-batch is forwarded and backwarded with the same
  stashed weight version (weight stashing) and the version that entered stage 0 (vertical
  sync). On replicated stages the all-reduce runs in the background; a replica's next backward
  waits for its previous all-reduce.
- ``gpipe`` (synchronous): each batch of micro-batches is forwarded, then backwarded, then the
  replicas all-reduce together and every stage updates once (the flush).

A stage served by several devices gives each micro-batch to the replica that would finish it
first, so replicas share the work in proportion to their speed, as the cost model assumes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from orchestrator.formats import SCHEDULES

ACTION_KINDS = ("F", "B", "A", "U")
_ACTION = re.compile(r"^(\d+)([FBAU])(\d+)$")


@dataclass(frozen=True)
class Action:
    stage: int
    kind: str
    microbatch: int

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise ValueError(f"unknown action kind {self.kind!r}; known: {', '.join(ACTION_KINDS)}")
        if self.stage < 0 or self.microbatch < 0:
            raise ValueError(f"stage and micro-batch must not be negative: {self!r}")

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        match = _ACTION.match(text.strip())
        if match is None:
            raise ValueError(f"not an action: {text!r} (expected stage, F/B/A/U, micro-batch, "
                             "such as '1F5')")
        return cls(stage=int(match[1]), kind=match[2], microbatch=int(match[3]))


@dataclass(frozen=True)
class Schedule:
    """Action lists per device, and which replica of each stage serves each micro-batch."""

    name: str
    num_stages: int
    microbatches: int
    flush_every: int
    stage_devices: tuple[tuple[str, ...], ...]
    replica: tuple[tuple[str, ...], ...]  # [stage][microbatch] -> device
    actions: Mapping[str, tuple[Action, ...]]

    def device_for(self, stage: int, microbatch: int) -> str:
        return self.replica[stage][microbatch]

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "num_stages": self.num_stages,
                "microbatches": self.microbatches, "flush_every": self.flush_every,
                "actions": {d: [str(a) for a in acts] for d, acts in self.actions.items()}}


def assign_replicas(times_s: Sequence[float], microbatches: int) -> list[int]:
    """For each micro-batch, the replica that would finish it earliest given what each already
    holds: shares come out proportional to speed."""
    load = [0.0] * len(times_s)
    out = []
    for _ in range(microbatches):
        r = min(range(len(times_s)), key=lambda i: (load[i] + times_s[i], i))
        load[r] += times_s[r]
        out.append(r)
    return out


def _one_f_one_b(stage: int, mine: Sequence[int], warmup: int, replicated: bool) -> list[Action]:
    def after_backward(m: int) -> list[Action]:
        tail = [Action(stage, "A", m)] if replicated else []
        return [Action(stage, "B", m), *tail, Action(stage, "U", m)]

    warmup = min(warmup, len(mine))
    acts = [Action(stage, "F", m) for m in mine[:warmup]]
    for i in range(len(mine) - warmup):
        acts += after_backward(mine[i])
        acts.append(Action(stage, "F", mine[warmup + i]))
    for m in mine[len(mine) - warmup:]:
        acts += after_backward(m)
    return acts


def _gpipe(stage: int, mine: Sequence[int], flush_every: int, microbatches: int,
           replicated: bool) -> list[Action]:
    acts: list[Action] = []
    batches: dict[int, list[int]] = {}
    for batch in range(-(-microbatches // flush_every)):
        batches[batch] = []  # every replica joins every flush, with or without micro-batches
    for m in mine:
        batches[m // flush_every].append(m)
    for batch in sorted(batches):
        ms = batches[batch]
        last = min((batch + 1) * flush_every, microbatches) - 1  # the flush is labelled by it
        acts += [Action(stage, "F", m) for m in ms]
        acts += [Action(stage, "B", m) for m in ms]
        if replicated:
            acts.append(Action(stage, "A", last))
        acts.append(Action(stage, "U", last))
    return acts


def build_schedule(*, name: str, stage_devices: Sequence[Sequence[str]],
                   stage_times_s: Sequence[Sequence[float]], microbatches: int,
                   flush_every: int | None = None,
                   inflight: Sequence[int] | None = None) -> Schedule:
    """Action lists for a pipeline of ``stage_devices`` (replicas per stage, in pipeline order)
    whose replicas take ``stage_times_s`` per micro-batch, over ``microbatches`` micro-batches.

    ``flush_every`` (GPipe) is the number of micro-batches per batch; default all of them.
    ``inflight`` (1F1B) is the number of micro-batches each stage keeps in flight; default
    S - k (see :func:`orchestrator.cost.choose_inflight`).
    """
    if name not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {name!r}")
    if microbatches < 1:
        raise ValueError(f"microbatches must be at least 1, got {microbatches}")
    flush = microbatches if flush_every is None else flush_every
    if flush < 1:
        raise ValueError(f"flush_every must be at least 1, got {flush_every}")
    if len(stage_devices) != len(stage_times_s) or not stage_devices:
        raise ValueError("need one list of replica times per stage")
    if inflight is not None and (len(inflight) != len(stage_devices)
                                 or any(x < 1 for x in inflight)):
        raise ValueError(f"inflight needs one positive depth per stage, got {list(inflight)}")
    num_stages = len(stage_devices)
    replica: list[tuple[str, ...]] = []
    actions: dict[str, tuple[Action, ...]] = {}
    for k, (devices, times) in enumerate(zip(stage_devices, stage_times_s, strict=True)):
        if len(devices) != len(times) or not devices:
            raise ValueError(f"stage {k}: need one time per replica")
        owner = assign_replicas(times, microbatches)
        replica.append(tuple(devices[r] for r in owner))
        in_flight = num_stages - k if inflight is None else inflight[k]
        for r, device in enumerate(devices):
            mine = [m for m in range(microbatches) if owner[m] == r]
            replicated = len(devices) > 1
            if name == "1f1b":
                # the stage's first D_k micro-batches are its warm-up, each forwarded by the
                # replica that owns it (a replica owning none of them starts with one): no
                # replica forwards further ahead than the stage upstream can deliver without
                # this stage's backwards, or the two would wait for each other
                head = min(in_flight, microbatches)
                warmup = max(1, sum(1 for m in range(head) if owner[m] == r))
                actions[device] = tuple(_one_f_one_b(k, mine, warmup, replicated))
            else:
                actions[device] = tuple(_gpipe(k, mine, flush, microbatches, replicated))
    return Schedule(name=name, num_stages=num_stages, microbatches=microbatches,
                    flush_every=flush, stage_devices=tuple(tuple(d) for d in stage_devices),
                    replica=tuple(replica), actions=MappingProxyType(actions))


def format_schedule(schedule: Schedule) -> str:
    """The step x device table of a schedule, as torch's pipelining formatter prints it."""
    devices = [d for stage in schedule.stage_devices for d in stage]
    width = max([len(d) for d in devices] + [6])
    steps = max(len(schedule.actions[d]) for d in devices)
    lines = ["step  " + " ".join(d.rjust(width) for d in devices)]
    for step in range(steps):
        cells = [str(schedule.actions[d][step]) if step < len(schedule.actions[d]) else ""
                 for d in devices]
        lines.append(f"{step:>4}  " + " ".join(c.rjust(width) for c in cells))
    return "\n".join(lines)
