"""Pipeline schedules as data: for each device, the ordered list of actions it executes.

The simulator and the agent's stage executor consume the same lists (as in
``torch.distributed.pipelining.schedules``), so what the planner predicts and what the devices
run cannot drift apart. An action is (stage, kind, micro-batch) with the short string form
``"1F5"``, which round-trips through :func:`Action.parse`:

- ``F``: forward pass of a micro-batch (then send the activation downstream);
- ``B``: backward pass (then send the gradient upstream);
- ``A``: the stage's replicas share gradients (stages on several devices, below);
- ``U``: apply the update to the stage's weights (a new weight version);
- ``G``: average the stage's weights with the other members of its aggregation group
  (FedAvg, weighted by samples: the stage's copies in several pipelines), at the end of a
  round; labelled by the round's last micro-batch. The weights change, the version does not.

Schedules:

- ``1f1b`` (PipeDream / FTPipeHD, asynchronous): stage k keeps D_k micro-batches in flight
  (default S - k, the memory model's stash depth), then alternates one backward and one
  forward; each backward is followed by its update, so each micro-batch is forwarded and
  backwarded with the same stashed weight version (weight stashing).
- ``1f1b-sync`` (synchronous 1F1B, PipeDream-flush, as torch's ``Schedule1F1B`` and
  Megatron): within each batch the 1F1B order of ``1f1b`` (D_k micro-batches in flight, then
  one backward, one forward), without its updates: after the batch's last backward the
  replicas all-reduce and every stage updates once (the flush). 1F1B's memory (D_k
  activations, no stashed versions) with GPipe's semantics (every micro-batch of a batch on
  the same weights).
- ``gpipe`` (synchronous): each batch of micro-batches is forwarded, then backwarded, then the
  replicas all-reduce together and every stage updates once (the flush).

A stage served by several devices (a group of replicas) gives each micro-batch to the replica
that would finish it first, so replicas share the work in proportion to their speed, as the
cost model assumes. Under GPipe and 1F1B-sync the replicas all-reduce the gradients they
accumulated over the batch (``A``, every replica joining, even one without micro-batches in
that batch) and apply the same average. Under asynchronous 1F1B every replica applies the
update of *every* micro-batch of the stage, in micro-batch order, as a single device would: a
replica's ``A`` after its own backward sends that micro-batch's gradient to the other replicas,
and a ``U`` of a micro-batch another replica owns waits for it. Each replica's list is the
single-device 1F1B list of the stage, keeping its own forwards and backwards, with the others'
updates deferred to just before its next own forward or update (a backward needs no new
weights: it runs on the forward's stashed version). So the replicas' weights are identical at
every version and equal, bit for bit, what one device would train with the same micro-batches.

Two lanes (Duan-Wu): a device that splits its resources between the passes runs its forwards
on one lane and everything else on another, at once. :func:`forward_gates` says when a forward
may start and on which weight version, for one lane or two: with two lanes under 1F1B a
forward waits until the last backward before it in the list has started (which keeps 1F1B's
bound on micro-batches in flight) and runs on the weights holding the updates listed before
that backward (applied by then); under 1F1B-sync likewise within a batch, but the first
forward after a flush waits for its update; under GPipe a forward waits for everything listed
before it, so each batch still forwards on the weights of the previous flush.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from orchestrator.formats import SCHEDULES, synchronous
from orchestrator.planformat import u_shaped

ACTION_KINDS = ("F", "B", "A", "U", "G")
# The most micro-batches a run trains (batches x micro-batches x epochs). A schedule lists
# every device's actions for every micro-batch of a generation, and each agent builds it whole
# when it deploys: memory and time grow with the count (docs/benchmarks.md, "Schedule size"),
# so a run of a million batches exhausted its agents' memory before the first micro-batch.
MAX_MICROBATCHES = 50_000
_ACTION = re.compile(r"^(?:p(\d+):)?(\d+)([FBAUG])(\d+)$")


@dataclass(frozen=True, slots=True)
class Action:
    """``kind`` of micro-batch ``microbatch`` at ``stage`` of ``pipeline`` (a run may train
    several pipelines: split learning one per client, PipeLearn one per device)."""

    stage: int
    kind: str
    microbatch: int
    pipeline: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise ValueError(f"unknown action kind {self.kind!r}; known: {', '.join(ACTION_KINDS)}")
        if self.stage < 0 or self.microbatch < 0 or self.pipeline < 0:  # min() cost 2x
            raise ValueError(f"pipeline, stage and micro-batch must not be negative: {self!r}")

    def __str__(self) -> str:
        head = f"p{self.pipeline}:" if self.pipeline else ""
        return f"{head}{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        match = _ACTION.match(text.strip())
        if match is None:
            raise ValueError(f"not an action: {text!r} (expected [p<pipeline>:]stage, "
                             "F/B/A/U/G, micro-batch, such as '1F5' or 'p2:0U7')")
        return cls(pipeline=int(match[1] or 0), stage=int(match[2]), kind=match[3],
                   microbatch=int(match[4]))


@dataclass(frozen=True)
class ForwardGate:
    """When a forward may start and what it runs on: once its device has *started*
    ``started`` of the list's other actions (those that are not forwards, in list order) and
    *finished* ``finished`` of them, on the weights holding ``updates`` of the list's updates."""

    started: int
    finished: int
    updates: int


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
    two_lanes: frozenset[str] = frozenset()  # devices running forwards on a lane of their own
    inflight: tuple[int, ...] = ()  # 1F1B: micro-batches each stage keeps in flight
    lag: tuple[int, ...] = ()  # 1F1B: a replicated stage forwards m on the updates up to m - lag
    pipeline: int = 0

    def device_for(self, stage: int, microbatch: int) -> str:
        return self.replica[stage][microbatch]

    def replicas(self, stage: int) -> tuple[str, ...]:
        return self.stage_devices[stage]

    def stage_of(self, device: str) -> int:
        for k, devices in enumerate(self.stage_devices):
            if device in devices:
                return k
        raise ValueError(f"device {device!r} serves no stage")

    def actions_of(self, device: str, stage: int | None = None) -> tuple[Action, ...]:
        """The device's list, or its list for ``stage`` alone (a U-shaped pipeline's device
        serves two stages, each run by an executor of its own)."""
        own = self.actions[device]
        return own if stage is None else tuple(a for a in own if a.stage == stage)

    def gates(self, device: str, stage: int | None = None) -> dict[int, ForwardGate]:
        """:func:`forward_gates` of a device's list (for ``stage``: of :meth:`actions_of`)."""
        k = self.stage_of(device) if stage is None else stage
        replicated = len(self.stage_devices[k]) > 1
        return forward_gates(self.actions_of(device, stage), name=self.name,
                             two_lanes=device in self.two_lanes,
                             depth=self.lag[k] if replicated else None)

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "num_stages": self.num_stages,
                "microbatches": self.microbatches, "flush_every": self.flush_every,
                "two_lanes": sorted(self.two_lanes),
                "actions": {d: [str(a) for a in acts] for d, acts in self.actions.items()}}


def assign_replicas(times_s: Sequence[float], microbatches: int) -> list[int]:
    """For each micro-batch, the replica that would finish it earliest given what each already
    holds: shares come out proportional to speed."""
    if len(times_s) == 1:  # one device: the common case (the search per micro-batch was
        return [0] * microbatches  # a tenth of building a schedule of 50,000 of them)
    load = [0.0] * len(times_s)
    out = []
    for _ in range(microbatches):
        r = min(range(len(times_s)), key=lambda i: (load[i] + times_s[i], i))
        load[r] += times_s[r]
        out.append(r)
    return out


def _one_f_one_b(stage: int, mine: Sequence[int], warmup: int) -> list[Action]:
    """One device's list under asynchronous 1F1B: :func:`_one_f_one_b_window`'s order
    (``warmup`` forwards, then B, F...), each backward followed by its update."""
    acts: list[Action] = []
    for action in _one_f_one_b_window(stage, mine, warmup - 1):
        acts.append(action)
        if action.kind == "B":
            acts.append(Action(stage, "U", action.microbatch))
    return acts


def reference_version(microbatch: int, depth: int) -> int:
    """The weight version a single device keeping ``depth`` micro-batches in flight under 1F1B
    forwards ``microbatch`` with: the updates of micro-batches 0..m - depth."""
    return max(0, microbatch - depth + 1)


def _one_f_one_b_replica(stage: int, owner: Sequence[int], replica: int, lag: int,
                         ahead: int, *, two_lanes: bool = False) -> list[Action]:
    """A replica's list under 1F1B: its own micro-batches in 1F1B order, each backward
    followed by ``A`` (its gradient to the other replicas), and every update of the stage, in
    micro-batch order, as late as it can come: before an own forward of m, those that make
    :func:`reference_version` (m, lag), the version one device keeping ``lag`` in flight would
    forward m with. A backward never waits for an update.

    In flight: a replica forwards its next micro-batch when it has none in flight, and
    before the backward of its oldest i every own micro-batch up to i + ``ahead`` (the span
    its micro-batches' way through it and the stages downstream takes, which those stages
    need to keep busy and to return i's gradient). More would only lengthen each
    micro-batch's way through the replica, which the other replicas' forwards wait for.

    On two lanes the updates a forward needs go before the backward listed just before it
    (and its ``A``), those of earlier micro-batches than that backward's, so that the forward
    can run beside that backward."""
    mine = [m for m, r in enumerate(owner) if r == replica]
    acts: list[Action] = []
    applied = 0  # updates listed so far (every one of them, in micro-batch order)
    forwards = backwards = 0

    def apply_until(count: int) -> None:
        nonlocal applied
        while applied < count:
            acts.append(Action(stage, "U", applied))
            applied += 1

    while backwards < len(mine):
        if forwards < len(mine):
            m = mine[forwards]
            version = reference_version(m, lag)
            oldest = mine[backwards] if backwards < forwards else m
            ready = not any(owner[j] == replica for j in range(oldest, version))
            if ready and (forwards == backwards or m <= oldest + ahead):
                start = len(acts)
                apply_until(version)
                if two_lanes and start >= 2 and acts[start - 2].kind == "B":
                    # the updates before the backward's own micro-batch
                    j = acts[start - 2].microbatch
                    early = [a for a in acts[start:] if a.microbatch < j]
                    acts[start - 2:] = early + acts[start - 2:start] + acts[start + len(early):]
                acts.append(Action(stage, "F", m))
                forwards += 1
                continue
        assert backwards < forwards, "a replica's forward waits on an update of its own"
        j = mine[backwards]
        acts += [Action(stage, "B", j), Action(stage, "A", j)]
        backwards += 1
    apply_until(len(owner))
    return acts


def _one_f_one_b_window(stage: int, mine: Sequence[int], ahead: int) -> list[Action]:
    """Own micro-batches in 1F1B order without updates: a forward of m when nothing is in
    flight or m is within ``ahead`` of the oldest micro-batch in flight (by micro-batch
    number, so that a replica holding every other micro-batch keeps the same span of the
    pipeline in flight as one device would), else the oldest one's backward. One device
    with ``ahead`` D - 1 gives 1F1B's warm-up of D forwards, then B, F..."""
    acts: list[Action] = []
    forwards = backwards = 0
    while backwards < len(mine):
        if forwards < len(mine):
            m = mine[forwards]
            if forwards == backwards or m <= mine[backwards] + ahead:
                acts.append(Action(stage, "F", m))
                forwards += 1
                continue
        acts.append(Action(stage, "B", mine[backwards]))
        backwards += 1
    return acts


def _flushed(stage: int, mine: Sequence[int], flush_every: int, microbatches: int,
             replicated: bool, ahead: int | None) -> list[Action]:
    """A synchronous schedule's list: each batch's own micro-batches in GPipe order (``ahead``
    None: every forward, then every backward) or in 1F1B order (:func:`_one_f_one_b_window`),
    then the flush: ``A`` among replicas and one ``U``, labelled by the batch's last
    micro-batch."""
    acts: list[Action] = []
    batches: dict[int, list[int]] = {}
    for batch in range(-(-microbatches // flush_every)):
        batches[batch] = []  # every replica joins every flush, with or without micro-batches
    for m in mine:
        batches[m // flush_every].append(m)
    for batch in sorted(batches):
        ms = batches[batch]
        last = min((batch + 1) * flush_every, microbatches) - 1  # the flush is labelled by it
        if ahead is None:
            acts += [Action(stage, "F", m) for m in ms]
            acts += [Action(stage, "B", m) for m in ms]
        else:
            acts += _one_f_one_b_window(stage, ms, ahead)
        if replicated:
            acts.append(Action(stage, "A", last))
        acts.append(Action(stage, "U", last))
    return acts


def forward_gates(actions: Sequence[Action], *, name: str, two_lanes: bool,
                  depth: int | None = None) -> dict[int, ForwardGate]:
    """For each forward of a device's list (by position): when it may start and on which
    weights (module docstring). On one lane a forward waits for everything before it. ``depth``:
    the list is a replica's under 1F1B, whose forwards run on the stage's
    :func:`reference_version`, once the update that makes it is applied."""
    gates: dict[int, ForwardGate] = {}
    others = 0  # actions other than forwards so far
    updates: list[int] = []  # where each update is among the others
    last_backward: tuple[int, int] | None = None  # (its index among the others, updates before)
    for position, action in enumerate(actions):
        if action.kind != "F":
            if action.kind == "B":
                last_backward = (others, len(updates))
            elif action.kind == "U":
                updates.append(others)
                if name == "1f1b-sync":
                    last_backward = None  # a flush: the next forward needs its update
            others += 1
            continue
        if two_lanes and name in ("1f1b", "1f1b-sync") and last_backward is not None:
            index, version = last_backward
            started, finished = index + 1, index
        else:
            started = finished = others
            version = len(updates)
        if depth is not None and not synchronous(name):
            version = reference_version(action.microbatch, depth)
            if version > len(updates):
                raise ValueError(f"{action} needs {version} updates; {len(updates)} come before "
                                 "it")
            finished = max(finished, updates[version - 1] + 1 if version else 0)
        gates[position] = ForwardGate(started=started, finished=finished, updates=version)
    return gates


def build_schedule(*, name: str, stage_devices: Sequence[Sequence[str]],
                   stage_times_s: Sequence[Sequence[float]], microbatches: int,
                   flush_every: int | None = None,
                   inflight: Sequence[int] | None = None,
                   lag: Sequence[int] | None = None,
                   replica_inflight: Mapping[str, int] | None = None,
                   two_lanes: Sequence[str] = (), pipeline: int = 0,
                   rounds: Mapping[int, int] | None = None) -> Schedule:
    """Action lists for a pipeline of ``stage_devices`` (replicas per stage, in pipeline order)
    whose replicas take ``stage_times_s`` per micro-batch, over ``microbatches`` micro-batches.

    ``flush_every`` (GPipe, 1F1B-sync) is the number of micro-batches per batch; default all
    of them.
    ``inflight`` (1F1B) is the number of micro-batches each stage keeps in flight; default
    S - k (see :func:`orchestrator.cost.choose_inflight`). ``lag`` (1F1B): a replicated stage
    forwards m on the updates of micro-batches up to m - lag (default its in-flight depth; see
    :func:`orchestrator.cost.choose_lag`); ``replica_inflight``: the span of micro-batches a
    replica keeps in flight (default its stage's depth; see
    :func:`orchestrator.cost.replica_inflight`). ``two_lanes``: the devices that run their
    forwards on a lane of their own (a Duan-Wu split). ``pipeline``: which of the run's
    pipelines this is (its actions carry it). ``rounds``: {stage: micro-batches per round} for
    the stages in an aggregation group, which average their weights (``G``) after the update
    of each round's last micro-batch (under a synchronous schedule a round is a whole number
    of batches).
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
    if lag is not None and len(lag) != len(stage_devices):
        raise ValueError(f"lag needs one depth per stage, got {list(lag)}")
    every = [d for devices in stage_devices for d in devices]
    if len(set(every)) != len(every) and not u_shaped(stage_devices):
        raise ValueError("a device serves one stage of a pipeline (or the first and the last "
                         "of a U-shaped one)")
    unknown = sorted(set(two_lanes) - set(every))
    if unknown:
        raise ValueError(f"two_lanes names {unknown[0]!r}, which serves no stage")
    for k, length in (rounds or {}).items():
        if not 0 <= k < len(stage_devices) or length < 1:
            raise ValueError(f"rounds: stage {k} of {len(stage_devices)}, {length} "
                             "micro-batches a round")
        if len(stage_devices[k]) > 1 or stage_devices[k][0] in two_lanes:
            raise ValueError(f"rounds: stage {k} is replicated or on two lanes; an aggregation "
                             "group averages stages on one device each, on one lane")
        if synchronous(name) and length % flush:
            raise ValueError(f"rounds: under {name} a round is whole batches of {flush}, "
                             f"not {length} micro-batches")
    num_stages = len(stage_devices)
    replica: list[tuple[str, ...]] = []
    actions: dict[str, tuple[Action, ...]] = {}
    depths = tuple(num_stages - k if inflight is None else inflight[k]
                   for k in range(num_stages))
    lags = depths if lag is None else tuple(max(g, d) for g, d in zip(lag, depths, strict=True))
    for k, (devices, times) in enumerate(zip(stage_devices, stage_times_s, strict=True)):
        if len(devices) != len(times) or not devices:
            raise ValueError(f"stage {k}: need one time per replica")
        owner = assign_replicas(times, microbatches)
        replica.append(tuple(devices[r] for r in owner))
        depth = depths[k]
        for r, device in enumerate(devices):
            mine = [m for m in range(microbatches) if owner[m] == r]
            window = (replica_inflight or {}).get(device, depth)
            if synchronous(name):
                acts = _flushed(k, mine, flush, microbatches, len(devices) > 1,
                                None if name == "gpipe" else window - 1)
            elif len(devices) > 1:
                acts = _one_f_one_b_replica(k, owner, r, lags[k], window - 1,
                                            two_lanes=device in two_lanes)
            else:
                acts = _one_f_one_b(k, mine, depth)
            if rounds and k in rounds:
                acts = _with_rounds(acts, rounds[k])
            # a U-shaped pipeline's device lists its first stage's actions, then its last's
            # (each action made anew for a pipeline other than 0: dataclasses.replace took half
            # of building a schedule of 50,000 micro-batches)
            if pipeline:
                acts = [Action(a.stage, a.kind, a.microbatch, pipeline) for a in acts]
            actions[device] = (*actions.get(device, ()), *acts)
    return Schedule(name=name, num_stages=num_stages, microbatches=microbatches,
                    flush_every=flush, stage_devices=tuple(tuple(d) for d in stage_devices),
                    replica=tuple(replica), actions=MappingProxyType(actions),
                    two_lanes=frozenset(two_lanes), inflight=depths, lag=lags,
                    pipeline=pipeline)


def _with_rounds(acts: Sequence[Action], length: int) -> list[Action]:
    """A ``G`` after each update that completes a round of ``length`` micro-batches (the
    update's label is the last micro-batch it holds: the micro-batch under 1F1B, the batch's
    last under a synchronous schedule)."""
    out: list[Action] = []
    for action in acts:
        out.append(action)
        if action.kind == "U" and (action.microbatch + 1) % length == 0:
            out.append(Action(action.stage, "G", action.microbatch))
    return out


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
