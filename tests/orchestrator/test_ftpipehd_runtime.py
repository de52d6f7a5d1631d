"""FTPipeHD's runtime algorithms: capacity estimation (equations 1-3) and weight
redistribution (Algorithm 1)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.capacity import (
    FixedCostFigures,
    capacity_ratios,
    estimate_capacities,
    fixed_costs_blended,
    stage_seconds,
)
from orchestrator.cost import build_cost_model, evaluate
from orchestrator.formats import DeviceSet, LayerTimes, Resource
from orchestrator.partition import run_planner
from orchestrator.planformat import Plan, Stage
from orchestrator.redistribution import CENTRAL, holdings, redistribute_weights
from tests.orchestrator.instances import make_device, make_profile

PROFILE = make_profile([(1.0, 2.0)] * 8, param_bytes=[100 * (i + 1) for i in range(8)])


def plan_of(*stages: tuple[tuple[int, int], tuple[str, ...]]) -> Plan:
    return Plan(algorithm="manual", schedule="1f1b", microbatches=4,
                stages=tuple(Stage(layers, devices) for layers, devices in stages))


def test_capacity_makes_the_model_agree_with_the_measurement() -> None:
    devices = DeviceSet(devices=(
        make_device("a", 1.0),
        make_device("b", 2.0, resources=(Resource("cpu", 1.5, 1.0), Resource("gpu", 0.5, 0.5))),
        make_device("c", 1.0, layer_times=LayerTimes((0.5,) * 8, (1.0,) * 8))))
    cm = build_cost_model(PROFILE, devices)
    plan = plan_of(((0, 1), ("a",)), ((2, 4), ("b",)), ((5, 7), ("c",)))
    # a runs as modelled, b got hot (4x slower than believed), c is twice as fast as measured
    measured = {"a": 6.0, "b": 4 * 9.0 / 2.0, "c": 4.5 / 2}
    assert capacity_ratios(cm, plan, measured_s=measured) == pytest.approx(
        {"a": 1.0, "b": 0.25, "c": 2.0})
    updated = estimate_capacities(cm, plan, measured_s=measured)
    assert updated.device("a") == devices.device("a")
    assert updated.device("b").speed == pytest.approx(0.5)
    assert [r.speed for r in updated.device("b").resources] == pytest.approx([0.375, 0.125])
    times = updated.device("c").layer_times
    assert times is not None and times.forward_s[0] == pytest.approx(0.25)
    new_cm = build_cost_model(PROFILE, updated)
    for dev, seconds in measured.items():  # re-predicted stage times equal the measurements
        stage = next(s for s in plan.stages if dev in s.devices)
        assert new_cm.device_s(new_cm.index(dev), stage.first, stage.last) == pytest.approx(seconds)
    half = estimate_capacities(cm, plan, measured_s={"b": 18.0}, smoothing=0.5)
    assert half.device("b").speed == pytest.approx(2.0 * (0.5 + 0.5 * 0.25))


def test_capacity_estimation_rejects_bad_measurements() -> None:
    cm = build_cost_model(PROFILE, DeviceSet(devices=(make_device("a"), make_device("b"))))
    plan = plan_of(((0, 3), ("a",)), ((4, 7), ("b",)))
    with pytest.raises(ValueError, match="'z' serves no stage"):
        estimate_capacities(cm, plan, measured_s={"z": 1.0})
    with pytest.raises(ValueError, match="must be a positive number of seconds, got 0"):
        estimate_capacities(cm, plan, measured_s={"a": 0})
    with pytest.raises(ValueError, match="smoothing must be in"):
        estimate_capacities(cm, plan, measured_s={"a": 1.0}, smoothing=0)


def test_stage_seconds_is_the_mean_work_per_microbatch_of_complete_microbatches() -> None:
    # a paced device: two micro-batches unpaced (their sleep repaid a late wake-up), one
    # sleeping long; the median of the sums (0.1) would make it twice as fast as it is
    events = []
    for m in range(30):
        forward = 0.4 if m % 3 == 0 else 0.05
        events += [("a", m, "forward", m, m + forward), ("a", m, "backward", m + 0.5, m + 0.54),
                   ("a", m, "update", m + 0.6, m + 0.61), ("a", m, "send", m, m + 5.0)]
    events += [("a", 30, "forward", 30.0, 35.0)]  # in flight: no backward yet
    events += [("b", 0, "forward", 0.0, 1.0), ("b", 0, "backward", 1.0, 2.0)]  # too few
    assert stage_seconds(events, last=30) == {"a": pytest.approx(0.1 + 0.35 / 3)}
    # only the latest ``last`` complete micro-batches count (28, 29: unpaced)
    assert stage_seconds(events, last=3) == {"a": pytest.approx((0.45 + 0.1 + 0.1) / 3)}
    with pytest.raises(ValueError, match="last"):
        stage_seconds(events, last=0)


def test_fixed_costs_blend_the_kept_figures_with_a_runs_measurement() -> None:
    first = FixedCostFigures(overhead_s=0.4, pass_overhead_s=0.1, message_s=0.3)
    assert fixed_costs_blended(None, first) == first  # nothing kept: the run's
    noisy = FixedCostFigures(overhead_s=0.8, pass_overhead_s=0.3, message_s=None)
    blended = fixed_costs_blended(first, noisy)
    assert blended.overhead_s == pytest.approx(0.6)  # half way: one run does not win
    assert blended.pass_overhead_s == pytest.approx(0.2)
    assert blended.message_s == 0.3  # not measured this time: kept
    # a device that changed for good is followed: within 1% after seven runs
    figures = first
    for _ in range(7):
        figures = fixed_costs_blended(figures, FixedCostFigures(overhead_s=1.0))
    assert figures.overhead_s == pytest.approx(1.0, rel=0.01)
    assert figures.pass_overhead_s == 0.1
    with pytest.raises(ValueError, match="keep"):
        fixed_costs_blended(first, noisy, keep=1.0)


@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=6),
       st.floats(0, 0.99))
def test_blended_figures_stay_within_the_runs_and_inside_the_overhead(
        runs: list[tuple[float, float]], keep: float) -> None:
    figures = None
    for overhead, inside in runs:
        measured = FixedCostFigures(overhead_s=overhead, pass_overhead_s=min(inside, overhead))
        figures = fixed_costs_blended(figures, measured, keep=keep)
        assert figures.pass_overhead_s is not None
        assert figures.pass_overhead_s <= figures.overhead_s
    assert figures is not None
    overheads = [o for o, _ in runs]
    assert min(overheads) - 1e-12 <= figures.overhead_s <= max(overheads) + 1e-12


def test_repartition_moves_layers_away_from_a_slowed_device() -> None:
    devices = DeviceSet(devices=tuple(make_device(n) for n in "abc"))
    cm = build_cost_model(PROFILE, devices)
    before = run_planner(cm, "ftpipehd")
    stage_b = next(s for s in before.stages if "b" in s.devices)
    slowed = estimate_capacities(cm, before, measured_s={
        "b": 10 * cm.device_s(1, stage_b.first, stage_b.last)})
    after = run_planner(build_cost_model(PROFILE, slowed), "ftpipehd")
    new_b = next(s for s in after.stages if "b" in s.devices)
    assert new_b.last - new_b.first < stage_b.last - stage_b.first


OLD = plan_of(((0, 1), ("a",)), ((2, 3), ("b",)), ((4, 5), ("c",)), ((6, 7), ("d",)))


def test_holdings_follow_chain_replication() -> None:
    live, replica = holdings(OLD)
    assert live == {"a": {0, 1}, "b": {2, 3}, "c": {4, 5}, "d": {6, 7}}
    assert replica == {"b": {0, 1}, "c": {2, 3}, "d": {4, 5}, "a": {6, 7}}  # last -> first


def test_a_middle_failure_is_served_from_the_next_stage_replica() -> None:
    new = plan_of(((0, 2), ("a",)), ((3, 5), ("b",)), ((6, 7), ("d",)))
    plan = redistribute_weights(old=OLD, new=new, failed={"c"}, profile=PROFILE)
    assert plan.keep == {"a": ((0, 1),), "b": ((3, 3),), "d": ((6, 7),)}
    fetches = {(t.device, t.layers, t.source, t.replica) for t in plan.fetch}
    assert fetches == {("a", (2, 2), "b", False),  # live weights from the old owner
                       ("b", (4, 5), "d", True)}  # c is gone: its replica on d
    assert plan.bytes_moved == 300 + 500 + 600
    assert plan.drop == {"a": ((6, 7),), "b": ((0, 2),), "d": ((4, 5),)}


def test_first_stage_failure_and_lost_replicas_fall_back_to_the_central_store() -> None:
    new = plan_of(((0, 3), ("b",)), ((4, 7), ("c",)))
    plan = redistribute_weights(old=OLD, new=new, failed={"a", "d"}, profile=PROFILE)
    fetches = {(t.device, t.layers, t.source) for t in plan.fetch}
    # b keeps a's layers from its own chain replica; d's layers only the server still has
    assert plan.keep["b"] == ((0, 3),)
    assert fetches == {("c", (6, 7), CENTRAL)}
    assert plan.keep["c"] == ((4, 5),)


def test_live_weights_beat_a_stale_replica() -> None:
    new = plan_of(((0, 0), ("a",)), ((1, 7), ("b",)))
    plan = redistribute_weights(old=OLD, new=new, failed=set(), profile=PROFILE)
    sources = {t.layers: (t.source, t.replica) for t in plan.fetch if t.device == "b"}
    assert sources[(1, 1)] == ("a", False)  # not b's own replica of stage 0
    assert sources[(4, 5)] == ("c", False)


@given(st.lists(st.integers(1, 3), min_size=1, max_size=4), st.sets(st.sampled_from("abcd")))
def test_every_needed_layer_is_kept_or_fetched_once(sizes: list[int], failed: set[str]) -> None:
    survivors = [d for d in "abcd" if d not in failed][: len(sizes)]
    if not survivors:
        return
    sizes = sizes[: len(survivors)]
    sizes[-1] += 8 - sum(sizes) if sum(sizes) < 8 else 0
    if sum(sizes) != 8:
        return
    bounds = [sum(sizes[:k]) for k in range(len(sizes) + 1)]
    new = plan_of(*(((bounds[k], bounds[k + 1] - 1), (d,)) for k, d in enumerate(survivors)))
    plan = redistribute_weights(old=OLD, new=new, failed=failed, profile=PROFILE)
    for stage in new.stages:
        device = stage.devices[0]
        got = [i for a, e in plan.keep.get(device, ()) for i in range(a, e + 1)]
        got += [i for t in plan.fetch if t.device == device
                for i in range(t.layers[0], t.layers[1] + 1)]
        assert sorted(got) == list(range(stage.first, stage.last + 1))
    assert all(t.source not in failed for t in plan.fetch)


def test_redistribution_rejects_inconsistent_plans() -> None:
    with pytest.raises(ValueError, match="uses failed device 'a'"):
        redistribute_weights(old=OLD, new=plan_of(((0, 7), ("a",))), failed={"a"},
                             profile=PROFILE)
    with pytest.raises(ValueError, match="covers 6 layers, the profile has 8"):
        redistribute_weights(old=OLD, new=plan_of(((0, 5), ("a",))), failed=set(),
                             profile=PROFILE)


def test_evaluate_agrees_with_capacity_estimation_round_trip() -> None:
    cm = build_cost_model(PROFILE, DeviceSet(devices=(make_device("a", 3.0),)))
    plan = plan_of(((0, 7), ("a",)))
    period = evaluate(cm, plan.stages).period_s
    same = estimate_capacities(cm, plan, measured_s={"a": period})
    assert same.device("a").speed == pytest.approx(3.0)



def test_capacity_leaves_the_fixed_overhead_out_of_the_speed() -> None:
    cm = build_cost_model(PROFILE, DeviceSet(devices=(make_device("a", 1.0, overhead_s=1.0),)))
    plan = plan_of(((0, 7), ("a",)))
    # 24 s of layers + 1 s overhead predicted; measured 13 s: the layers ran in 12 s
    updated = estimate_capacities(cm, plan, measured_s={"a": 13.0})
    assert updated.device("a").speed == pytest.approx(2.0)
    again = build_cost_model(PROFILE, updated)
    assert again.device_s(0, 0, 7) == pytest.approx(13.0)
