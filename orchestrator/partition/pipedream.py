"""PipeDream's planner (Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN
Training", section 3.1), as FTPipeHD starts before it knows the devices.

PipeDream assumes identical workers: every device here is taken to run at the reference speed.
Its dynamic programme may replicate a stage over several consecutive devices (data parallelism
inside the stage, synchronised by a ring all-reduce). ``A[m][j][g]``, the best period for layers
``0..j-1`` on the first ``m`` devices of the given order with the last stage on ``g`` replicas, is

    A[m][j][g] = min over i < j, g' of max( A[m-g][i][g'], X(cut at i), T_g(i..j-1) )

with ``T_g = max(W / g, Y)`` at reference speed and ``X`` over the real links between the two
groups. Like PipeDream's it ignores memory. The resulting stages are then evaluated on the real
devices, which is what makes it a baseline for heterogeneous testbeds.
"""

from __future__ import annotations

import time

import numpy as np

from orchestrator.cost import CostModel
from orchestrator.errors import PlanningError
from orchestrator.partition.common import RawStage, check_plan_options, finish_plan
from orchestrator.planformat import Plan


def pipedream_dp(cm: CostModel) -> tuple[list[RawStage], float]:
    num_layers, n = cm.num_layers, cm.num_devices
    cut = np.arange(num_layers + 1)
    start, end = cut[:, None], cut[None, :]
    empty = start >= end
    ref_work = (cm.ref_fwd_prefix[end] - cm.ref_fwd_prefix[start]
                + cm.ref_bwd_prefix[end] - cm.ref_bwd_prefix[start])
    params = cm.param_prefix[end] - cm.param_prefix[start]

    def group(first: int, size: int) -> list[int]:
        return list(range(first, first + size))

    def stage_time(devs: list[int]) -> np.ndarray:
        g = len(devs)
        t = ref_work / g
        if g > 1:
            slowest = min(cm.bandwidth_bps[x, y] for x in devs for y in devs if x != y)
            t = np.maximum(t, 2.0 * (g - 1) / g * params / slowest)
        return np.where(empty, np.inf, t)

    def boundary(up: list[int], down: list[int]) -> np.ndarray:
        worst = np.zeros(num_layers + 1)
        for x in up:
            for y in down:
                worst[1:num_layers] = np.maximum(
                    worst[1:num_layers],
                    2.0 * (cm.output_bytes[: num_layers - 1] / cm.bandwidth_bps[x, y]
                           + cm.latency_s[x, y]))
        worst[0] = worst[num_layers] = np.inf
        return worst

    # best[m][g]: array over j; arg[m][g]: (i, g') per j
    best = [[np.full(num_layers + 1, np.inf) for _ in range(n + 1)] for _ in range(n + 1)]
    arg_i = [[np.zeros(num_layers + 1, dtype=np.int64) for _ in range(n + 1)] for _ in range(n + 1)]
    arg_g = [[np.zeros(num_layers + 1, dtype=np.int64) for _ in range(n + 1)] for _ in range(n + 1)]
    for m in range(1, n + 1):
        for g in range(1, m + 1):
            devs = group(m - g, g)
            t = stage_time(devs)
            if g == m:  # the first stage: layers 0..j-1
                best[m][g] = t[0].copy()
                continue
            for g_prev in range(1, m - g + 1):
                prev_best = best[m - g][g_prev]
                if not np.isfinite(prev_best).any():
                    continue
                x = boundary(group(m - g - g_prev, g_prev), devs)
                cost = np.maximum(np.maximum(prev_best, x)[:, None], t)
                i = np.argmin(cost, axis=0)
                value = cost[i, cut]
                better = value < best[m][g]
                best[m][g] = np.where(better, value, best[m][g])
                arg_i[m][g] = np.where(better, i, arg_i[m][g])
                arg_g[m][g] = np.where(better, g_prev, arg_g[m][g])
    finals = [float(best[n][g][num_layers]) for g in range(n + 1)]
    g = int(np.argmin(finals))
    period = finals[g]
    if not np.isfinite(period):
        raise PlanningError("PipeDream's planner found no partition")  # pragma: no cover
    raw: list[RawStage] = []
    m, j = n, num_layers
    while m > 0:
        if g == m:
            raw.append((0, j - 1, tuple(group(0, g))))
            break
        i, g_prev = int(arg_i[m][g][j]), int(arg_g[m][g][j])
        raw.append((i, j - 1, tuple(group(m - g, g))))
        m, j, g = m - g, i, g_prev
    raw.reverse()
    return raw, period


def plan_pipedream(cm: CostModel, *, schedule: str = "1f1b", microbatches: int = 8) -> Plan:
    check_plan_options(schedule=schedule, microbatches=microbatches)
    started = time.perf_counter()
    raw, _ = pipedream_dp(cm)
    return finish_plan(cm, raw, algorithm="pipedream", schedule=schedule,
                       microbatches=microbatches, started=started)
