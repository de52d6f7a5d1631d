"""The pipeline planners, by name. Each takes a :class:`~orchestrator.cost.CostModel` and
keyword options and returns a :class:`~orchestrator.planformat.Plan` whose ``predicted`` is the cost
model's verdict on it.

``tapp`` is registered lazily: its module needs torch, which importing the planning core must
not pull in, so :func:`plan_tapp` imports :mod:`orchestrator.tapp` when it is first called. It
learns for about a minute, so it is not among :data:`QUICK_PLANNERS`, the planners that
``compare`` and the web app's default planning run unasked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.cost import CostModel
from orchestrator.partition.baselines import plan_bsp, plan_pipetorch, plan_uniform
from orchestrator.partition.duanwu import plan_duanwu
from orchestrator.partition.ftpipehd import plan_ftpipehd
from orchestrator.partition.optimal import plan_optimal
from orchestrator.partition.pipedream import plan_pipedream
from orchestrator.planformat import Plan

Planner = Callable[..., Plan]


def plan_tapp(cm: CostModel, **options: Any) -> Plan:
    """TAPP's reinforcement-learning planner (:func:`orchestrator.tapp.plan_tapp`), imported on
    first use."""
    from orchestrator.tapp import plan_tapp as train_and_plan

    return train_and_plan(cm, **options)


PLANNERS: dict[str, Planner] = {
    "uniform": plan_uniform,
    "pipedream": plan_pipedream,
    "ftpipehd": plan_ftpipehd,
    "optimal": plan_optimal,
    "pipetorch": plan_pipetorch,
    "bsp": plan_bsp,
    "duanwu": plan_duanwu,
    "tapp": plan_tapp,
}

LEARNED = frozenset({"tapp"})
QUICK_PLANNERS: tuple[str, ...] = tuple(name for name in PLANNERS if name not in LEARNED)

DESCRIPTIONS: dict[str, str] = {
    "uniform": "equal layer counts, devices in the given order (GPipe-style baseline)",
    "pipedream": "PipeDream's DP with replication, assuming reference-speed devices",
    "ftpipehd": "FTPipeHD's DP: all devices in the given order, real speeds, memory-aware",
    "optimal": "exact best subset, order and cuts (one device per stage), memory-aware",
    "pipetorch": "Pipe-torch baseline: devices by bandwidth, compute-balanced cuts",
    "bsp": "data parallelism: one stage, every device a replica",
    "duanwu": "Duan-Wu: device grouping, binary-search partition, beta resource split",
    "tapp": "TAPP: policy-gradient RL of partition + allocation networks (torch; seconds)",
}


def run_planner(cm: CostModel, algorithm: str, **options: Any) -> Plan:
    """Plan with the named algorithm; unknown names raise ValueError listing the known ones."""
    try:
        planner = PLANNERS[algorithm]
    except KeyError:
        raise ValueError(f"unknown algorithm {algorithm!r}; known: {', '.join(PLANNERS)}") from None
    return planner(cm, **options)
