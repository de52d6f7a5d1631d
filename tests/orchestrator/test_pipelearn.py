"""PipeLearn's time model (orchestrator.pipelearn): the DP against brute force over the stage
DAG's paths, the closed form, equation 14 and the choice of (P, N) against exhaustive search on
the shared profiles and on random ones."""

from __future__ import annotations

import re
import time
from functools import cache
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.cost import build_cost_model
from orchestrator.formats import load_devices, load_profile, parse_devices, parse_profile
from orchestrator.pipelearn import (
    STAGES,
    TABLE_I,
    Edge,
    Node,
    StageTimes,
    asap_schedule,
    choose_split,
    closed_form_iteration_time,
    dag_edges,
    exhaustive_split,
    iteration_time,
    parallel_batches,
    parallel_batches_eq14,
    server_slowdown,
    stage_times,
)
from tests.conftest import DATA

times = st.one_of(st.just(0.0), st.floats(0.001, 10.0))
stage_sets = st.builds(StageTimes, times, times, times, times, times, times,
                       st.one_of(st.just(0.0), st.floats(0.0, 2.0)))


def brute_force_longest_path(stages: StageTimes, n: int) -> float:
    """Enumerate every path of the DAG from every source to every sink and take the longest."""
    edges = dag_edges(stages=stages, parallel_batches=n)
    out: dict[Node, list[Edge]] = {}
    has_pred: set[Node] = set()
    for e in edges:
        out.setdefault(e.before, []).append(e)
        has_pred.add(e.after)
    nodes = [(s, i) for s in STAGES for i in range(n)]

    def duration(v: Node) -> float:
        return stages.of(v[0]) / n

    def paths_from(v: Node) -> list[float]:
        tails = [e.delay_s + rest for e in out.get(v, []) for rest in paths_from(e.after)]
        return [duration(v) + t for t in tails] or [duration(v)]

    return max(length for v in nodes if v not in has_pred for length in paths_from(v))


@given(stages=stage_sets, n=st.integers(1, 5))
def test_dp_equals_brute_force_enumeration_of_paths(stages: StageTimes, n: int) -> None:
    expected = brute_force_longest_path(stages, n)
    assert iteration_time(stages=stages, parallel_batches=n) == pytest.approx(expected, rel=1e-9,
                                                                              abs=1e-12)


@given(stages=stage_sets, n=st.integers(1, 60))
def test_dp_closed_form_and_asap_schedule_agree(stages: StageTimes, n: int) -> None:
    dp = iteration_time(stages=stages, parallel_batches=n)
    assert closed_form_iteration_time(stages=stages, parallel_batches=n) == pytest.approx(
        dp, rel=1e-9, abs=1e-12)
    schedule = asap_schedule(stages=stages, parallel_batches=n)
    assert schedule[("device_backward", n - 1)][1] == pytest.approx(dp, rel=1e-9, abs=1e-12)
    for e in dag_edges(stages=stages, parallel_batches=n):
        assert schedule[e.after][0] >= schedule[e.before][1] + e.delay_s - 1e-9


def test_dp_is_linear_in_n() -> None:
    stages = StageTimes(1.0, 3.0, 0.5, 0.7, 2.0, 2.0, latency_s=0.01)
    started = time.perf_counter()
    value = iteration_time(stages=stages, parallel_batches=200_000)
    assert time.perf_counter() - started < 2.0
    assert value == pytest.approx(0.02 + 3.0 + (1.0 + 1.2 + 2.0 + 2.0) / 200_000)


def test_table_i_as_data() -> None:
    pairs = {(p.stage, p.after, p.offset) for p in TABLE_I}
    assert ("server_forward", "server_backward", -1) in pairs  # one micro-batch at a time
    assert ("download", "server_backward", 0) in pairs
    assert {p.stage for p in TABLE_I if p.latency} == {"server_forward", "device_backward"}
    edges = dag_edges(stages=StageTimes(1, 1, 1, 1, 1, 1), parallel_batches=3)
    assert Edge(("device_forward", 2), ("device_backward", 0), 0.0) in edges
    assert len(edges) == 1 + 3 * len(TABLE_I) - 5  # the five "i-1" rows have no i = 0 edge


@pytest.mark.parametrize(("stages", "n", "expected"), [
    # serial split learning (N = 1): every stage in sequence, plus two latencies
    (StageTimes(1, 10, 0.05, 0.1, 5, 2, latency_s=0.1), 1, 18.35),
    # network bound: the upload chain plus one micro-batch of everything else
    (StageTimes(1, 10, 0.05, 0.1, 5, 2, latency_s=0.1), 10, 10.2 + 0.815),
    # device bound: all forwards, then all backwards
    (StageTimes(4, 1, 0.5, 0.5, 1, 8), 8, 12.0),
    (StageTimes(0, 0, 0, 0, 0, 0), 4, 0.0),
])
def test_iteration_time_table(stages: StageTimes, n: int, expected: float) -> None:
    assert iteration_time(stages=stages, parallel_batches=n) == pytest.approx(expected)


@given(stages=stage_sets.filter(lambda s: s.latency_s == 0), b=st.integers(1, 64))
def test_eq14_reaches_the_optimum_when_the_device_is_the_bottleneck(stages: StageTimes,
                                                                    b: int) -> None:
    if max(stages.resources) not in (stages.device_forward_s, stages.device_backward_s):
        return
    n = parallel_batches_eq14(stages=stages, batch_size=b)
    best = min(iteration_time(stages=stages, parallel_batches=k) for k in range(1, b + 1))
    assert iteration_time(stages=stages, parallel_batches=n) == pytest.approx(best, rel=1e-9,
                                                                              abs=1e-12)


def test_eq14_alone_is_far_from_best_when_the_network_is_the_bottleneck() -> None:
    stages = StageTimes(0.5, 1.0, 0.0, 0.0, 1.0, 0.5)
    eq14 = parallel_batches(stages=stages, batch_size=100, rule="eq14")
    saturated = parallel_batches(stages=stages, batch_size=100, rule="saturated")
    assert eq14 == 5 and iteration_time(stages=stages, parallel_batches=eq14) == pytest.approx(1.4)
    assert saturated > eq14
    assert iteration_time(stages=stages, parallel_batches=saturated) <= 1.01 * iteration_time(
        stages=stages, parallel_batches=100)


@given(stages=stage_sets, b=st.integers(1, 64))
def test_saturated_rule_is_within_tolerance_of_the_best_n(stages: StageTimes, b: int) -> None:
    n = parallel_batches(stages=stages, batch_size=b, tolerance=0.01)
    assert 1 <= n <= b
    best = min(iteration_time(stages=stages, parallel_batches=k) for k in range(1, b + 1))
    assert iteration_time(stages=stages, parallel_batches=n) <= best * 1.01 + 1e-12


# --------------------------------------------------------------------------- profiles


@cache
def shared(model: str) -> Any:
    profile = load_profile(DATA / "profiles" / f"{model}_cifar10.model.json")
    devices = load_devices(DATA / "profiles" / f"{model}_cifar10.devices.json")
    return build_cost_model(profile, devices)


@pytest.mark.parametrize("model", ["vgg5", "resnet18", "resnet101"])
def test_choice_scores_at_least_098_on_the_shared_profiles(model: str) -> None:
    cm = shared(model)
    batch = 100 if model != "resnet101" else 32
    clients = [d for d in cm.devices.ids if d != "edge-vm"]
    sigma = server_slowdown(clients=len(clients))
    for device in clients:
        args = {"cm": cm, "device": device, "server": "edge-vm", "batch_size": batch,
                "slowdown": sigma}
        chosen = choose_split(**args)
        best = exhaustive_split(**args)
        assert best.iteration_s / chosen.iteration_s >= 0.98, (model, device)
        assert chosen.iteration_s == pytest.approx(
            iteration_time(stages=chosen.stages, parallel_batches=chosen.parallel_batches))


layer_st = st.fixed_dictionaries({
    "forward_s": st.floats(0.0, 1.0), "backward_s": st.floats(0.0, 2.0),
    "output_bytes": st.integers(1, 10_000_000), "param_bytes": st.integers(0, 10_000_000)})


@st.composite
def random_setting(draw: st.DrawFn) -> tuple[Any, int]:
    layers = draw(st.lists(layer_st, min_size=2, max_size=7))
    layers[0]["forward_s"] += 0.01  # the profile must have some work
    profile = parse_profile({"model": "random", "batch_size": draw(st.integers(1, 64)),
                             "reference": "server", "layers": [
                                 dict(la, name=f"l{i}", kind="layer", activation_bytes=0)
                                 for i, la in enumerate(layers)]})
    client: dict[str, Any] = {
        "id": "client", "speed": draw(st.floats(0.01, 2.0)), "memory_bytes": 1,
        "bandwidth_bps": 1e6, "uplink_bps": draw(st.floats(1e4, 1e8)),
        "downlink_bps": draw(st.floats(1e4, 1e8)), "latency_s": draw(st.floats(0.0, 0.05))}
    if draw(st.booleans()):  # measured times, not proportional to the reference
        client["layer_times"] = {
            "forward_s": [draw(st.floats(0.0, 3.0)) for _ in layers],
            "backward_s": [draw(st.floats(0.0, 6.0)) for _ in layers]}
    devices = parse_devices({"devices": [
        {"id": "server", "speed": draw(st.floats(0.5, 50.0)), "memory_bytes": 1,
         "bandwidth_bps": 1e8}, client]})
    return build_cost_model(profile, devices), draw(st.integers(1, 24))


@given(setting=random_setting(), sigma=st.sampled_from([1.0, 2.0, 4.0]))
def test_choice_scores_at_least_098_on_random_profiles(setting: tuple[Any, int],
                                                       sigma: float) -> None:
    cm, batch = setting
    args = {"cm": cm, "device": "client", "server": "server", "batch_size": batch,
            "slowdown": sigma}
    chosen = choose_split(**args)
    best = exhaustive_split(**args)
    assert 1 <= chosen.parallel_batches <= batch and 1 <= chosen.split < cm.num_layers
    assert best.iteration_s <= chosen.iteration_s + 1e-12
    assert best.iteration_s / chosen.iteration_s >= 0.98


def test_stage_times_follow_equations_5_to_10() -> None:
    profile = parse_profile({"model": "m", "batch_size": 10, "reference": "s", "layers": [
        {"name": "a", "kind": "conv", "forward_s": 1.0, "backward_s": 2.0, "output_bytes": 1000,
         "param_bytes": 400, "activation_bytes": 0},
        {"name": "b", "kind": "dense", "forward_s": 0.5, "backward_s": 1.0, "output_bytes": 40,
         "param_bytes": 800, "activation_bytes": 0}]})
    devices = parse_devices({"devices": [
        {"id": "s", "speed": 10.0, "memory_bytes": 1, "bandwidth_bps": 1e6},
        {"id": "c", "speed": 0.5, "memory_bytes": 1, "bandwidth_bps": 1e6, "uplink_bps": 100.0,
         "downlink_bps": 200.0, "latency_s": 0.1}]})
    cm = build_cost_model(profile, devices)
    st1 = stage_times(cm=cm, device="c", server="s", split=1, batch_size=20, slowdown=3.0)
    # r = 20/10 = 2: device 1.0/0.5 * 2, server 0.5/10 * 2 * sigma, 2000 bytes over the links
    assert st1.to_json() == pytest.approx(
        StageTimes(4.0, 20.0, 0.3, 0.6, 10.0, 8.0, latency_s=0.1).to_json())
    with pytest.raises(ValueError, match=re.escape("split must be in 1..1")):
        stage_times(cm=cm, device="c", server="s", split=2, batch_size=20)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: StageTimes(1, -1, 0, 0, 0, 0), "upload_s must be a finite number >= 0, got -1"),
    (lambda: StageTimes(1, float("nan"), 0, 0, 0, 0), "upload_s must be a finite number"),
    (lambda: iteration_time(stages=StageTimes(1, 1, 1, 1, 1, 1), parallel_batches=0),
     "parallel_batches must be an integer >= 1, got 0"),
    (lambda: parallel_batches(stages=StageTimes(1, 1, 1, 1, 1, 1), batch_size=0),
     "batch_size must be an integer >= 1, got 0"),
    (lambda: parallel_batches(stages=StageTimes(1, 1, 1, 1, 1, 1), batch_size=8,
                              rule="fast"),  # type: ignore[arg-type]
     "unknown rule 'fast'"),
    (lambda: parallel_batches(stages=StageTimes(1, 1, 1, 1, 1, 1), batch_size=8, tolerance=0),
     "tolerance must be a number > 0, got 0"),
    (lambda: server_slowdown(clients=3, parallelism=0), "parallelism must be at least 1, got 0"),
    (lambda: StageTimes(1, 1, 1, 1, 1, 1).of("upload_s"), "unknown stage 'upload_s'"),
])
def test_errors_name_the_bad_value(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


@pytest.mark.parametrize(("clients", "parallelism", "expected"),
                         [(1, 1, 1.0), (4, 1, 4.0), (4, 2, 2.0), (3, 8, 1.0)])
def test_server_slowdown(clients: int, parallelism: int, expected: float) -> None:
    assert server_slowdown(clients=clients, parallelism=parallelism) == expected


# ------------------------------------------------------------------ a cost per micro-batch

_times = st.floats(min_value=0.0, max_value=5.0, allow_nan=False)
_fixed = st.floats(min_value=0.0, max_value=0.2, allow_nan=False)


@given(st.tuples(*[_times] * 6), st.tuples(*[_fixed] * 6),
       st.floats(min_value=0.0, max_value=0.5), st.integers(1, 24))
def test_a_cost_per_microbatch_keeps_the_closed_form_equal_to_the_longest_path(
        whole: tuple[float, ...], fixed: tuple[float, ...], latency: float, n: int) -> None:
    from orchestrator.pipelearn import closed_form_iteration_time

    stages = StageTimes(*whole, latency_s=latency, pass_s=fixed)
    longest = iteration_time(stages=stages, parallel_batches=n)
    assert closed_form_iteration_time(stages=stages, parallel_batches=n) == pytest.approx(
        longest, rel=1e-9, abs=1e-9)
    assert max(end for _, end in asap_schedule(stages=stages, parallel_batches=n).values()
               ) == pytest.approx(longest, rel=1e-9, abs=1e-9)


@given(st.tuples(*[_times] * 6), st.tuples(*[_fixed] * 6), st.integers(1, 40))
def test_with_a_cost_per_microbatch_n_is_the_fastest_by_brute_force(
        whole: tuple[float, ...], fixed: tuple[float, ...], batch: int) -> None:
    from orchestrator.pipelearn import parallel_batches

    stages = StageTimes(*whole, latency_s=0.01, pass_s=fixed)
    chosen = parallel_batches(stages=stages, batch_size=batch)
    # the N the authors' rounding keeps: the largest of each micro-batch size B // N
    kept = {batch // (batch // n) for n in range(1, batch + 1)}
    times = {n: iteration_time(stages=stages, parallel_batches=n) for n in kept}
    if stages.fixed:  # within the rule's 1% of the fastest of them
        assert chosen in kept and times[chosen] <= 1.01 * min(times.values()) + 1e-12
    assert 1 <= chosen <= batch


def test_a_measured_overhead_stops_n_from_making_one_sample_microbatches() -> None:
    # a link-bound device: without a cost per micro-batch N climbs to B (32 one-sample
    # micro-batches); 1 ms a pass (the runtime's measured overhead) stops it
    from orchestrator.pipelearn import parallel_batches

    free = StageTimes(0.002, 0.01, 0.002, 0.002, 0.01, 0.002)
    assert parallel_batches(stages=free, batch_size=32) == 32
    costly = StageTimes(0.002, 0.01, 0.002, 0.002, 0.01, 0.002,
                        pass_s=(0.001, 0.0, 0.001, 0.001, 0.0, 0.001))
    n = parallel_batches(stages=costly, batch_size=32)
    assert n < 8
    assert iteration_time(stages=costly, parallel_batches=n) < iteration_time(
        stages=costly, parallel_batches=32)
