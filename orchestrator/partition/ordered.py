"""Exact min-max partition of the layers over devices in a fixed order, one device per stage.

The dynamic programme of FTPipeHD (its equations 4-7), which PipeDream's planner also reduces to
without replication: ``A[m][j]``, the smallest period with which the first ``m`` devices of the
order can serve layers ``0..j-1``, is

    A[m][j] = min over i < j of  max( A[m-1][i],  X(cut at i),  t_{order[m-1]}(i..j-1) )

with ``X`` the boundary transfer (activation and gradient, 2x) between devices m-2 and m-1 and
``t`` the stage's compute time; a stage whose memory need exceeds its device is excluded. Every
device gets at least one layer. The inner minimum is vectorised over all (i, j) at once, so the
whole programme costs O(N L^2) numpy work.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from orchestrator.cost import CostModel, FloatArray, messages_table
from orchestrator.errors import PlanningError
from orchestrator.partition.common import RawStage


def ordered_dp(cm: CostModel, order: Sequence[int], *, work_prefix: FloatArray | None = None,
               comm: bool = True, memory: bool = True) -> tuple[list[RawStage], float]:
    """Best cuts for devices in ``order`` (all used, one stage each) and the period they reach.

    ``work_prefix`` ([N, L+1] cumulative forward + backward time) replaces the devices' own
    times (and their overhead and messages), as PipeDream does when it assumes every device has the
    reference speed. ``comm`` and
    ``memory`` switch the boundary transfers and the memory check on or off (pipe-torch balances
    compute alone).
    """
    num_layers, n = cm.num_layers, len(order)
    if n == 0:
        raise PlanningError("no devices to plan for")
    if n > num_layers:
        raise PlanningError(f"{n} devices but only {num_layers} layers: every device of this "
                            "planner needs at least one layer")
    work = cm.work_prefix if work_prefix is None else work_prefix
    overhead = cm.overhead_s if work_prefix is None else np.zeros(cm.num_devices)
    per_message = cm.message_s if work_prefix is None else np.zeros(cm.num_devices)
    messages = messages_table(num_layers)
    cut = np.arange(num_layers + 1)
    start, end = cut[:, None], cut[None, :]
    empty = start >= end
    best = np.full(num_layers + 1, np.inf)
    best[0] = 0.0
    choice = np.zeros((n + 1, num_layers + 1), dtype=np.int64)
    params = cm.param_prefix[end] - cm.param_prefix[start]
    acts = cm.act_prefix[end] - cm.act_prefix[start]
    for m in range(1, n + 1):
        d = order[m - 1]
        cost = np.maximum(best[:, None], work[d][end] - work[d][start] + overhead[d]
                          + messages * per_message[d])
        if comm and m > 1:
            prev = order[m - 2]
            boundary = np.full(num_layers + 1, np.inf)
            boundary[1:num_layers] = 2.0 * (cm.output_bytes[: num_layers - 1]
                                            / cm.bandwidth_bps[prev, d] + cm.latency_s[prev, d])
            cost = np.maximum(cost, boundary[:, None])
        if memory:
            k = m - 1
            need = (n - k) * (params + acts) + 2.0 * params
            cost = np.where(need > cm.memory_bytes[d], np.inf, cost)
        cost = np.where(empty, np.inf, cost)
        choice[m] = np.argmin(cost, axis=0)
        best = cost[choice[m], cut]
        best[cut > num_layers - (n - m)] = np.inf  # leave a layer for each remaining device
    if not np.isfinite(best[num_layers]):
        raise PlanningError("no partition over these devices in this order fits in their memory")
    raw: list[RawStage] = []
    j = num_layers
    for m in range(n, 0, -1):
        i = int(choice[m][j])
        raw.append((i, j - 1, (order[m - 1],)))
        j = i
    raw.reverse()
    return raw, float(best[num_layers])
