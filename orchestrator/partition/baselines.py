"""The baselines EdgePipe compares against.

- ``uniform``: GPipe-style equal layer counts, devices in the given order.
- ``pipetorch``: the Pipe-torch baseline used by TAPP (Zhan and Zhang, "Pipe-torch:
  Pipeline-Based Distributed Deep Learning in a GPU Cluster with Heterogeneous Networking"):
  devices sorted by bandwidth, fastest link first, and layers cut so that the stages' compute
  times are balanced; it ignores transfer times and memory when it cuts.
- ``bsp``: bulk-synchronous data parallelism: one stage, every device a replica of the whole
  model, gradients all-reduced each step.
"""

from __future__ import annotations

import time

from orchestrator.cost import CostModel
from orchestrator.partition.common import RawStage, check_plan_options, finish_plan
from orchestrator.partition.ordered import ordered_dp
from orchestrator.planformat import Plan


def uniform_cuts(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    """Contiguous ranges of equal size (the first ``num_layers % num_stages`` one larger)."""
    size, extra = divmod(num_layers, num_stages)
    out, start = [], 0
    for k in range(num_stages):
        stop = start + size + (1 if k < extra else 0)
        out.append((start, stop - 1))
        start = stop
    return out


def plan_uniform(cm: CostModel, *, schedule: str = "1f1b", microbatches: int = 8) -> Plan:
    check_plan_options(schedule=schedule, microbatches=microbatches)
    started = time.perf_counter()
    n = min(cm.num_devices, cm.num_layers)
    raw: list[RawStage] = [(a, e, (d,)) for d, (a, e) in enumerate(uniform_cuts(cm.num_layers, n))]
    return finish_plan(cm, raw, algorithm="uniform", schedule=schedule, microbatches=microbatches,
                       started=started)


def plan_pipetorch(cm: CostModel, *, schedule: str = "1f1b", microbatches: int = 8) -> Plan:
    check_plan_options(schedule=schedule, microbatches=microbatches)
    started = time.perf_counter()
    by_bandwidth = sorted(range(cm.num_devices),
                          key=lambda d: -cm.devices.devices[d].bandwidth_bps)
    order = by_bandwidth[: cm.num_layers]
    raw, _ = ordered_dp(cm, order, comm=False, memory=False)
    return finish_plan(cm, raw, algorithm="pipetorch", schedule=schedule,
                       microbatches=microbatches, started=started)


def plan_bsp(cm: CostModel, *, schedule: str = "1f1b", microbatches: int = 8) -> Plan:
    check_plan_options(schedule=schedule, microbatches=microbatches)
    started = time.perf_counter()
    raw: list[RawStage] = [(0, cm.num_layers - 1, tuple(range(cm.num_devices)))]
    return finish_plan(cm, raw, algorithm="bsp", schedule=schedule, microbatches=microbatches,
                       started=started)
