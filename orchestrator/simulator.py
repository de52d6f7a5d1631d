"""Discrete-event simulation of a plan: the oracle the tests, the dashboard's planned Gantt and
the runtime's expectations all come from.

Each device executes its action list (:mod:`orchestrator.schedule`) in order. A forward waits
for its activation, a backward for its gradient (the last stage for its own forward); after a
forward the activation crosses the link to the next stage's replica for that micro-batch, after
a backward the gradient crosses back. A link carries one transfer at a time in either direction
(the cost model's 2x boundary term), taking ``bytes / bandwidth + latency``. Replicas of a
stage share gradients as the schedule says: under GPipe and 1F1B-sync they all-reduce over one
shared channel for ``Y`` seconds at each flush; under asynchronous 1F1B a replica's ``A`` sends
its micro-batch's gradient (the stage's parameter bytes) to every other replica over their
links, and a replica's update of a micro-batch it does not own waits for that gradient. Under a
Duan-Wu ``beta`` plan a device with a split runs forwards and everything else on two lanes at
once, each at the speed of its share of the device's resources, with the forward gates of
:func:`orchestrator.schedule.forward_gates` (which weights a forward runs on, and what it
waits for).

The result holds timeline events in the shared schema and a summary: makespan, throughput,
busy and idle time per device with the idle broken down
(:func:`orchestrator.events.idle_breakdown`), bubble fraction and bytes moved.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from orchestrator.cost import CostModel, split_pass_s
from orchestrator.events import IdleBreakdown, TimelineEvent, idle_breakdown
from orchestrator.formats import synchronous
from orchestrator.planformat import Plan
from orchestrator.runplan import AggregationGroup, RunPlan
from orchestrator.schedule import Action, ForwardGate, Schedule, build_schedule


@dataclass(frozen=True)
class SimulationResult:
    schedule: Schedule
    events: tuple[TimelineEvent, ...]
    makespan_s: float
    throughput_sps: float
    bubble_fraction: float
    bytes_moved: int
    devices: Mapping[str, IdleBreakdown]

    def summary_json(self) -> dict[str, Any]:
        return {"schedule": self.schedule.name, "microbatches": self.schedule.microbatches,
                "makespan_s": self.makespan_s, "throughput_sps": self.throughput_sps,
                "bubble_fraction": self.bubble_fraction, "bytes_moved": self.bytes_moved,
                "devices": {d: b.to_json() for d, b in self.devices.items()}}


@dataclass
class _Lane:
    actions: list[tuple[int, Action]]  # (position in the device's list, action)
    next: int = 0
    free_at: float = 0.0

    @property
    def done(self) -> bool:
        return self.next >= len(self.actions)


@dataclass
class _Channel:
    """A FIFO resource (a link, a stage's all-reduce ring)."""

    free_at: float = 0.0
    queue: list[tuple[float, int, Callable[[float], float]]] = field(default_factory=list)


@dataclass
class _Worker:
    """One (pipeline, stage) list on one device: its lanes and how far they have got."""

    pipeline: int
    device: str
    stage: int
    gates: Mapping[int, ForwardGate]
    lanes: list[_Lane]
    others_started: int = 0
    others_finished: int = 0


class _Simulation:
    def __init__(self, cm: CostModel, pipes: Sequence[tuple[Plan, Schedule]],
                 groups: Sequence[AggregationGroup], run: int) -> None:
        self.cm, self.run = cm, run
        self.plans = [plan for plan, _ in pipes]
        self.schedules = [schedule for _, schedule in pipes]
        self.groups = list(groups)
        self.now = 0.0
        self.heap: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.events: list[TimelineEvent] = []
        self.bytes_moved = 0
        # by (pipeline, stage, micro-batch); shared_at by (pipeline, replica, micro-batch)
        self.activation_at: dict[tuple[int, int, int], float] = {}
        self.gradient_at: dict[tuple[int, int, int], float] = {}
        self.forward_done: dict[tuple[int, int, int], float] = {}
        self.shared_at: dict[tuple[int, str, int], float] = {}
        self.version_of: dict[tuple[int, int], int] = {}
        self.arrived: dict[Any, set[Any]] = {}  # collectives: who has joined
        self.links: dict[frozenset[str], _Channel] = {}
        self.rings: dict[Any, _Channel] = {}
        # by (pipeline, device, stage): a U-shaped pipeline's device runs two stages' lists
        self.fwd_s: dict[tuple[int, str, int], float] = {}
        self.bwd_s: dict[tuple[int, str, int], float] = {}
        self.workers: dict[tuple[int, str, int], _Worker] = {}
        for p, (plan, schedule) in enumerate(pipes):
            for k, stage in enumerate(plan.stages):
                a, e = stage.layers
                for dev in stage.devices:
                    self.fwd_s[(p, dev, k)], self.bwd_s[(p, dev, k)] = split_pass_s(
                        cm, cm.index(dev), a, e, plan.beta)
                    indexed = list(enumerate(schedule.actions_of(dev, k)))
                    lanes = ([_Lane([x for x in indexed if x[1].kind == "F"]),
                              _Lane([x for x in indexed if x[1].kind != "F"])]
                             if dev in schedule.two_lanes else [_Lane(indexed)])
                    self.workers[(p, dev, k)] = _Worker(p, dev, k, schedule.gates(dev, k),
                                                        lanes)
        # a device serving several stages (of several pipelines, or both ends of a U-shaped
        # one) computes one pass at a time
        hosted = Counter(dev for _, dev, _ in self.workers)
        self.compute_free_at = {dev: 0.0 for dev, n in hosted.items() if n > 1}

    # ---- the event loop

    def at(self, time: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self.heap, (time, next(self.seq), callback))

    def run_all(self) -> None:
        self.advance_all()
        while self.heap:
            time, _, callback = heapq.heappop(self.heap)
            self.now = time
            callback()
            self.advance_all()
        stuck = {f"{w.device}/p{w.pipeline}s{w.stage}": str(lane.actions[lane.next][1])
                 for w in self.workers.values() for lane in w.lanes if not lane.done}
        if stuck:
            raise RuntimeError(f"the schedule deadlocks: waiting actions {stuck}")

    def advance_all(self) -> None:
        progress = True
        while progress:
            progress = False
            for worker in self.workers.values():
                for lane in worker.lanes:
                    while self.try_start(worker, lane):
                        progress = True

    # ---- readiness and execution of actions

    def version(self, p: int, m: int) -> int:
        schedule = self.schedules[p]
        if synchronous(schedule.name):
            return m // schedule.flush_every
        return self.version_of.get((p, m), 0)

    def ready(self, w: _Worker, position: int, action: Action) -> bool:
        p, k, m = w.pipeline, action.stage, action.microbatch
        if action.kind in ("F", "B") and self.compute_free_at.get(w.device, 0.0) > self.now:
            return False
        if action.kind == "F":
            gate = w.gates[position]
            if w.others_started < gate.started or w.others_finished < gate.finished:
                return False
            return k == 0 or self.activation_at.get((p, k, m), math.inf) <= self.now
        if action.kind == "B":
            if k == len(self.plans[p].stages) - 1:
                return self.forward_done.get((p, k, m), math.inf) <= self.now
            return self.gradient_at.get((p, k, m), math.inf) <= self.now
        if action.kind == "U" and self.shared(p, k, m, w.device):
            return self.shared_at.get((p, w.device, m), math.inf) <= self.now
        return True  # A shares the gradients, G averages a group, U applies the update

    def shared(self, p: int, k: int, m: int, dev: str) -> bool:
        """Is this a 1F1B update of a micro-batch another replica owns (its gradient comes)?"""
        schedule = self.schedules[p]
        return (not synchronous(schedule.name) and len(self.plans[p].stages[k].devices) > 1
                and schedule.device_for(k, m) != dev)

    def try_start(self, w: _Worker, lane: _Lane) -> bool:
        if lane.done or lane.free_at > self.now:
            return False
        position, action = lane.actions[lane.next]
        if not self.ready(w, position, action):
            return False
        lane.next += 1
        if action.kind != "F":
            w.others_started += 1
        getattr(self, f"start_{action.kind}")(w, lane, position, action)
        return True

    def finished(self, w: _Worker, action: Action) -> None:
        if action.kind != "F":
            w.others_finished += 1

    def event(self, w: _Worker, stage: int, kind: str, m: int, start: float, end: float,
              size: int = 0) -> None:
        self.events.append(TimelineEvent(self.run, w.device, stage, kind, m,
                                         self.version(w.pipeline, m), start, end, size,
                                         pipeline=w.pipeline))

    def compute(self, w: _Worker, lane: _Lane, action: Action, kind: str, duration: float,
                then: Callable[[float], None]) -> None:
        start, end = self.now, self.now + duration
        lane.free_at = end
        if w.device in self.compute_free_at:
            self.compute_free_at[w.device] = end
        self.event(w, action.stage, kind, action.microbatch, start, end)

        def done() -> None:
            self.finished(w, action)
            then(end)
        self.at(end, done)

    def start_F(self, w: _Worker, lane: _Lane, position: int, action: Action) -> None:
        p, k, m = w.pipeline, action.stage, action.microbatch
        plan, schedule = self.plans[p], self.schedules[p]
        if k == 0:
            self.version_of[(p, m)] = w.gates[position].updates

        def done(end: float) -> None:
            self.forward_done[(p, k, m)] = end
            if k + 1 < len(plan.stages):
                self.transfer(w, schedule.device_for(k + 1, m), m,
                              int(self.cm.output_bytes[plan.stages[k].last]),
                              self.activation_at, (p, k + 1, m), src_stage=k, dst_stage=k + 1)

        self.compute(w, lane, action, "forward", self.fwd_s[(p, w.device, k)], done)

    def start_B(self, w: _Worker, lane: _Lane, position: int, action: Action) -> None:
        p, k, m = w.pipeline, action.stage, action.microbatch
        plan, schedule = self.plans[p], self.schedules[p]

        def done(end: float) -> None:
            if k > 0:
                self.transfer(w, schedule.device_for(k - 1, m), m,
                              int(self.cm.output_bytes[plan.stages[k - 1].last]),
                              self.gradient_at, (p, k - 1, m), src_stage=k, dst_stage=k - 1)

        self.compute(w, lane, action, "backward", self.bwd_s[(p, w.device, k)], done)

    def start_A(self, w: _Worker, lane: _Lane, position: int, action: Action) -> None:
        p, k, m = w.pipeline, action.stage, action.microbatch
        stage = self.plans[p].stages[k]
        a, e = stage.layers
        if not synchronous(self.schedules[p].name):
            # the micro-batch's gradient to every other replica; the owner computes on
            size = int(self.cm.params_bytes(a, e))
            self.event(w, k, "aggregate", m, self.now, self.now, size)
            for peer in stage.devices:
                if peer != w.device:
                    self.transfer(w, peer, m, size, self.shared_at, (p, peer, m), src_stage=k,
                                  dst_stage=k)
            self.finished(w, action)
            return
        n = len(stage.devices)
        self.collective(w, lane, action, key=("A", p, k, m),
                        members=[(p, d, k) for d in stage.devices],
                        duration=self.cm.sync_s(a, e, [self.cm.index(d) for d in stage.devices]),
                        size=int(2 * (n - 1) / n * self.cm.params_bytes(a, e)))

    def start_G(self, w: _Worker, lane: _Lane, position: int, action: Action) -> None:
        """A round's end: the aggregation group's members average their weights (a ring
        all-reduce of the stage's parameters among their devices) once every one has come."""
        p, k, m = w.pipeline, action.stage, action.microbatch
        group = next(g for g in self.groups if (p, k) in g.members)
        a, e = self.plans[p].stages[k].layers
        devices = sorted({self.plans[q].stages[j].devices[0] for q, j in group.members})
        n = len(devices)
        self.collective(w, lane, action, key=("G", id(group), group.round_of(p, k, m)),
                        members=[(q, self.plans[q].stages[j].devices[0], j)
                                 for q, j in group.members],
                        duration=self.cm.sync_s(a, e, [self.cm.index(d) for d in devices]),
                        size=int(2 * (n - 1) / n * self.cm.params_bytes(a, e)) if n > 1 else 0)

    def collective(self, w: _Worker, lane: _Lane, action: Action, *, key: Any,
                   members: Sequence[tuple[int, str, int]], duration: float, size: int
                   ) -> None:
        """GPipe's flush all-reduce, an aggregation group's average: every member waits for
        all of them, then for the exchange (over one channel per collective)."""
        lane.free_at = math.inf
        arrived = self.arrived.setdefault(key, set())
        arrived.add((w.pipeline, w.device, w.stage))
        if arrived != set(members):
            return
        joined = [self.workers[member] for member in members]

        def job(start: float) -> float:
            end = start + duration
            for worker in joined:
                self.event(worker, action.stage, "aggregate", action.microbatch, start, end,
                           size)
                self.bytes_moved += size
            self.at(end, lambda: self.release(joined, action, end))
            return end

        self.enqueue(self.rings.setdefault(key[:-1], _Channel()), job)

    def release(self, workers: Sequence[_Worker], action: Action, end: float) -> None:
        for worker in workers:
            self.finished(worker, action)
            for lane in worker.lanes:
                if lane.free_at == math.inf:
                    lane.free_at = end

    def start_U(self, w: _Worker, lane: _Lane, position: int, action: Action) -> None:
        """An own update's time is in the backward (the profile's). The update of a
        micro-batch another replica owns costs the replica its fixed cost (the cost model's
        C under 1F1B: a received gradient decoded and applied, an event, a checkpoint)."""
        p, k, m = w.pipeline, action.stage, action.microbatch
        if not self.shared(p, k, m, w.device):
            self.finished(w, action)
            return
        stage = self.plans[p].stages[k]
        duration = self.cm.fixed_s(self.cm.index(w.device), stage.first, stage.last)
        start, end = self.now, self.now + duration
        lane.free_at = end
        self.event(w, k, "update", m, start, end)
        self.at(end, lambda: self.finished(w, action))

    # ---- transfers over shared channels

    def enqueue(self, channel: _Channel, job: Callable[[float], float]) -> None:
        channel.queue.append((self.now, next(self.seq), job))
        if len(channel.queue) == 1 and channel.free_at <= self.now:
            self.serve(channel)

    def serve(self, channel: _Channel) -> None:
        if not channel.queue:
            return
        _, _, job = channel.queue[0]
        end = job(max(self.now, channel.free_at))
        channel.free_at = end

        def next_job() -> None:
            channel.queue.pop(0)
            self.serve(channel)
        self.at(end, next_job)

    def transfer(self, w: _Worker, dst: str, m: int, size: int, arrivals: dict[Any, float],
                 key: Any, *, src_stage: int, dst_stage: int) -> None:
        src, p = w.device, w.pipeline
        receiver = self.workers[(p, dst, dst_stage)]
        if src == dst:  # two pipelines' stages on one device: nothing crosses a link
            arrivals[key] = self.now
            return
        x, y = self.cm.index(src), self.cm.index(dst)
        duration = size / float(self.cm.bandwidth_bps[x, y]) + float(self.cm.latency_s[x, y])

        def job(start: float) -> float:
            end = start + duration
            self.event(w, src_stage, "send", m, start, end, size)
            self.event(receiver, dst_stage, "recv", m, start, end, size)
            self.bytes_moved += size
            self.at(end, lambda: arrivals.__setitem__(key, end))
            return end

        self.enqueue(self.links.setdefault(frozenset((src, dst)), _Channel()), job)


def pass_times(cm: CostModel, plan: Plan) -> tuple[dict[str, float], dict[str, float]]:
    """Forward and backward time of one micro-batch on each device of the plan: its layer times,
    or for a device with a beta split the time of each pass on its share of the device's
    resources."""
    fwd: dict[str, float] = {}
    bwd: dict[str, float] = {}
    for stage in plan.stages:
        a, e = stage.layers
        for dev in stage.devices:
            fwd[dev], bwd[dev] = split_pass_s(cm, cm.index(dev), a, e, plan.beta)
    return fwd, bwd


NO_SHARE_S = 1e9  # the pace of a replica given no micro-batches (finite, as a StageSpec's)


@dataclass(frozen=True)
class ScheduleInputs:
    """What a plan's action lists are built from, as the simulator builds them and as the
    server hands them to the agents (StageSpec): each replica's pace per micro-batch (replicas
    share micro-batches by it; under a beta split a device's passes overlap, so its pace is the
    slower of the two), the depths, and for each device on two lanes the fraction of its full
    speed each pass gets (its full-speed forward and backward over their times at its shares:
    what an emulated device paces each lane to)."""

    stage_devices: tuple[tuple[str, ...], ...]
    stage_times_s: tuple[tuple[float, ...], ...]
    inflight: tuple[int, ...]
    lag: tuple[int, ...]
    replica_inflight: Mapping[str, int]
    two_lanes: tuple[str, ...]
    lane_shares: Mapping[str, tuple[float, float]]


def schedule_inputs(cm: CostModel, plan: Plan) -> ScheduleInputs:
    fwd, bwd = pass_times(cm, plan)
    pace = {d: max(fwd[d], bwd[d]) if d in plan.two_lanes else fwd[d] + bwd[d] for d in fwd}
    if not synchronous(plan.schedule):
        # a replica pays its fixed cost for every micro-batch of its stage whoever owns it
        # (it applies every update): in the stage's period C it has C - f_d left for its
        # passes of p_d each, so its share is (C - f_d) / p_d (cost.shared_compute_s), which
        # assign_replicas gives it by the time p_d C / (C - f_d)
        for stage in plan.stages:
            if len(stage.devices) > 1 and not set(stage.devices) & plan.two_lanes:
                group = [cm.index(d) for d in stage.devices]
                period = cm.compute_s(stage.first, stage.last, group)
                for d in stage.devices:
                    fixed = cm.fixed_s(cm.index(d), stage.first, stage.last)
                    passes = pace[d] - fixed
                    if passes > 0 and period > fixed:
                        pace[d] = passes * period / (period - fixed)
                    elif fixed > 0:  # its updates alone take the period: no micro-batch
                        pace[d] = NO_SHARE_S
    shares: dict[str, tuple[float, float]] = {}
    for stage in plan.stages:
        for dev in stage.devices:
            if dev in plan.two_lanes:
                full_f, full_b = cm.pass_s(cm.index(dev), stage.first, stage.last)
                shares[dev] = (min(1.0, full_f / fwd[dev]) if fwd[dev] > 0 else 1.0,
                               min(1.0, full_b / bwd[dev]) if bwd[dev] > 0 else 1.0)
    num_stages = len(plan.stages)
    return ScheduleInputs(
        stage_devices=tuple(s.devices for s in plan.stages),
        stage_times_s=tuple(tuple(pace[d] for d in s.devices) for s in plan.stages),
        inflight=tuple(plan.inflight_for(k) for k in range(num_stages)),
        lag=tuple(plan.lag_for(k) for k in range(num_stages)),
        replica_inflight=MappingProxyType(dict(plan.replica_inflight or {})),
        two_lanes=tuple(sorted(plan.two_lanes)), lane_shares=MappingProxyType(shares))


def schedule_for(cm: CostModel, plan: Plan, *, microbatches: int, schedule: str | None = None,
                 flush_every: int | None = None) -> Schedule:
    """The action lists of a plan (:func:`schedule_inputs`)."""
    inputs = schedule_inputs(cm, plan)
    return build_schedule(name=schedule or plan.schedule, stage_devices=inputs.stage_devices,
                          stage_times_s=inputs.stage_times_s, microbatches=microbatches,
                          flush_every=flush_every, inflight=inputs.inflight, lag=inputs.lag,
                          replica_inflight=inputs.replica_inflight,
                          two_lanes=inputs.two_lanes)


def simulate(cm: CostModel, plan: Plan, *, microbatches: int, schedule: str | None = None,
             flush_every: int | None = None, run: int = 0) -> SimulationResult:
    """Simulate ``microbatches`` micro-batches of ``plan`` under ``schedule`` (default the
    plan's); GPipe and 1F1B-sync flush every ``flush_every`` micro-batches (default: the
    plan's micro-batches per batch)."""
    sched = schedule_for(cm, plan, microbatches=microbatches, schedule=schedule,
                         flush_every=flush_every or plan.microbatches)
    sim = _Simulation(cm, [(plan, sched)], (), run)
    sim.run_all()
    events, makespan, per_device = _outcome(sim, plan.device_ids, sched.name)
    total_idle = sum(b.idle_s for b in per_device.values())
    return SimulationResult(
        schedule=sched,
        events=events,
        makespan_s=makespan,
        throughput_sps=(microbatches * cm.profile.batch_size / makespan) if makespan > 0 else 0.0,
        bubble_fraction=(total_idle / (len(per_device) * makespan)) if makespan > 0 else 0.0,
        bytes_moved=sim.bytes_moved,
        devices=MappingProxyType(per_device),
    )


@dataclass(frozen=True)
class RunSimulation:
    """A run plan simulated: every pipeline's schedule, the events (with their pipeline), the
    makespan, each pipeline's samples per second, and each device's idle time."""

    schedules: tuple[Schedule, ...]
    events: tuple[TimelineEvent, ...]
    makespan_s: float
    throughput_sps: tuple[float, ...]
    bytes_moved: int
    devices: Mapping[str, IdleBreakdown]


def simulate_run(cm: CostModel, run_plan: RunPlan, *, run: int = 0) -> RunSimulation:
    """Simulate every pipeline of ``run_plan`` together: their stages on a shared device
    compute one pass at a time (in the order they become ready; the device's pipelines in
    pipeline order on a tie), transfers share links, and each aggregation group's members
    wait for one another at every round's end and average over a ring of their devices."""
    pipes = []
    for p, (plan, count) in enumerate(zip(run_plan.pipelines, run_plan.microbatches,
                                          strict=True)):
        inputs = schedule_inputs(cm, plan)
        pipes.append((plan, build_schedule(
            name=plan.schedule, stage_devices=inputs.stage_devices,
            stage_times_s=inputs.stage_times_s, microbatches=count,
            flush_every=plan.microbatches, inflight=inputs.inflight, lag=inputs.lag,
            replica_inflight=inputs.replica_inflight, two_lanes=inputs.two_lanes, pipeline=p,
            rounds=run_plan.rounds(p))))
    sim = _Simulation(cm, pipes, run_plan.groups, run)
    sim.run_all()
    events, makespan, per_device = _outcome(sim, run_plan.device_ids, run_plan.schedule)
    return RunSimulation(
        schedules=tuple(s for _, s in pipes), events=events, makespan_s=makespan,
        throughput_sps=tuple((count * cm.profile.batch_size / makespan) if makespan > 0 else 0.0
                             for count in run_plan.microbatches),
        bytes_moved=sim.bytes_moved, devices=MappingProxyType(per_device))


def _outcome(sim: _Simulation, devices: Sequence[str], schedule: str
             ) -> tuple[tuple[TimelineEvent, ...], float, dict[str, IdleBreakdown]]:
    events = tuple(sorted(sim.events, key=lambda e: (e.start, e.end, e.device, e.kind,
                                                     e.pipeline)))
    makespan = max((e.end for e in events), default=0.0)
    per_device = {d: idle_breakdown([e for e in events if e.device == d], window=(0.0, makespan),
                                    schedule=schedule)
                  for d in devices}
    return events, makespan, per_device
