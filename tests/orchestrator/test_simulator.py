"""The simulator: exact bubble fractions, convergence to the cost model's period, every
micro-batch through every stage once, and idle time explained."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from orchestrator.cost import CostModel, build_cost_model, needed_inflight
from orchestrator.errors import PlanningError
from orchestrator.events import COMPUTE_KINDS, steady_throughput_sps
from orchestrator.formats import DeviceSet, Resource
from orchestrator.partition import run_planner
from orchestrator.planformat import Plan, Stage
from orchestrator.schedule import reference_version
from orchestrator.simulator import simulate
from tests.conftest import DATA
from tests.orchestrator.instances import instances, make_device, make_profile, random_instance


def uniform_pipeline(stages: int, f: float, b: float) -> tuple[CostModel, Plan]:
    cm = build_cost_model(make_profile([(f, b)] * stages),
                          DeviceSet(devices=tuple(make_device(f"d{k}") for k in range(stages))))
    plan = Plan(algorithm="manual", schedule="gpipe", microbatches=1,
                stages=tuple(Stage((k, k), (f"d{k}",)) for k in range(stages)))
    return cm, plan


@given(st.integers(1, 8), st.integers(1, 32), st.floats(0.1, 2.0), st.floats(0.1, 2.0))
def test_gpipe_bubble_fraction_on_a_uniform_pipeline(stages: int, microbatches: int,
                                                     f: float, b: float) -> None:
    cm, plan = uniform_pipeline(stages, f, b)
    result = simulate(cm, plan, microbatches=microbatches, schedule="gpipe",
                      flush_every=microbatches)
    expected = (stages - 1) / (microbatches + stages - 1)
    assert result.bubble_fraction == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert result.makespan_s == pytest.approx((microbatches + stages - 1) * (f + b))
    for summary in result.devices.values():  # all of GPipe's idle time is fill and drain
        assert summary.upstream_s == pytest.approx(0, abs=1e-9)
        assert summary.downstream_s == pytest.approx(0, abs=1e-9)


@given(st.integers(1, 6), st.integers(1, 12), st.floats(0.1, 2.0), st.floats(0.1, 2.0))
def test_synchronous_1f1b_flushes_as_gpipe_does(stages: int, microbatches: int, f: float,
                                                b: float) -> None:
    # on uniform stages PipeDream-flush's bubble is GPipe's, (S - 1) / (M + S - 1) a batch,
    # with S - k micro-batches in flight instead of M
    cm, plan = uniform_pipeline(stages, f, b)
    result = simulate(cm, plan, microbatches=2 * microbatches, schedule="1f1b-sync",
                      flush_every=microbatches)
    assert result.makespan_s == pytest.approx(2 * (microbatches + stages - 1) * (f + b))
    assert result.bubble_fraction == pytest.approx(
        (stages - 1) / (microbatches + stages - 1), rel=1e-9, abs=1e-12)
    versions = {(e.stage, e.microbatch): e.version for e in result.events
                if e.kind == "forward"}
    assert versions == {(k, m): m // microbatches for k in range(stages)
                        for m in range(2 * microbatches)}


@given(instances(max_layers=10, max_devices=4))
def test_1f1b_approaches_the_predicted_throughput_from_below(cm: CostModel) -> None:
    try:
        plan = run_planner(cm, "optimal")
    except PlanningError:
        return
    assert plan.predicted is not None
    bound = plan.predicted.throughput_sps
    rates = [simulate(cm, plan, microbatches=m, schedule="1f1b").throughput_sps
             for m in (4, 64, 512)]
    assert all(r <= bound * (1 + 1e-9) for r in rates)
    assert rates[-1] >= rates[0] * (1 - 1e-9)
    if plan.inflight == needed_inflight(plan.predicted):  # not held back by memory
        assert rates[-1] >= 0.95 * bound


def test_1f1b_reaches_the_period_on_the_shared_testbed() -> None:
    from orchestrator.formats import load_devices, load_profile

    cm = build_cost_model(load_profile(DATA / "profiles" / "resnet101_cifar10.model.json"),
                          load_devices(DATA / "profiles" / "resnet101_cifar10.devices.json"))
    for name in ("ftpipehd", "optimal", "uniform"):
        plan = run_planner(cm, name)
        assert plan.predicted is not None
        sim = simulate(cm, plan, microbatches=512, schedule="1f1b")
        assert 0.97 * plan.predicted.throughput_sps <= sim.throughput_sps
        assert sim.throughput_sps <= plan.predicted.throughput_sps * (1 + 1e-9)


@given(instances(max_layers=8, max_devices=5, memory_pressure=False),
       st.sampled_from(["1f1b", "1f1b-sync", "gpipe"]),
       st.sampled_from(["pipedream", "bsp", "duanwu", "optimal", "uniform"]))
def test_each_microbatch_forward_and_backward_once_per_stage(cm: CostModel, schedule: str,
                                                              algorithm: str) -> None:
    plan = run_planner(cm, algorithm, microbatches=3)
    m = 7
    sim = simulate(cm, plan, microbatches=m, schedule=schedule)
    for k, stage in enumerate(plan.stages):
        for kind in ("forward", "backward"):
            done = sorted(e.microbatch for e in sim.events if e.stage == k and e.kind == kind)
            assert done == list(range(m)), (k, kind)
            devices = {e.device for e in sim.events if e.stage == k and e.kind == kind}
            assert devices <= set(stage.devices)
    if schedule == "1f1b" and len(plan.stages[0].devices) > 1:
        # replicas of the first stage forward each micro-batch on the version one device
        # keeping the stage's lag in flight would have used (which labels its events)
        depth = plan.lag_for(0)
        assert all(e.version == reference_version(e.microbatch, depth) for e in sim.events
                   if e.stage == 0 and e.kind == "forward")
    # a stage's forward of a micro-batch ends before the next stage's forward of it starts
    ends = {(e.stage, e.microbatch): e.end for e in sim.events if e.kind == "forward"}
    starts = {(e.stage, e.microbatch): e.start for e in sim.events if e.kind == "forward"}
    for (k, mb), end in ends.items():
        if k + 1 < len(plan.stages):
            assert starts[(k + 1, mb)] >= end - 1e-12
    for d, summary in sim.devices.items():
        assert summary.busy_s + summary.idle_s == pytest.approx(sim.makespan_s)
        total = sum(e.end - e.start for e in sim.events
                    if e.device == d and e.kind in COMPUTE_KINDS)
        assert summary.busy_s <= total * (1 + 1e-9) + 1e-12  # the union of the intervals
        overlapping = plan.beta is not None or any(
            e.kind == "aggregate" for e in sim.events if e.device == d)
        if not overlapping:  # one lane: intervals do not overlap
            assert summary.busy_s == pytest.approx(total, rel=1e-9, abs=1e-12)


def test_slow_middle_stage_makes_its_neighbours_wait() -> None:
    cm = build_cost_model(make_profile([(1.0, 1.0)] * 3), DeviceSet(devices=(
        make_device("a"), make_device("slow", 0.25), make_device("c"))))
    plan = Plan(algorithm="manual", schedule="1f1b", microbatches=1,
                stages=(Stage((0, 0), ("a",)), Stage((1, 1), ("slow",)), Stage((2, 2), ("c",))))
    sim = simulate(cm, plan, microbatches=40)
    assert sim.devices["c"].upstream_s > 0.5 * sim.makespan_s  # starved by the slow stage
    assert sim.devices["a"].downstream_s > 0.5 * sim.makespan_s  # waits for its gradients
    assert sim.devices["slow"].idle_s < 0.1 * sim.makespan_s
    assert sim.throughput_sps == pytest.approx(32 / 8.0, rel=0.1)


def test_transfers_appear_as_send_and_recv_with_their_bytes() -> None:
    cm = build_cost_model(make_profile([(1.0, 1.0)] * 2, output_bytes=[500, 0]),
                          DeviceSet(devices=(make_device("a", bandwidth_bps=1000.0,
                                                         latency_s=0.1),
                                             make_device("b", bandwidth_bps=1000.0))))
    plan = Plan(algorithm="manual", schedule="1f1b", microbatches=1,
                stages=(Stage((0, 0), ("a",)), Stage((1, 1), ("b",))))
    sim = simulate(cm, plan, microbatches=2)
    sends = [e for e in sim.events if e.kind == "send"]
    recvs = [e for e in sim.events if e.kind == "recv"]
    assert len(sends) == len(recvs) == 4  # 2 activations forward, 2 gradients back
    assert all(e.bytes == 500 and e.duration_s == pytest.approx(0.6) for e in sends)
    assert sim.bytes_moved == 2000
    assert {e.device for e in sends} == {"a", "b"}


def test_replicated_stage_is_limited_by_its_all_reduce() -> None:
    cm = build_cost_model(make_profile([(0.1, 0.1)], param_bytes=[1000]),
                          DeviceSet(devices=(make_device("a", bandwidth_bps=1000.0),
                                             make_device("b", bandwidth_bps=1000.0))))
    plan = run_planner(cm, "bsp")
    assert plan.predicted is not None and plan.predicted.bottleneck == "stage 0 sync"
    sim = simulate(cm, plan, microbatches=200, schedule="1f1b")
    assert sim.throughput_sps == pytest.approx(plan.predicted.throughput_sps, rel=0.02)
    assert any(e.kind == "aggregate" for e in sim.events)


def test_simulation_is_deterministic() -> None:
    cm = random_instance(random.Random(2), layers=12, devices=4, memory_pressure=False)
    plan = run_planner(cm, "pipedream")
    a = simulate(cm, plan, microbatches=20)
    b = simulate(cm, plan, microbatches=20)
    assert a.events == b.events and math.isfinite(a.makespan_s)


def test_replicated_last_stage_does_not_deadlock() -> None:
    # Regression (found by hypothesis): a replica of the last stage started with a forward per
    # replica of the stage, so it forwarded micro-batch 4 before backwarding 2, while the stage
    # before needed that backward to produce micro-batch 4.
    cm = random_instance(random.Random(0), layers=4, devices=4, memory_pressure=False,
                         measured=True)
    plan = run_planner(cm, "pipedream", microbatches=3)
    assert len(plan.stages[-1].devices) == 2
    sim = simulate(cm, plan, microbatches=7, schedule="1f1b")
    assert sorted(e.microbatch for e in sim.events if e.kind == "backward" and e.stage == 0) == \
        list(range(7))


def test_steady_throughput_leaves_out_fill_and_drain() -> None:
    cm, plan = uniform_pipeline(4, 0.5, 1.0)
    sim = simulate(cm, plan, microbatches=200, schedule="1f1b")
    # a balanced pipeline of 1.5 s stages completes one micro-batch of 32 samples every 1.5 s
    assert steady_throughput_sps(sim.events, samples_per_microbatch=32) == pytest.approx(
        32 / 1.5, rel=1e-6)
    assert sim.throughput_sps < steady_throughput_sps(sim.events, samples_per_microbatch=32)
    assert steady_throughput_sps(sim.events[:3], samples_per_microbatch=32) == 0.0
    with pytest.raises(ValueError, match="skip must be in"):
        steady_throughput_sps(sim.events, samples_per_microbatch=32, skip=0.5)


@given(st.lists(st.integers(1, 3), min_size=1, max_size=4), st.integers(1, 24),
       st.sampled_from(["1f1b", "1f1b-sync", "gpipe"]), st.integers(0, 2), st.integers(0, 3),
       st.lists(st.booleans(), min_size=12, max_size=12),
       st.lists(st.floats(0.2, 5.0), min_size=12, max_size=12))
# a replica of synchronous 1F1B whose warm-up counted its own micro-batches (two of them, 4
# and 7) forwarded 7 before 4's backward, which the stage before waited for: a deadlock
@example([1, 1, 2, 1], 12, "1f1b-sync", 0, 0, [False] * 12, [1.0, 1.0, 1.0, 2.0] + [1.0] * 8)
def test_any_grouping_and_lanes_run_to_the_end(groups: list[int], microbatches: int,
                                               schedule: str, extra_inflight: int,
                                               extra_lag: int, lanes: list[bool],
                                               speeds: list[float]) -> None:
    """Whatever the groups, depths, lags and two-lane devices, the schedule does not
    deadlock, and every micro-batch goes forward and back once per stage."""
    names = [[f"s{k}r{r}" for r in range(n)] for k, n in enumerate(groups)]
    devices = [make_device(d, speeds[i % 12], bandwidth_bps=1e6,
                           resources=(Resource("cpu", speeds[i % 12], speeds[i % 12] / 2),
                                      Resource("gpu", 1.0, 3.0)))
               for i, d in enumerate(d for stage in names for d in stage)]
    cm = build_cost_model(make_profile([(0.3, 0.6)] * len(groups), param_bytes=[10**5] *
                                       len(groups), output_bytes=[10**4] * len(groups)),
                          DeviceSet(devices=tuple(devices)))
    two = [d.id for i, d in enumerate(devices) if lanes[i % 12]]
    inflight = tuple(len(groups) - k + extra_inflight for k in range(len(groups)))
    plan = Plan(algorithm="manual", schedule=schedule, microbatches=max(1, microbatches // 3),
                stages=tuple(Stage((k, k), tuple(n)) for k, n in enumerate(names)),
                beta={d: {"cpu": 0.7, "gpu": 0.2} for d in two} or None, inflight=inflight,
                lag=tuple(d + extra_lag for d in inflight))
    sim = simulate(cm, plan, microbatches=microbatches)
    for k in range(len(groups)):
        for kind in ("forward", "backward"):
            assert sorted(e.microbatch for e in sim.events
                          if e.stage == k and e.kind == kind) == list(range(microbatches))
