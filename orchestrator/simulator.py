"""Discrete-event simulation of a plan: the oracle the tests, the dashboard's planned Gantt and
the runtime's expectations all come from.

Each device executes its action list (:mod:`orchestrator.schedule`) in order. A forward waits
for its activation, a backward for its gradient (the last stage for its own forward); after a
forward the activation crosses the link to the next stage's replica for that micro-batch, after
a backward the gradient crosses back. A link carries one transfer at a time in either direction
(the cost model's 2x boundary term), taking ``bytes / bandwidth + latency``. Replicas of a
stage share gradients as the schedule says: under GPipe they all-reduce over one shared channel
for ``Y`` seconds at each flush; under 1F1B a replica's ``A`` sends its micro-batch's gradient
(the stage's parameter bytes) to every other replica over their links, and a replica's update
of a micro-batch it does not own waits for that gradient. Under a Duan-Wu ``beta`` plan a device
with a split runs forwards and everything else on two lanes at once, each at the speed of its
share of the device's resources, with the forward gates of :func:`orchestrator.schedule.
forward_gates` (which weights a forward runs on, and what it waits for).

The result holds timeline events in the shared schema and a summary: makespan, throughput,
busy and idle time per device with the idle broken down
(:func:`orchestrator.events.idle_breakdown`), bubble fraction and bytes moved.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from orchestrator.cost import CostModel, split_pass_s
from orchestrator.events import IdleBreakdown, TimelineEvent, idle_breakdown
from orchestrator.formats import Plan
from orchestrator.schedule import Action, Schedule, build_schedule


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


class _Simulation:
    def __init__(self, cm: CostModel, plan: Plan, schedule: Schedule, run: int) -> None:
        self.cm, self.plan, self.schedule, self.run = cm, plan, schedule, run
        self.num_stages = len(plan.stages)
        self.now = 0.0
        self.heap: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.events: list[TimelineEvent] = []
        self.bytes_moved = 0
        self.activation_at: dict[tuple[int, int], float] = {}
        self.gradient_at: dict[tuple[int, int], float] = {}
        self.forward_done: dict[tuple[int, int], float] = {}
        self.shared_at: dict[tuple[str, int], float] = {}  # (replica, micro-batch): its gradient
        self.version_of: dict[int, int] = {}
        self.sync_arrived: dict[tuple[int, int], set[str]] = {}
        self.links: dict[frozenset[str], _Channel] = {}
        self.rings = [_Channel() for _ in plan.stages]
        self.fwd_s, self.bwd_s = pass_times(cm, plan)
        self.lanes: dict[str, list[_Lane]] = {}
        self.gates = {dev: schedule.gates(dev) for dev in schedule.actions}
        # how many of each device's actions other than forwards have started and finished
        self.others_started = {dev: 0 for dev in schedule.actions}
        self.others_finished = {dev: 0 for dev in schedule.actions}
        for dev, acts in schedule.actions.items():
            indexed = list(enumerate(acts))
            if dev in schedule.two_lanes:
                self.lanes[dev] = [_Lane([x for x in indexed if x[1].kind == "F"]),
                                   _Lane([x for x in indexed if x[1].kind != "F"])]
            else:
                self.lanes[dev] = [_Lane(indexed)]

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
        stuck = {d: str(lane.actions[lane.next][1]) for d, lanes in self.lanes.items()
                 for lane in lanes if not lane.done}
        if stuck:
            raise RuntimeError(f"the schedule deadlocks: waiting actions {stuck}")

    def advance_all(self) -> None:
        progress = True
        while progress:
            progress = False
            for dev, lanes in self.lanes.items():
                for lane in lanes:
                    while self.try_start(dev, lane):
                        progress = True

    # ---- readiness and execution of actions

    def version(self, stage: int, m: int) -> int:
        if self.schedule.name == "gpipe":
            return m // self.schedule.flush_every
        return self.version_of.get(m, 0)

    def ready(self, dev: str, position: int, action: Action) -> bool:
        k, m = action.stage, action.microbatch
        if action.kind == "F":
            gate = self.gates[dev][position]
            if (self.others_started[dev] < gate.started
                    or self.others_finished[dev] < gate.finished):
                return False
            return k == 0 or self.activation_at.get((k, m), float("inf")) <= self.now
        if action.kind == "B":
            if k == self.num_stages - 1:
                return self.forward_done.get((k, m), float("inf")) <= self.now
            return self.gradient_at.get((k, m), float("inf")) <= self.now
        if action.kind == "U" and self.shared(k, m, dev):
            return self.shared_at.get((dev, m), float("inf")) <= self.now
        return True  # A shares the gradients; U applies the update

    def shared(self, k: int, m: int, dev: str) -> bool:
        """Is this a 1F1B update of a micro-batch another replica owns (its gradient comes)?"""
        return (self.schedule.name == "1f1b" and len(self.plan.stages[k].devices) > 1
                and self.schedule.device_for(k, m) != dev)

    def try_start(self, dev: str, lane: _Lane) -> bool:
        if lane.done or lane.free_at > self.now:
            return False
        position, action = lane.actions[lane.next]
        if not self.ready(dev, position, action):
            return False
        lane.next += 1
        if action.kind != "F":
            self.others_started[dev] += 1
        getattr(self, f"start_{action.kind}")(dev, lane, position, action)
        return True

    def finished(self, dev: str, action: Action) -> None:
        if action.kind != "F":
            self.others_finished[dev] += 1

    def compute(self, dev: str, lane: _Lane, action: Action, kind: str, duration: float,
                then: Callable[[float], None]) -> None:
        start, end = self.now, self.now + duration
        lane.free_at = end
        k, m = action.stage, action.microbatch
        self.events.append(TimelineEvent(self.run, dev, k, kind, m, self.version(k, m), start, end))

        def done() -> None:
            self.finished(dev, action)
            then(end)
        self.at(end, done)

    def start_F(self, dev: str, lane: _Lane, position: int, action: Action) -> None:
        k, m = action.stage, action.microbatch
        if k == 0:
            self.version_of[m] = self.gates[dev][position].updates

        def done(end: float) -> None:
            self.forward_done[(k, m)] = end
            if k + 1 < self.num_stages:
                stage = self.plan.stages[k]
                self.transfer(dev, self.schedule.device_for(k + 1, m), m,
                              int(self.cm.output_bytes[stage.last]), self.activation_at,
                              (k + 1, m), src_stage=k, dst_stage=k + 1)

        self.compute(dev, lane, action, "forward", self.fwd_s[dev], done)

    def start_B(self, dev: str, lane: _Lane, position: int, action: Action) -> None:
        k, m = action.stage, action.microbatch

        def done(end: float) -> None:
            if k > 0:
                upstream = self.plan.stages[k - 1]
                self.transfer(dev, self.schedule.device_for(k - 1, m), m,
                              int(self.cm.output_bytes[upstream.last]), self.gradient_at,
                              (k - 1, m), src_stage=k, dst_stage=k - 1)

        self.compute(dev, lane, action, "backward", self.bwd_s[dev], done)

    def start_A(self, dev: str, lane: _Lane, position: int, action: Action) -> None:
        k, m = action.stage, action.microbatch
        stage = self.plan.stages[k]
        a, e = stage.layers
        if self.schedule.name == "1f1b":
            # the micro-batch's gradient to every other replica; the owner computes on
            size = int(self.cm.params_bytes(a, e))
            self.events.append(TimelineEvent(self.run, dev, k, "aggregate", m,
                                             self.version(k, m), self.now, self.now, size))
            for peer in stage.devices:
                if peer != dev:
                    self.transfer(dev, peer, m, size, self.shared_at, (peer, m), src_stage=k,
                                  dst_stage=k)
            self.finished(dev, action)
            return
        duration = self.cm.sync_s(a, e, [self.cm.index(d) for d in stage.devices])
        n = len(stage.devices)
        size = int(2 * (n - 1) / n * self.cm.params_bytes(a, e))
        self.collective_all_reduce(dev, lane, action, duration, size)

    def collective_all_reduce(self, dev: str, lane: _Lane, action: Action, duration: float,
                              size: int) -> None:
        """GPipe's flush: every replica of the stage waits for all of them, then for the
        all-reduce."""
        k, m = action.stage, action.microbatch
        lane.free_at = float("inf")
        devices = self.plan.stages[k].devices
        arrived = self.sync_arrived.setdefault((k, m), set())
        arrived.add(dev)
        if arrived != set(devices):
            return

        def job(start: float) -> float:
            end = start + duration
            for d in devices:
                self.events.append(TimelineEvent(self.run, d, k, "aggregate", m,
                                                 self.version(k, m), start, end, size))
                self.bytes_moved += size
            self.at(end, lambda: self.release(devices, action, end))
            return end

        self.enqueue(self.rings[k], job)

    def release(self, devices: tuple[str, ...], action: Action, end: float) -> None:
        for d in devices:
            self.finished(d, action)
            for lane in self.lanes[d]:
                if lane.free_at == float("inf"):
                    lane.free_at = end

    def start_U(self, dev: str, lane: _Lane, position: int, action: Action) -> None:
        self.finished(dev, action)  # the update's time is in the backward (the profile's)

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

    def transfer(self, src: str, dst: str, m: int, size: int, arrivals: dict[Any, float],
                 key: Any, *, src_stage: int, dst_stage: int) -> None:
        x, y = self.cm.index(src), self.cm.index(dst)
        duration = size / float(self.cm.bandwidth_bps[x, y]) + float(self.cm.latency_s[x, y])
        version = self.version(src_stage, m)

        def job(start: float) -> float:
            end = start + duration
            self.events.append(TimelineEvent(self.run, src, src_stage, "send", m, version, start,
                                             end, size))
            self.events.append(TimelineEvent(self.run, dst, dst_stage, "recv", m, version,
                                             start, end, size))
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
    plan's); GPipe flushes every ``flush_every`` micro-batches (default: the plan's
    micro-batches per batch)."""
    sched = schedule_for(cm, plan, microbatches=microbatches, schedule=schedule,
                         flush_every=flush_every or plan.microbatches)
    sim = _Simulation(cm, plan, sched, run)
    sim.run_all()
    events = tuple(sorted(sim.events, key=lambda e: (e.start, e.end, e.device, e.kind)))
    makespan = max((e.end for e in events), default=0.0)
    per_device = {d: idle_breakdown([e for e in events if e.device == d], window=(0.0, makespan),
                                    schedule=sched.name)
                  for d in plan.device_ids}
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
