"""FTPipeHD's partition (Chen et al., "FTPipeHD: A Fault-Tolerant Pipeline-Parallel Distributed
Training Approach for Heterogeneous Edge Devices", equations 4-7).

All devices in the given order, one stage each, stage 0 on the first (central) device that holds
the data; per-device speeds or measured layer times; twice the boundary activation for the
gradient that flows back; memory-aware. The dynamic programme (:mod:`.ordered`) is exact for
that order.
"""

from __future__ import annotations

import time

from orchestrator.cost import CostModel
from orchestrator.partition.common import check_plan_options, finish_plan
from orchestrator.partition.ordered import ordered_dp
from orchestrator.planformat import Plan


def plan_ftpipehd(cm: CostModel, *, schedule: str = "1f1b", microbatches: int = 8) -> Plan:
    check_plan_options(schedule=schedule, microbatches=microbatches)
    started = time.perf_counter()
    raw, _ = ordered_dp(cm, range(cm.num_devices))
    return finish_plan(cm, raw, algorithm="ftpipehd", schedule=schedule,
                       microbatches=microbatches, started=started)
