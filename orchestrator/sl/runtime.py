"""From measurements to a split-learning study, and from its schedule to what agents run.

Tirana, Tsigkari, Iosifidis and Chatzopoulos, "Workflow Optimization for Parallel Split
Learning" (IEEE INFOCOM 2024), Section III. Each client j trains part-1 (layers 0..sigma1)
and part-3 (sigma2+1..L-1) of the model and offloads part-2 (sigma1+1..sigma2) to a helper.

- :class:`SplitCuts` are the two cut layers, for the whole run or one per client;
- :func:`instance_from_measurements` is the paper's model of one batch built from the shared
  formats (per-layer profile, devices and links) through :mod:`orchestrator.cost`, so the
  study, the pipeline planners and the simulator price a layer and a transfer alike;
- :func:`split_run_plan` is the run agents train under a schedule (one U-shaped pipeline per
  client, FedAvg of every part each round);
- :func:`helper_task_order` is the order in which a helper serves its clients' tasks under a
  schedule; :func:`predicted_makespan_s` the schedule's batch makespan in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.cost import CostModel, build_cost_model
from orchestrator.formats import SCHEDULES, DeviceSet, ModelProfile, synchronous
from orchestrator.planformat import Plan, Stage
from orchestrator.runplan import AggregationGroup, RunPlan
from orchestrator.sl.check import check_schedule
from orchestrator.sl.formats import Instance, Matrix, Schedule
from orchestrator.sl.machine import runs

ALGORITHM = "sflwo"
MEMORY_UNIT = "MB"
MEMORY_UNIT_BYTES = 1_000_000
TASK_KINDS = ("forward", "backward")
_SLOT_TOLERANCE = 1e-9
"""A time a hair over a whole number of slots from floating-point sums (0.1 + 0.2 s) is that
number of slots, not one more."""


@dataclass(frozen=True)
class SplitCuts:
    """The last layer of part-1 (``sigma1``) and of part-2 (``sigma2``), counted from 0.

    Constructing checks what holds for any model (part-1 and part-2 not empty);
    :func:`cuts_per_client` checks the cuts against a model's layers (part-3 not empty)."""

    sigma1: int
    sigma2: int

    def __post_init__(self) -> None:
        found = _cut_problem(self.sigma1, self.sigma2, num_layers=None)
        if found is not None:
            raise ValueError(f"{found[0]}: {found[1]}")

    def parts(self, num_layers: int) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """The inclusive layer ranges of part-1, part-2 and part-3."""
        return ((0, self.sigma1), (self.sigma1 + 1, self.sigma2),
                (self.sigma2 + 1, num_layers - 1))

    def to_json(self) -> dict[str, int]:
        return {"sigma1": self.sigma1, "sigma2": self.sigma2}


Cuts = SplitCuts | Sequence[SplitCuts]


def _cut_problem(sigma1: Any, sigma2: Any, *, num_layers: int | None) -> tuple[str, str] | None:
    """(field, reason) of the first thing wrong with a pair of cuts, or None."""
    for name, value in (("sigma1", sigma1), ("sigma2", sigma2)):
        if isinstance(value, bool) or not isinstance(value, int):
            return name, f"must be an integer layer index, got {value!r}"
    if sigma1 < 0:
        return "sigma1", f"must be at least 0 (part-1 holds layers 0..sigma1), got {sigma1}"
    if sigma2 <= sigma1:
        return "sigma2", (f"must be after sigma1 ({sigma1}) so that part-2 (layers "
                          f"sigma1+1..sigma2) is not empty, got {sigma2}")
    if num_layers is not None and sigma2 > num_layers - 2:
        return "sigma2", (f"must be at most {num_layers - 2} so that part-3 (layers "
                          f"sigma2+1..{num_layers - 1}) is not empty, got {sigma2}")
    return None


def cuts_per_client(cuts: Cuts, *, clients: int, num_layers: int) -> tuple[SplitCuts, ...]:
    """One :class:`SplitCuts` per client: the run's cuts repeated, or the clients' own (one
    each, in client order), each checked against a model of ``num_layers`` layers."""
    if num_layers < 3:
        raise ValueError(f"num_layers: split learning cuts a model into three non-empty parts, "
                         f"so it needs 3 layers at least, got {num_layers}")
    if isinstance(cuts, SplitCuts):
        each: tuple[SplitCuts, ...] = (cuts,) * clients
        names = ["cuts"] * clients
    else:
        each = tuple(cuts)
        if len(each) != clients:
            raise ValueError(f"cuts: has {len(each)} entries but there are {clients} clients "
                             "(give one SplitCuts for the run or one per client)")
        names = [f"cuts[{j}]" for j in range(clients)]
    for where, item in zip(names, each, strict=True):
        if not isinstance(item, SplitCuts):
            raise ValueError(f"{where}: must be a SplitCuts, got {type(item).__name__}")
        found = _cut_problem(item.sigma1, item.sigma2, num_layers=num_layers)
        if found is not None:
            raise ValueError(f"{where}.{found[0]}: {found[1]}")
    return each


def check_roles(*, clients: Sequence[str], helpers: Sequence[str],
                known: Sequence[str] | None = None) -> None:
    """Raise ValueError naming the field unless there is a client and a helper, no device
    twice, none both client and helper, and (given ``known``) every one a known device."""
    seen: dict[str, str] = {}
    for field_name, ids in (("clients", clients), ("helpers", helpers)):
        if isinstance(ids, str):
            raise ValueError(f"{field_name}: must be a list of device ids, not one string "
                             f"({ids!r})")
        if not ids:
            raise ValueError(f"{field_name}: needs at least one device")
        for k, dev in enumerate(ids):
            where = f"{field_name}[{k}]"
            if not isinstance(dev, str) or not dev:
                raise ValueError(f"{where}: must be a device id, got {dev!r}")
            if known is not None and dev not in known:
                raise ValueError(f"{where}: {dev!r} is not a device of the device set")
            if dev in seen:
                role = "a client" if seen[dev] == "clients" else "a helper"
                again = "repeated" if seen[dev] == field_name else f"also {role}"
                raise ValueError(f"{where}: {dev!r} is {again}; a device is one client or "
                                 "one helper")
            seen[dev] = field_name


def _slots(seconds: float, slot_ms: float, *, minimum: int = 0) -> int:
    """Whole slots covering ``seconds`` (a task occupies every slot it touches)."""
    return max(minimum, math.ceil(seconds * 1000.0 / slot_ms * (1 - _SLOT_TOLERANCE)))


def _one_way_s(cm: CostModel, layer: int, a: int, b: int) -> float:
    """One transfer of the output of ``layer`` (or its gradient, the same size) between
    devices a and b: half the cost model's boundary term, which counts both directions."""
    return cm.boundary_s(layer, [a], [b]) / 2


def batch_times_s(cm: CostModel, *, client: str, helper: str,
                  cuts: SplitCuts) -> dict[str, float]:
    """The paper's six times of one batch of ``client`` served by ``helper``, in seconds, keyed
    by the instance's matrix names. Passes are the cost model's (the device's measured or
    speed-scaled layer times, its per-micro-batch overhead and message costs); a transfer is
    bytes over the link's bandwidth plus its latency."""
    j, i = cm.index(client), cm.index(helper)
    (a1, e1), (a2, e2), (a3, e3) = cuts.parts(cm.num_layers)
    fwd1, bwd1 = cm.pass_s(j, a1, e1)
    fwd2, bwd2 = cm.pass_s(i, a2, e2)
    fwd3, bwd3 = cm.pass_s(j, a3, e3)
    cut1, cut2 = _one_way_s(cm, e1, j, i), _one_way_s(cm, e2, i, j)
    return {"r": fwd1 + cut1, "p": fwd2, "l": cut2 + fwd3, "lp": bwd3 + cut2, "pp": bwd2,
            "rp": cut1 + bwd1}


def part2_demand_bytes(cm: CostModel, cuts: SplitCuts) -> float:
    """The memory a helper needs for one client's part-2 copy: the cost model's count for the
    middle stage of a three-stage pipeline (stashed weights and activations, the weights and
    their gradients)."""
    _, (a2, e2), _ = cuts.parts(cm.num_layers)
    return cm.memory_need_bytes(a2, e2, 1, 3)


def instance_from_measurements(*, profile: ModelProfile, devices: DeviceSet,
                               clients: Sequence[str], helpers: Sequence[str], cuts: Cuts,
                               slot_ms: float, name: str) -> Instance:
    """The split-learning study of one batch (Section III) from measured per-layer profiles
    and links: for client j on helper i, ``r`` = j's part-1 forward + the cut-1 activation's
    upload, ``p`` = i's part-2 forward, ``l`` = the cut-2 activation's download + j's part-3
    forward and loss, ``lp`` = j's part-3 backward + the cut-2 gradient's upload, ``pp`` = i's
    part-2 backward, ``rp`` = the cut-1 gradient's download + j's part-1 backward
    (:func:`batch_times_s`), each rounded up to whole slots of ``slot_ms``, ``p`` and ``pp``
    at least one. ``demand`` is each client's part-2 memory rounded up and ``capacity`` each
    helper's memory rounded down, in MB (10^6 bytes), so that an assignment the study accepts
    fits in bytes too. A helper that cannot hold any client, or a client no helper can hold,
    is refused: the study would only be infeasible."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name: must be a non-empty string, got {name!r}")
    if isinstance(slot_ms, bool) or not isinstance(slot_ms, (int, float)) \
            or not math.isfinite(slot_ms) or slot_ms <= 0:
        raise ValueError(f"slot_ms: must be a positive number of milliseconds, got {slot_ms!r}")
    check_roles(clients=clients, helpers=helpers, known=devices.ids)
    each = cuts_per_client(cuts, clients=len(clients), num_layers=profile.num_layers)
    cm = build_cost_model(profile, devices)
    times = [[batch_times_s(cm, client=c, helper=h, cuts=each[j]) for h in helpers]
             for j, c in enumerate(clients)]

    def matrix(key: str, minimum: int) -> Matrix:
        return tuple(tuple(_slots(row[i][key], slot_ms, minimum=minimum)
                           for i in range(len(helpers))) for row in times)

    demand = tuple(float(math.ceil(part2_demand_bytes(cm, c) / MEMORY_UNIT_BYTES)) for c in each)
    capacity = tuple(float(devices.device(h).memory_bytes // MEMORY_UNIT_BYTES) for h in helpers)
    for i, h in enumerate(helpers):
        if capacity[i] < min(demand):
            raise ValueError(f"helpers[{i}]: {h!r} has {capacity[i]:g} {MEMORY_UNIT} of memory, "
                             f"less than the smallest client's part-2 ({min(demand):g} "
                             f"{MEMORY_UNIT}): it can serve no client")
    for j, c in enumerate(clients):
        if demand[j] > max(capacity):
            raise ValueError(f"clients[{j}]: {c!r} needs {demand[j]:g} {MEMORY_UNIT} for its "
                             f"part-2 but the largest helper has {max(capacity):g} "
                             f"{MEMORY_UNIT}")
    return Instance(
        name=name, slot_ms=float(slot_ms), clients=len(clients), helpers=len(helpers),
        r=matrix("r", 0), p=matrix("p", 1), l=matrix("l", 0), lp=matrix("lp", 0),
        pp=matrix("pp", 1), rp=matrix("rp", 0), demand=demand, capacity=capacity,
        memory_unit=MEMORY_UNIT,
        source=f"measurements: profile {profile.model!r} (batch {profile.batch_size})")


def _counts(values: Sequence[Any], field_name: str, *, length: int) -> tuple[int, ...]:
    """Positive integers, one per client."""
    if isinstance(values, str) or len(values) != length:
        got = "a string" if isinstance(values, str) else f"{len(values)} entries"
        raise ValueError(f"{field_name}: needs one positive integer per client ({length}), "
                         f"got {got}")
    for k, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{field_name}[{k}]: must be a positive integer, got {v!r}")
    return tuple(values)


def split_run_plan(*, schedule: Schedule, cuts: Cuts, clients: Sequence[str],
                   helpers: Sequence[str], num_layers: int,
                   microbatches_per_round: Sequence[int], rounds: int, samples: Sequence[int],
                   schedule_name: str = "gpipe") -> RunPlan:
    """The run agents train under ``schedule``: pipeline j is client j's U (stage 0 = part-1 on
    the client, stage 1 = part-2 on its helper ``schedule.assignment[j]``, stage 2 = part-3 on
    the client again), training ``rounds`` rounds of ``microbatches_per_round[j]`` micro-batches
    (batches of the paper); each updates after every micro-batch, as the paper's batch
    update does, so a pipeline's plan flushes every micro-batch under a synchronous schedule.
    Aggregation groups average, at the end of every round and weighted by the clients'
    ``samples``, the copies of each part that hold the same layers: with the run's cuts the
    clients' part-1, the helpers' part-2 copies (one per client, also on a shared helper) and
    the clients' part-3; with per-client cuts one group per distinct layer range, a copy
    held by one client alone staying out of any group."""
    check_roles(clients=clients, helpers=helpers)
    each = cuts_per_client(cuts, clients=len(clients), num_layers=num_layers)
    if schedule_name not in SCHEDULES or not synchronous(schedule_name):
        allowed = ", ".join(s for s in SCHEDULES if synchronous(s))
        raise ValueError(f"schedule_name: must be a synchronous schedule ({allowed}), got "
                         f"{schedule_name!r}")
    if len(schedule.assignment) != len(clients):
        raise ValueError(f"schedule.assignment: has {len(schedule.assignment)} entries but "
                         f"there are {len(clients)} clients")
    for j, i in enumerate(schedule.assignment):
        if not 0 <= i < len(helpers):
            raise ValueError(f"schedule.assignment[{j}]: helper {i} is not one of the "
                             f"{len(helpers)} helpers")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds: must be a positive integer, got {rounds!r}")
    per_round = _counts(microbatches_per_round, "microbatches_per_round", length=len(clients))
    weights = _counts(samples, "samples", length=len(clients))
    pipelines = tuple(
        Plan(algorithm=ALGORITHM, schedule=schedule_name, microbatches=1, stages=tuple(
            Stage(layers=part, devices=(dev,)) for part, dev in zip(
                each[j].parts(num_layers), (c, helpers[schedule.assignment[j]], c),
                strict=True)))
        for j, c in enumerate(clients))
    groups: list[AggregationGroup] = []
    for k in range(3):
        holders: dict[tuple[int, int], list[int]] = {}
        for j, plan in enumerate(pipelines):
            holders.setdefault(plan.stages[k].layers, []).append(j)
        groups.extend(AggregationGroup(members=tuple((j, k) for j in members),
                                       every=tuple(per_round[j] for j in members),
                                       weights=tuple(float(weights[j]) for j in members))
                      for members in holders.values() if len(members) > 1)
    return RunPlan(pipelines=pipelines, microbatches=tuple(n * rounds for n in per_round),
                   groups=tuple(groups))


@dataclass(frozen=True)
class HelperTask:
    """One task a helper runs for a client: its forward or backward of the client's part-2,
    in the half-open slot ranges ``segments`` (several when the schedule preempts it)."""

    client: int
    kind: str
    segments: tuple[tuple[int, int], ...]

    @property
    def start(self) -> int:
        return self.segments[0][0]

    @property
    def end(self) -> int:
        return self.segments[-1][1]

    @property
    def slots(self) -> int:
        return sum(b - a for a, b in self.segments)

    def to_json(self) -> dict[str, Any]:
        return {"client": self.client, "kind": self.kind,
                "segments": [list(s) for s in self.segments]}


def helper_task_order(*, instance: Instance, schedule: Schedule,
                      helper: int) -> tuple[HelperTask, ...]:
    """The tasks ``helper`` runs under a feasible ``schedule``, in the order it starts them
    (first segment's start; ties, which a feasible schedule cannot have on one helper, by
    client, forward first). Adjacent segments of a task are one run. This is the order the
    agent acting as that helper follows."""
    if isinstance(helper, bool) or not isinstance(helper, int) \
            or not 0 <= helper < instance.helpers:
        raise ValueError(f"helper: must be a helper of the instance (0..{instance.helpers - 1}),"
                         f" got {helper!r}")
    check_schedule(instance=instance, schedule=schedule)
    tasks = []
    for kind, segments in zip(TASK_KINDS, (schedule.forward, schedule.backward), strict=True):
        for j in sorted({s.client for s in segments if s.helper == helper}):
            slots = sorted(t for s in segments if (s.helper, s.client) == (helper, j)
                           for t in range(s.start, s.end))
            tasks.append(HelperTask(client=j, kind=kind, segments=tuple(runs(tuple(slots)))))
    return tuple(sorted(tasks, key=lambda t: (t.start, t.client, TASK_KINDS.index(t.kind))))


def predicted_makespan_s(*, schedule: Schedule, instance: Instance) -> float:
    """The schedule's batch makespan in seconds: its slots times the instance's slot length."""
    if schedule.instance is not None and schedule.instance != instance.name:
        raise ValueError(f"schedule: is for instance {schedule.instance!r}, not "
                         f"{instance.name!r}")
    return schedule.makespan * instance.slot_ms / 1000.0
