"""The exact best pipeline over any subset and order of the devices (beyond the papers).

FTPipeHD and PipeDream cut the layers over the devices in a given order. ``optimal`` also
chooses which devices to use and in which order, one device per stage, memory-aware, and
minimises the cost model's period.

Method: the optimal period is one of finitely many values (a stage's compute time on some
device, or a boundary transfer between two devices), so it is found by binary search over those
candidates with a feasibility test for a period T. The test is a dynamic programme over device
subsets run *backwards* from the last layer, so that a stage knows how many stages follow it and
therefore its memory need (S - k)(P + A) + 2P:

    reach[U][d][a] = layers a..L-1 can be served by the devices U, in some order, d first,

with every stage time, boundary and memory within bounds. Prepending device d' to a suffix that
starts at cut p with device d needs the boundary d'->d at p within T and a start a >= g(d', |U|+1,
p), the smallest feasible start of a stage ending at p. g is non-decreasing in p, so a is
reachable iff the *next* reachable cut after a admits it: one suffix-minimum per transition, all
cuts at once in numpy. The cost is O(2^N N^2 L) per test and about log2(N L^2) tests.

Beyond ``EXACT_MAX_DEVICES`` devices the subset programme grows too large; the planner then runs
it on the fastest devices and also cuts over all devices sorted by speed, keeps the better plan,
and proves a lower bound by a linear relaxation (each layer split fractionally over the devices,
no device busier than T), so the answer says how far from optimal it can be at most.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from scipy.optimize import linprog

from orchestrator.cost import CostModel, evaluate, messages_table
from orchestrator.errors import PlanningError
from orchestrator.partition.common import RawStage, check_plan_options, finish_plan, to_stages
from orchestrator.partition.ordered import ordered_dp
from orchestrator.planformat import Bound, Plan

EXACT_MAX_DEVICES = 12
_REL_TOL = 1e-9

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


class _SubsetSearch:
    """The feasibility programme for a fixed list of candidate devices (indices into ``cm``)."""

    def __init__(self, cm: CostModel, devs: Sequence[int]) -> None:
        self.cm = cm
        self.devs = list(devs)
        n, num_layers = len(self.devs), cm.num_layers
        self.n, self.num_layers = n, num_layers
        self.work = cm.work_prefix[self.devs]  # [n, L+1]
        self.overhead = cm.overhead_s[self.devs]  # [n]
        self.per_message = cm.message_s[self.devs]  # [n]
        # memory: smallest start of a stage ending at cut p on device i with r stages from it on
        mem_start = np.zeros((n, n + 1, num_layers + 1), dtype=np.int64)
        pa = cm.param_prefix + cm.act_prefix
        for r in range(1, n + 1):
            need = r * pa + 2.0 * cm.param_prefix
            for i, d in enumerate(self.devs):
                mem_start[i, r] = np.searchsorted(need, need - cm.memory_bytes[d], side="left")
        self.mem_start = mem_start
        # boundary transfer at cut p (1..L-1) from device i to device j; inf where no cut
        comm = np.full((n, n, num_layers + 1), np.inf)
        for i, x in enumerate(self.devs):
            for j, y in enumerate(self.devs):
                if i != j:
                    comm[i, j, 1:num_layers] = 2.0 * (
                        cm.output_bytes[: num_layers - 1] / cm.bandwidth_bps[x, y]
                        + cm.latency_s[x, y])
        self.comm = comm
        masks = np.arange(1 << n)
        popcount = np.array([bin(int(m)).count("1") for m in masks])
        self.by_level = [masks[popcount == k] for k in range(n + 1)]

    def candidates(self) -> npt.NDArray[np.float64]:
        """Every value the optimal period can take: stage compute times and transfers."""
        values = [self.comm[np.isfinite(self.comm)]]
        upper = np.triu_indices(self.num_layers + 1, k=1)
        messages = messages_table(self.num_layers)[upper]
        for row, overhead, per in zip(self.work, self.overhead, self.per_message, strict=True):
            diffs = row[None, :] - row[:, None]  # [start, end]
            values.append(diffs[upper] + overhead + per * messages)
        return np.unique(np.concatenate(values))

    def _start(self, limit: float) -> IntArray:
        """g[c, i, r, p]: smallest start a of a stage a..p-1 on device i that fits ``limit``,
        for a stage after the first (c = 0) and for the first (c = 1, where only a = 0 counts):
        they send different numbers of messages when they end the model (cost.stage_messages),
        so each has its own table, non-decreasing in p before the last cut."""
        slack = limit * _REL_TOL + 1e-15
        last = np.arange(self.num_layers + 1) == self.num_layers
        tables = []
        for messages in (np.where(last, 1, 2), np.where(last, 0, 1)):
            # a device whose fixed cost alone exceeds the limit gets starts past every end
            comp = np.stack([
                np.searchsorted(row, row - (limit + slack - overhead - per * messages),
                                side="left")
                for row, overhead, per in zip(self.work, self.overhead, self.per_message,
                                              strict=True)])
            tables.append(np.maximum(self.mem_start, comp[:, None, :]))
        start: IntArray = np.stack(tables)
        return start

    def reach(self, limit: float, *, stop_early: bool) -> tuple[bool, BoolArray, IntArray,
                                                                BoolArray]:
        n, num_layers = self.n, self.num_layers
        start = self._start(limit)
        later, first = start[0], start[1]
        ok_cut = self.comm <= limit * (1 + _REL_TOL) + 1e-15  # [from, to, p]
        positions = np.arange(num_layers + 1)
        reach = np.zeros((1 << n, n, num_layers + 1), dtype=bool)
        for i in range(n):
            reach[1 << i, i, 1:num_layers] = positions[1:num_layers] >= later[i, 1, num_layers]
            reach[1 << i, i, 0] = first[i, 1, num_layers] <= 0
        if stop_early and reach[:, :, 0].any():
            return True, reach, start, ok_cut
        none = num_layers + 1
        for level in range(1, n):
            for i in range(n):
                masks = self.by_level[level]
                masks = masks[(masks >> i) & 1 == 0]
                if masks.size == 0:
                    continue
                ends = (reach[masks] & ok_cut[i][None, :, :]).any(axis=1)  # [m, L+1]
                marked = np.where(ends, positions, none)
                suffix = np.minimum.accumulate(marked[:, ::-1], axis=1)[:, ::-1]
                nxt = np.full_like(suffix, none)
                nxt[:, :-1] = suffix[:, 1:]
                g = later[i, level + 1][np.minimum(nxt, num_layers)]
                fits = (nxt < none) & (g <= positions)
                g_first = first[i, level + 1][np.minimum(nxt[:, 0], num_layers)]
                fits[:, 0] = (nxt[:, 0] < none) & (g_first <= 0)
                reach[masks | (1 << i), i] = fits
            if stop_early and reach[self.by_level[level + 1]][:, :, 0].any():
                return True, reach, start, ok_cut
        return bool(reach[:, :, 0].any()), reach, start, ok_cut

    def solve(self) -> list[RawStage] | None:
        """The stages of a plan with the smallest feasible period, or None if none fits.

        Feasible at +inf (only memory binds) is feasible at the largest candidate, since every
        stage time and transfer of any plan is a candidate.
        """
        if not self.reach(np.inf, stop_early=True)[0]:
            return None
        values = self.candidates()
        lo, hi = 0, values.size - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.reach(float(values[mid]), stop_early=True)[0]:
                hi = mid
            else:
                lo = mid + 1
        return self._rebuild(float(values[hi]))

    def _rebuild(self, limit: float) -> list[RawStage]:
        feasible, reach, start, ok_cut = self.reach(limit, stop_early=False)
        assert feasible
        num_layers = self.num_layers
        # the smallest set of devices that reaches layer 0, first found
        for level in range(1, self.n + 1):
            rows, firsts = np.nonzero(reach[self.by_level[level], :, 0])
            if rows.size:
                mask, i = int(self.by_level[level][rows[0]]), int(firsts[0])
                break
        raw: list[RawStage] = []
        a = 0
        while True:
            size = bin(mask).count("1")
            if size == 1:
                raw.append((a, num_layers - 1, (self.devs[i],)))
                return raw
            rest = mask & ~(1 << i)
            nxt = self._next_stage(reach, start, ok_cut, i, size, rest, a)
            p, j = nxt
            raw.append((a, p - 1, (self.devs[i],)))
            mask, i, a = rest, j, p

    def _next_stage(self, reach: BoolArray, start: IntArray, ok_cut: BoolArray,
                    i: int, size: int, rest: int, a: int) -> tuple[int, int]:
        table = start[1] if a == 0 else start[0]
        for p in range(a + 1, self.num_layers):
            if table[i, size, p] > a:
                break  # start is non-decreasing in p: no later cut fits either
            for j in range(self.n):
                if (rest >> j) & 1 and reach[rest, j, p] and ok_cut[i, j, p]:
                    return p, j
        raise AssertionError("feasibility table is inconsistent")  # pragma: no cover


def lower_bound_s(cm: CostModel) -> float:
    """A proven lower bound on the period of any one-device-per-stage plan: each layer may be
    split over devices, no device busier than T (an LP), and no layer faster than on its best
    device."""
    per_layer = np.diff(cm.work_prefix, axis=1)  # [N, L]
    single = float(per_layer.min(axis=0).max())
    n, num_layers = per_layer.shape
    # variables: x[d, l] (d-major) then T
    cost = np.zeros(n * num_layers + 1)
    cost[-1] = 1.0
    a_eq = np.zeros((num_layers, n * num_layers + 1))
    for layer in range(num_layers):
        a_eq[layer, layer: n * num_layers: num_layers] = 1.0
    a_ub = np.zeros((n, n * num_layers + 1))
    for d in range(n):
        a_ub[d, d * num_layers:(d + 1) * num_layers] = per_layer[d]
        a_ub[d, -1] = -1.0
    result = linprog(cost, A_ub=a_ub, b_ub=np.zeros(n), A_eq=a_eq, b_eq=np.ones(num_layers),
                     bounds=[(0.0, 1.0)] * (n * num_layers) + [(0.0, None)], method="highs")
    relaxed = float(result.fun) * (1 - 1e-9) if result.status == 0 else 0.0
    return max(single, relaxed)


def optimal_stages(cm: CostModel, *, exact_max_devices: int = EXACT_MAX_DEVICES
                   ) -> tuple[list[RawStage], bool]:
    """The stages of the best plan and whether they are proven optimal."""
    n = cm.num_devices
    if n <= exact_max_devices:
        raw = _SubsetSearch(cm, range(n)).solve()
        if raw is None:
            raise PlanningError("no plan over any subset of these devices fits in their memory")
        return raw, True
    speed_order = sorted(range(n), key=lambda d: cm.device_s(d, 0, cm.num_layers - 1))
    options: list[list[RawStage]] = []
    fastest = _SubsetSearch(cm, speed_order[:exact_max_devices]).solve()
    if fastest is not None:
        options.append(fastest)
    for size in range(1, min(n, cm.num_layers) + 1):
        try:
            options.append(ordered_dp(cm, speed_order[:size])[0])
        except PlanningError:
            continue
    if not options:
        raise PlanningError("no plan over these devices fits in their memory")
    best = min(options, key=lambda raw: evaluate(cm, to_stages(cm, raw)).period_s)
    return best, False


def plan_optimal(cm: CostModel, *, schedule: str = "1f1b", microbatches: int = 8,
                 exact_max_devices: int = EXACT_MAX_DEVICES) -> Plan:
    check_plan_options(schedule=schedule, microbatches=microbatches)
    started = time.perf_counter()
    raw, exact = optimal_stages(cm, exact_max_devices=exact_max_devices)
    period = evaluate(cm, to_stages(cm, raw)).period_s
    bound = Bound(lower_bound_s=period if exact else min(lower_bound_s(cm), period), exact=exact)
    return finish_plan(cm, raw, algorithm="optimal", schedule=schedule,
                       microbatches=microbatches, started=started, bound=bound)
