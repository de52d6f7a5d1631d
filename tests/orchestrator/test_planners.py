"""Every pipeline planner against brute force on small random instances, and the contract that
a plan's ``predicted`` is the cost model applied to its stages."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import pytest
from hypothesis import given

from orchestrator.cost import CostModel, build_cost_model, evaluate
from orchestrator.errors import PlanningError
from orchestrator.formats import DeviceSet
from orchestrator.partition import QUICK_PLANNERS, run_planner
from orchestrator.partition.baselines import uniform_cuts
from orchestrator.partition.brute import brute_force_any, brute_force_ordered, compositions
from orchestrator.partition.common import to_stages
from orchestrator.partition.optimal import lower_bound_s, plan_optimal
from orchestrator.partition.pipedream import pipedream_dp
from tests.orchestrator.instances import instances, make_device, make_profile, random_instance


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@given(instances(max_layers=7, max_devices=4))
def test_optimal_equals_brute_force(cm: CostModel) -> None:
    best = brute_force_any(cm)
    if best is None:
        with pytest.raises(PlanningError, match="fits in their memory"):
            plan_optimal(cm)
        return
    plan = plan_optimal(cm)
    assert plan.predicted is not None and plan.bound is not None
    assert close(plan.predicted.period_s, best[1])
    assert plan.predicted.memory_ok
    assert plan.bound.exact and close(plan.bound.lower_bound_s, plan.predicted.period_s)


@given(instances(max_layers=8, max_devices=4))
def test_ftpipehd_equals_brute_force_for_its_order(cm: CostModel) -> None:
    if cm.num_devices > cm.num_layers:
        with pytest.raises(PlanningError, match="needs at least one layer"):
            run_planner(cm, "ftpipehd")
        return
    best = brute_force_ordered(cm, range(cm.num_devices))
    if best is None:
        with pytest.raises(PlanningError, match="fits in their memory"):
            run_planner(cm, "ftpipehd")
        return
    plan = run_planner(cm, "ftpipehd")
    assert plan.predicted is not None
    assert close(plan.predicted.period_s, best[1])
    assert plan.predicted.memory_ok
    # all devices, in the given order, stage 0 on the first (central) device
    assert plan.device_ids == cm.devices.ids


def reference_speed(cm: CostModel) -> CostModel:
    """The same testbed with every device at the reference speed (PipeDream's assumption)."""
    devices = tuple(replace(d, speed=1.0, layer_times=None, resources=(), overhead_s=0.0,
                            message_s=0.0)
                    for d in cm.devices.devices)
    return build_cost_model(cm.profile, DeviceSet(devices=devices, links=cm.devices.links))


@given(instances(max_layers=6, max_devices=4))
def test_pipedream_dp_equals_brute_force_with_replication(cm: CostModel) -> None:
    ref = reference_speed(cm)
    n = cm.num_devices
    best = math.inf
    for groups in range(1, min(n, cm.num_layers) + 1):
        for sizes in compositions(n, groups):  # consecutive device groups in the given order
            devices = [tuple(range(a, e + 1)) for a, e in sizes]
            for ranges in compositions(cm.num_layers, groups):
                raw = [(a, e, g) for (a, e), g in zip(ranges, devices, strict=True)]
                best = min(best, evaluate(ref, to_stages(ref, raw)).period_s)
    raw, period = pipedream_dp(cm)
    assert close(period, best)
    assert close(evaluate(ref, to_stages(ref, raw)).period_s, best)
    assert [d for _, _, g in raw for d in g] == list(range(n))  # every device, in order


@given(instances(max_layers=10, max_devices=5, memory_pressure=False))
def test_every_planner_predicts_with_the_cost_model(cm: CostModel) -> None:
    for name in QUICK_PLANNERS:  # tapp is tested in test_tapp.py
        try:
            plan = run_planner(cm, name, microbatches=4, schedule="gpipe")
        except PlanningError:
            assert name == "ftpipehd" and cm.num_devices > cm.num_layers
            continue
        assert plan.algorithm == name and plan.schedule == "gpipe" and plan.microbatches == 4
        assert plan.predicted == evaluate(cm, plan.stages, beta=plan.beta, schedule="gpipe")
        assert plan.planner_s >= 0
        assert plan.stages[0].first == 0 and plan.stages[-1].last == cm.num_layers - 1
        assert plan.inflight is not None
        assert all(plan.inflight[k] >= len(plan.stages) - k for k in range(len(plan.stages)))


@given(instances(max_layers=7, max_devices=4))
def test_no_planner_beats_the_optimum_it_is_compared_to(cm: CostModel) -> None:
    best = brute_force_any(cm)
    if best is None:
        return
    assert lower_bound_s(cm) <= best[1] * (1 + 1e-9)
    for name in ("uniform", "pipetorch", "ftpipehd"):
        try:
            plan = run_planner(cm, name)
        except PlanningError:
            continue
        assert plan.predicted is not None
        if plan.predicted.memory_ok:  # one device per stage: never below the optimum
            assert plan.predicted.period_s >= best[1] * (1 - 1e-9)


def test_optimal_heuristic_is_bounded_by_the_exact_optimum() -> None:
    rng = random.Random(7)
    for _ in range(5):
        cm = random_instance(rng, layers=24, devices=6, memory_pressure=False, measured=True)
        exact = plan_optimal(cm)
        heuristic = plan_optimal(cm, exact_max_devices=3)
        assert exact.bound is not None and heuristic.bound is not None
        assert exact.predicted is not None and heuristic.predicted is not None
        assert exact.bound.exact and not heuristic.bound.exact
        assert heuristic.bound.lower_bound_s <= exact.predicted.period_s * (1 + 1e-9)
        assert heuristic.predicted.period_s >= exact.predicted.period_s * (1 - 1e-9)


def test_optimal_uses_fewer_devices_than_layers_when_it_must() -> None:
    profile = make_profile([(1.0, 1.0), (1.0, 1.0)])
    devices = DeviceSet(devices=tuple(make_device(f"d{i}", 1.0 + i) for i in range(4)))
    cm = build_cost_model(profile, devices)
    plan = plan_optimal(cm)
    assert len(plan.stages) <= 2
    assert set(plan.device_ids) <= {"d2", "d3"}  # the two fastest
    with pytest.raises(PlanningError, match="4 devices but only 2 layers"):
        run_planner(cm, "ftpipehd")


def test_uniform_cuts() -> None:
    assert uniform_cuts(10, 3) == [(0, 3), (4, 6), (7, 9)]
    assert uniform_cuts(3, 3) == [(0, 0), (1, 1), (2, 2)]
    for layers, stages in itertools.product(range(1, 12), range(1, 6)):
        if stages <= layers:
            sizes = [e - a + 1 for a, e in uniform_cuts(layers, stages)]
            assert sum(sizes) == layers and max(sizes) - min(sizes) <= 1


def test_baseline_shapes() -> None:
    rng = random.Random(3)
    cm = random_instance(rng, layers=12, devices=4, memory_pressure=False)
    bsp = run_planner(cm, "bsp")
    assert len(bsp.stages) == 1 and bsp.stages[0].devices == cm.devices.ids
    pipetorch = run_planner(cm, "pipetorch")
    bandwidths = [cm.devices.device(d).bandwidth_bps for d in pipetorch.device_ids]
    assert bandwidths == sorted(bandwidths, reverse=True)
    uniform = run_planner(cm, "uniform")
    assert uniform.device_ids == cm.devices.ids
    assert [s.layers for s in uniform.stages] == uniform_cuts(12, 4)


def test_unknown_algorithm_and_bad_options() -> None:
    cm = random_instance(random.Random(1), layers=4, devices=2)
    with pytest.raises(ValueError, match="unknown algorithm 'zero'; known: uniform"):
        run_planner(cm, "zero")
    with pytest.raises(ValueError, match="schedule must be one of"):
        run_planner(cm, "uniform", schedule="interleaved")
    with pytest.raises(ValueError, match="microbatches must be a positive integer"):
        run_planner(cm, "uniform", microbatches=0)
    with pytest.raises(ValueError, match="workers must be between 1 and 2"):
        run_planner(cm, "duanwu", workers=3)
