"""Duan and Wu's pipeline planning: partition by binary search on the bottleneck, and resource
allocation per worker ("Resource allocation in pipeline parallelism", Algorithm 1 and the LP).

A worker is a device that runs a forward and a backward pass at once, splitting each of its
resources between them by beta (:mod:`orchestrator.allocation`); a virtual worker is a group of
devices serving one stage as data-parallel replicas, each with its own split, so the group's
rate is the sum of its devices' best rates. (Pooling one group's resources into a single LP
could put a device wholly on backward passes, which a replica that must run both passes of its
micro-batches cannot do.) The q virtual workers of the pipeline are in a fixed order. For a
bottleneck limit T, the greedy feasibility check (their Algorithm 1) gives each worker in turn
the longest run of layers whose stage time, replica sync and memory stay within T and whose
outgoing boundary transfer does too, leaving a layer for each later worker. Binary search on T
finds the smallest limit the check accepts; each success lowers the upper end to the period
actually reached, so the search ends on a stage or transfer time.
The greedy is linear in the number of layers but, with heterogeneous workers, a heuristic:
FTPipeHD's programme is exact for a fixed order.

When there are more devices than workers, :mod:`orchestrator.grouping` forms the groups.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from orchestrator.allocation import allocate_beta, best_rate
from orchestrator.cost import CostModel, beta_compute_s
from orchestrator.errors import PlanningError
from orchestrator.grouping import group_local_search
from orchestrator.partition.common import RawStage, check_plan_options, finish_plan
from orchestrator.planformat import Plan

_REL_TOL = 1e-9
_GAIN = 1e-6  # a split counts when it makes a device's stage at least this much faster


class _Worker:
    """Stage times of one virtual worker over layer ranges, with its best beta split."""

    def __init__(self, cm: CostModel, group: Sequence[int], k: int, q: int, *,
                 memory_scale: float = 1.0) -> None:
        self.cm, self.group = cm, tuple(group)
        devices = [cm.devices.devices[d] for d in group]
        ratios = [r.backward_speed / r.speed for dev in devices for r in dev.compute_resources]
        self.linear: np.ndarray | None = None
        fixed = any(dev.overhead_s or dev.message_s for dev in devices)
        if not fixed and all(dev.layer_times is None for dev in devices) and all(
                math.isclose(x, ratios[0], rel_tol=1e-9) for x in ratios):
            # one backward/forward ratio rho everywhere: each device's best rate is
            # 1 / (F / s_d + B / (rho s_d)), so C = F / sum speed + B / sum backward_speed,
            # additive over layers
            total_f = sum(r.speed for dev in devices for r in dev.compute_resources)
            total_b = sum(r.backward_speed for dev in devices for r in dev.compute_resources)
            self.linear = cm.ref_fwd_prefix / total_f + cm.ref_bwd_prefix / total_b
        self._cache: dict[tuple[int, int], float] = {}
        n = len(group)
        self.sync_per_byte = 0.0
        if n > 1:
            slowest = min(cm.bandwidth_bps[x, y] for x in group for y in group if x != y)
            self.sync_per_byte = 2.0 * (n - 1) / n / float(slowest)
        self.memory_prefix = (q - k) * (cm.param_prefix + cm.act_prefix) + 2.0 * cm.param_prefix
        self.memory_bytes = min(float(cm.memory_bytes[d]) for d in group) * memory_scale

    def compute_s(self, a: int, e: int) -> float:
        if self.linear is not None:
            return float(self.linear[e + 1] - self.linear[a])
        key = (a, e)
        if key not in self._cache:
            rate = sum(best_rate(*self.cm.resource_rates(a, e, [d])[1:])[0] for d in self.group)
            self._cache[key] = 0.0 if math.isinf(rate) else 1.0 / rate
        return self._cache[key]

    def time_s(self, a: int, e: int) -> float:
        return max(self.compute_s(a, e), self.sync_per_byte * self.cm.params_bytes(a, e))

    def last_end(self, a: int, limit: float) -> int:
        """The largest e with stage a..e within ``limit`` and memory (a - 1 if none)."""
        slack = limit * (1 + _REL_TOL) + 1e-15
        cm = self.cm
        ends = [int(np.searchsorted(self.memory_prefix,
                                    self.memory_prefix[a] + self.memory_bytes, side="right")) - 2]
        if self.sync_per_byte > 0:
            ends.append(int(np.searchsorted(cm.param_prefix,
                                            cm.param_prefix[a] + slack / self.sync_per_byte,
                                            side="right")) - 2)
        if self.linear is not None:
            ends.append(int(np.searchsorted(self.linear, self.linear[a] + slack,
                                            side="right")) - 2)
            return min(min(ends), cm.num_layers - 1)
        last = min(min(ends), cm.num_layers - 1)
        e = a - 1
        while e + 1 <= last and self.compute_s(a, e + 1) <= slack:  # monotone in e
            e += 1
        return e


class _Pipeline:
    def __init__(self, cm: CostModel, groups: Sequence[Sequence[int]], *,
                 memory_scale: float = 1.0) -> None:
        q = len(groups)
        if q > cm.num_layers:
            raise PlanningError(f"{q} workers but only {cm.num_layers} layers")
        self.cm, self.groups = cm, [tuple(g) for g in groups]
        self.workers = [_Worker(cm, g, k, q, memory_scale=memory_scale)
                        for k, g in enumerate(groups)]
        self.boundary = [
            np.array([cm.boundary_s(e, groups[k], groups[k + 1])
                      for e in range(cm.num_layers - 1)])
            for k in range(q - 1)
        ]

    def greedy(self, limit: float) -> tuple[list[int], float] | None:
        """Algorithm 1's check: the cut after each worker and the period reached, or None."""
        num_layers, q = self.cm.num_layers, len(self.workers)
        slack = limit * (1 + _REL_TOL) + 1e-15
        cuts: list[int] = []
        reached = 0.0
        start = 0
        for k, worker in enumerate(self.workers):
            last = min(worker.last_end(start, limit), num_layers - 1 - (q - 1 - k))
            if k == q - 1:
                if last < num_layers - 1:
                    return None
                end = num_layers - 1
            else:
                end = last
                while end >= start and self.boundary[k][end] > slack:
                    end -= 1
                if end < start:
                    return None
                reached = max(reached, float(self.boundary[k][end]))
            reached = max(reached, worker.time_s(start, end))
            cuts.append(end)
            start = end + 1
        return cuts, reached

    def search(self) -> tuple[list[int], float]:
        found = self.greedy(math.inf)
        if found is None:
            raise PlanningError("no partition over these workers fits in their memory")
        cuts, reached = found
        low, high = 0.0, reached
        for _ in range(200):
            if high - low <= high * _REL_TOL:
                break
            middle = (low + high) / 2
            attempt = self.greedy(middle)
            if attempt is None:
                low = middle
            else:
                cuts, reached = attempt
                # the check admits stages a hair (the tolerance) over the limit
                high = min(reached, middle)
        return cuts, reached

    def raw_stages(self, cuts: Sequence[int]) -> list[RawStage]:
        starts = [0, *[c + 1 for c in cuts[:-1]]]
        return [(a, e, g) for a, e, g in zip(starts, cuts, self.groups, strict=True)]


def partition_period(cm: CostModel, groups: Sequence[Sequence[int]]) -> float:
    """The period Duan-Wu's partition reaches with these workers in this order (inf if none
    fits in memory): the objective of the grouping search."""
    try:
        return _Pipeline(cm, groups).search()[1]
    except PlanningError:
        return math.inf


def partition_overflow(cm: CostModel, groups: Sequence[Sequence[int]]) -> float:
    """How far the groups are from fitting: the smallest factor by which the devices' memory
    would have to grow for the feasibility check to find a partition (<= 1: it fits). It grades
    the groupings :func:`partition_period` scores as infinite, so a search can walk towards
    one that fits."""
    if len(groups) > cm.num_layers:
        return math.inf

    def fits(scale: float) -> bool:
        return _Pipeline(cm, groups, memory_scale=scale).greedy(math.inf) is not None

    high = 1.0
    while not fits(high):
        high *= 2.0
    low = high / 2.0 if high > 1.0 else 0.0
    for _ in range(40):
        if high - low <= high * 1e-6:
            break
        middle = (low + high) / 2.0
        if fits(middle):
            high = middle
        else:
            low = middle
    return high


def partition(cm: CostModel, groups: Sequence[Sequence[int]]) -> list[RawStage]:
    pipeline = _Pipeline(cm, groups)
    return pipeline.raw_stages(pipeline.search()[0])


def beta_for(cm: CostModel, raw: Sequence[RawStage]
             ) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Each device's forward share of each of its resources for its stage (the LP, per
    worker), for the devices where running both passes at once beats running them one after
    the other; and a note naming the others. On a single resource (or several with the same
    backward/forward ratio) the split's best is the sequential rate: such a device runs its
    passes one after the other, and the plan says so rather than pretend to a split."""
    beta: dict[str, dict[str, float]] = {}
    sequential: list[str] = []
    for a, e, group in raw:
        for d in group:
            names, rf, rb = cm.resource_rates(a, e, [d])
            fractions = allocate_beta(rf, rb)
            split_s = beta_compute_s(rf, rb, fractions)
            if split_s < cm.device_s(d, a, e) * (1 - _GAIN):
                for (dev_id, kind), fraction in zip(names, fractions, strict=True):
                    beta.setdefault(dev_id, {})[kind] = fraction
            else:
                sequential.append(cm.devices.ids[d])
    notes = []
    if sequential:
        notes.append(f"beta brings nothing on {', '.join(sequential)}: a forward/backward split "
                     "of a single resource (or of resources alike) is no faster than running "
                     "the passes one after the other, so "
                     f"{'it runs' if len(sequential) == 1 else 'they run'} them sequentially")
    return beta, notes


def plan_duanwu(cm: CostModel, *, schedule: str = "1f1b", microbatches: int = 8,
                workers: int | None = None) -> Plan:
    """Duan-Wu end to end: for q workers (every q up to the device count unless given), group the
    devices (local search), partition by binary search, allocate beta; keep the best q."""
    check_plan_options(schedule=schedule, microbatches=microbatches)
    n = cm.num_devices
    if workers is not None and not 1 <= workers <= min(n, cm.num_layers):
        raise ValueError(f"workers must be between 1 and {min(n, cm.num_layers)} "
                         f"(devices and layers), got {workers}")
    started = time.perf_counter()
    choices = [workers] if workers is not None else range(1, min(n, cm.num_layers) + 1)
    best: tuple[float, list[RawStage]] | None = None
    for q in choices:
        groups = ([[d] for d in range(n)] if q == n
                  else group_local_search(n, q, objective=lambda g: partition_period(cm, g),
                                          overflow=lambda g: partition_overflow(cm, g),
                                          speeds=[d.speed for d in cm.devices.devices]))
        period = partition_period(cm, groups)
        if math.isfinite(period) and (best is None or period < best[0]):
            best = (period, partition(cm, groups))
    if best is None:
        raise PlanningError("no grouping of these devices fits the model in memory")
    raw = best[1]
    beta, notes = beta_for(cm, raw)
    return finish_plan(cm, raw, algorithm="duanwu", schedule=schedule, microbatches=microbatches,
                       started=started, beta=beta or None, notes=notes)
