"""The cost model against hand-computed figures (docs/architecture.md, "Cost model")."""

from __future__ import annotations

import pytest

from orchestrator.cost import (
    CostModel,
    build_cost_model,
    choose_inflight,
    choose_lag,
    evaluate,
    messages_table,
    needed_inflight,
    pass_messages,
    replica_inflight,
    stage_messages,
)
from orchestrator.errors import FormatError, PlanningError
from orchestrator.formats import DeviceSet, LayerTimes, Link, Resource
from orchestrator.planformat import Stage
from tests.orchestrator.instances import make_device, make_profile

MB = 1_000_000


def lab() -> CostModel:
    # 4 layers: reference fwd+bwd work 1, 2, 3, 4 seconds
    profile = make_profile([(0.5, 0.5), (1.0, 1.0), (1.0, 2.0), (2.0, 2.0)],
                           output_bytes=[1 * MB, 2 * MB, 3 * MB, 4 * MB],
                           param_bytes=[10 * MB, 20 * MB, 30 * MB, 40 * MB],
                           activation_bytes=[1 * MB, 1 * MB, 1 * MB, 1 * MB])
    devices = DeviceSet(devices=(
        make_device("fast", 2.0, bandwidth_bps=10 * MB, latency_s=0.01, memory_bytes=10**9),
        make_device("slow", 0.5, bandwidth_bps=4 * MB, latency_s=0.002, memory_bytes=200 * MB),
        make_device("mid", 1.0, bandwidth_bps=8 * MB, latency_s=0.0, memory_bytes=10**9),
    ), links=(Link("fast", "mid", 2 * MB),))
    return build_cost_model(profile, devices)


def test_single_device_stages() -> None:
    cm = lab()
    stages = (Stage((0, 1), ("fast",)), Stage((2, 3), ("slow",)))
    p = evaluate(cm, stages)
    # stage 0: work 3 on speed 2 -> 1.5 s; stage 1: work 7 on speed 0.5 -> 14 s
    assert p.stage_s == pytest.approx((1.5, 14.0))
    # boundary after layer 1: 2 MB over min(10, 4) MB/s + max latency 0.01, twice
    assert p.boundary_s == pytest.approx((2 * (2 * MB / (4 * MB) + 0.01),))
    assert p.period_s == pytest.approx(14.0)
    assert p.bottleneck == "stage 1 compute"
    assert p.throughput_sps == pytest.approx(32 / 14.0)
    # memory: stage 0 of 2: (2-0)(30+2 MB) + 2*30 MB; stage 1: (2-1)(70+2) + 2*70
    assert p.memory_need_bytes["fast"] == 124 * MB
    assert p.memory_need_bytes["slow"] == 212 * MB
    assert not p.memory_ok  # slow has 200 MB


def test_replicated_stage_compute_and_ring_sync() -> None:
    cm = lab()
    p = evaluate(cm, (Stage((0, 2), ("fast", "mid")), Stage((3, 3), ("slow",))))
    # t_fast = 6/2 = 3, t_mid = 6/1 = 6 -> C = 1/(1/3 + 1/6) = 2
    # Y = 2 (2-1)/2 * 60 MB / link(fast, mid) 2 MB/s = 30 s
    assert p.stage_s[0] == pytest.approx(30.0)
    assert p.bottleneck == "stage 0 sync"
    # boundary: worst of fast->slow (3MB/4MB/s + .01) and mid->slow (3/4 + .002), doubled
    assert p.boundary_s[0] == pytest.approx(2 * (0.75 + 0.01))


def test_link_boundary_and_latency_bottleneck() -> None:
    cm = lab()
    p = evaluate(cm, (Stage((0, 0), ("fast",)), Stage((1, 3), ("mid",))))
    # boundary uses the fast-mid link (2 MB/s): 2 * (1 MB / 2 MB/s + 0.01) = 1.02
    assert p.boundary_s == pytest.approx((1.02,))
    assert p.stage_s == pytest.approx((0.5, 9.0))
    p2 = evaluate(cm, (Stage((0, 0), ("mid",)), Stage((1, 3), ("fast",))))
    assert p2.boundary_s == pytest.approx((1.02,))  # links are symmetric


def test_measured_layer_times_replace_speed() -> None:
    profile = make_profile([(1.0, 1.0), (1.0, 1.0)])
    measured = LayerTimes(forward_s=(0.1, 0.2), backward_s=(0.3, 0.4))
    cm = build_cost_model(profile, DeviceSet(devices=(
        make_device("m", 100.0, layer_times=measured),)))
    assert evaluate(cm, (Stage((0, 1), ("m",)),)).period_s == pytest.approx(1.0)


def test_incompatible_layer_times_are_refused() -> None:
    profile = make_profile([(1.0, 1.0), (1.0, 1.0)])
    bad = make_device("m", layer_times=LayerTimes((0.1,), (0.1,)))
    with pytest.raises(FormatError, match="has 1 entries"):
        build_cost_model(profile, DeviceSet(devices=(bad,)))


def test_beta_replaces_compute_with_the_split() -> None:
    # one device, two resources: cpu good at forward, gpu good at backward
    profile = make_profile([(2.0, 4.0)])
    dev = make_device("w", resources=(Resource("cpu", 1.0, 0.5), Resource("gpu", 1.0, 2.0)),
                      speed=2.0)
    cm = build_cost_model(profile, DeviceSet(devices=(dev,)))
    stage = (Stage((0, 0), ("w",)),)
    # beta cpu=1, gpu=0: forward 2 / 1 = 2 s, backward 4 / 2 = 2 s -> C = 2
    p = evaluate(cm, stage, beta={"w": {"cpu": 1.0, "gpu": 0.0}})
    assert p.period_s == pytest.approx(2.0)
    # beta 0.5/0.5: forward 2 / (0.5 + 0.5) = 2, backward 4 / (0.25 + 1) = 3.2
    assert evaluate(cm, stage, beta={"w": {"cpu": 0.5, "gpu": 0.5}}).period_s == pytest.approx(3.2)
    with pytest.raises(PlanningError, match="beta has no fraction for resource 'gpu'"):
        evaluate(cm, stage, beta={"w": {"cpu": 1.0}})
    # a device beta leaves out runs its passes one after the other; a group's replicas share
    # micro-batches by their own rates: 1 / (1/2 + 1/3)
    two = build_cost_model(profile, DeviceSet(devices=(dev, make_device("v", 2.0))))
    group = (Stage((0, 0), ("w", "v")),)
    assert evaluate(two, group, beta={"w": {"cpu": 1.0, "gpu": 0.0}}).stage_s[0] == \
        pytest.approx(1 / (1 / 2 + 1 / 3))
    # without beta the contract uses speed alone: (2 + 4) / 2
    assert evaluate(cm, stage).period_s == pytest.approx(3.0)


def test_bottleneck_names_the_first_of_equal_maxima() -> None:
    profile = make_profile([(1.0, 1.0), (1.0, 1.0)])
    cm = build_cost_model(profile, DeviceSet(devices=(make_device("a"), make_device("b"))))
    p = evaluate(cm, (Stage((0, 0), ("a",)), Stage((1, 1), ("b",))))
    assert p.bottleneck == "stage 0 compute"


def test_zero_period_is_an_error() -> None:
    profile = make_profile([(1.0, 1.0), (0.0, 0.0)])
    cm = build_cost_model(profile, DeviceSet(devices=(make_device("a"),)))
    assert evaluate(cm, (Stage((0, 1), ("a",)),)).period_s == pytest.approx(2.0)
    # a stage of zero-time layers alone still has a compute time of 0 but the period is
    # positive thanks to the other stage
    cm2 = build_cost_model(profile, DeviceSet(devices=(make_device("a"), make_device("b"))))
    assert evaluate(cm2, (Stage((0, 0), ("a",)), Stage((1, 1), ("b",)))).stage_s[1] == 0.0


def test_inflight_covers_the_1f1b_cycles() -> None:
    from orchestrator.planformat import Prediction

    def depths(stage_s: tuple[float, ...], boundary_s: tuple[float, ...]) -> tuple[int, ...]:
        period = max(stage_s + boundary_s)
        return needed_inflight(Prediction(period, "", 1.0, True, stage_s, boundary_s))

    assert depths((1.0, 1.0, 1.0, 1.0), (0.0, 0.0, 0.0)) == (4, 3, 2, 1)  # PipeDream's S - k
    # a cycle that crosses a link keeps a period to spare (late messages), and a transfer
    # that does not fit in the stages' spare time needs one more micro-batch
    assert depths((0.4, 1.0), (0.0,)) == (2, 1)  # no transfer: no link to be late
    assert depths((0.4, 1.0), (0.05,)) == (3, 1)  # 0.4 + 1 + 0.05 + slack 1 > 2 periods
    assert depths((1.0, 1.0), (0.5,)) == (4, 1)  # 1 + 1 + 0.5 + 1 > 3 periods
    assert depths((1.0, 1.0, 1.0), (0.2, 0.2)) == (7, 4, 1)


def test_inflight_is_capped_by_memory_and_keeps_falling() -> None:
    cm = lab()
    stages = (Stage((0, 0), ("fast",)), Stage((1, 2), ("mid",)), Stage((3, 3), ("slow",)))
    p = evaluate(cm, stages)
    assert choose_inflight(cm, stages, p) == needed_inflight(p)
    # slow (200 MB) holds the middle stage: (P + A) = 52 MB a micro-batch, 2P = 100 MB, so at
    # most 1 more than... nothing: it stays at S - k = 2 and the first stage stays above it
    stages = (Stage((0, 0), ("fast",)), Stage((1, 2), ("slow",)), Stage((3, 3), ("mid",)))
    p = evaluate(cm, stages)
    chosen = choose_inflight(cm, stages, p)
    assert chosen[1] == 2
    assert all(chosen[k] > chosen[k + 1] for k in range(2))
    assert all(chosen[k] >= 3 - k for k in range(3))


def test_replicas_keep_their_own_span_in_flight_and_lag_for_their_peers() -> None:
    # two stages of 1 s on one fast device and a group of a 2 s and a 6 s device (C = 1.5)
    profile = make_profile([(0.5, 0.5), (0.5, 0.5)], param_bytes=[0, 4 * MB])
    cm = build_cost_model(profile, DeviceSet(devices=(
        make_device("a", 1.0), make_device("b", 0.5, bandwidth_bps=8 * MB),
        make_device("c", 1 / 6, bandwidth_bps=8 * MB))))
    stages = (Stage((0, 0), ("a",)), Stage((1, 1), ("b", "c")))
    p = evaluate(cm, stages)
    assert p.period_s == pytest.approx(1.5) and p.stage_s[1] == pytest.approx(1.5)
    inflight = choose_inflight(cm, stages, p)
    # the first stage's cycle crosses the slowest replica: 1 + 6 s, 5 periods (no link)
    assert inflight == (5, 1)
    assert replica_inflight(cm, stages, p, inflight) == {"b": 1, "c": 1}
    # c's micro-batch takes 6 s = 4 periods, then its gradient 0.5 s (Y = 4 MB / 8 MB/s) to
    # b, with a period to spare: the second stage forwards 4 + 2 behind
    assert choose_lag(cm, stages, p, inflight) == (5, 4 + 2)
    assert choose_lag(cm, (stages[0], Stage((1, 1), ("b",))), p, (2, 1)) is None
    # a fast replica of a first stage needs less of the second stage's span than a slow one
    stages = (Stage((0, 0), ("a", "c")), Stage((1, 1), ("b",)))
    p = evaluate(cm, stages)
    inflight = choose_inflight(cm, stages, p)
    windows = replica_inflight(cm, stages, p, inflight)
    assert windows["a"] < windows["c"] == inflight[0]


def test_a_devices_overhead_is_paid_once_per_stage() -> None:
    profile = make_profile([(1.0, 1.0)] * 4)
    cm = build_cost_model(profile, DeviceSet(devices=(
        make_device("a", 2.0, overhead_s=0.5), make_device("b", 1.0))))
    p = evaluate(cm, (Stage((0, 1), ("a",)), Stage((2, 3), ("b",))))
    # a: 4 s of layers at speed 2 plus 0.5 s; b: 4 s
    assert p.stage_s == pytest.approx((2.5, 4.0))
    assert cm.pass_s(0, 0, 1) == pytest.approx((1.25, 1.25))
    # replicas: passes of 4 s (a) and 8 s (b) shared by speed, and a's 0.5 s paid for every
    # micro-batch of the stage (a applies b's updates too): (1 + 0.5 / 4) / (1/4 + 1/8)
    both = evaluate(cm, (Stage((0, 3), ("a", "b")),))
    assert both.stage_s[0] == pytest.approx((1 + 0.5 / 4) / (1 / 4 + 1 / 8))
    assert both.stage_s[0] > 1 / (1 / 4.5 + 1 / 8.0)  # per micro-batch of its own only


def test_a_stage_pays_for_each_message_it_sends() -> None:
    # first stage: its activation (the labels ride with it); middle: its activation and its
    # input's gradient; last: its input's gradient; a stage of the whole model: none
    assert pass_messages(0, 1, 6) == (1, 0)
    assert pass_messages(2, 3, 6) == (1, 1)
    assert pass_messages(4, 5, 6) == (0, 1)
    assert pass_messages(0, 5, 6) == (0, 0)
    table = messages_table(6)
    assert [table[0, 2], table[2, 4], table[4, 6], table[0, 6]] == [1, 2, 1, 0]
    assert all(table[a, e + 1] == stage_messages(a, e, 6) for a in range(6) for e in range(a, 6))
    profile = make_profile([(1.0, 1.0)] * 6)
    cm = build_cost_model(profile, DeviceSet(devices=(
        make_device("a", 1.0, overhead_s=0.5, message_s=0.25), make_device("b", 1.0),
        make_device("c", 1.0, message_s=0.1))))
    p = evaluate(cm, (Stage((0, 1), ("a",)), Stage((2, 3), ("b",)), Stage((4, 5), ("c",))))
    assert p.stage_s == pytest.approx((4.0 + 0.5 + 0.25, 4.0, 4.0 + 0.1))
    assert cm.pass_s(0, 0, 1) == pytest.approx((2.25 + 0.25, 2.25))
    alone = evaluate(cm, (Stage((0, 5), ("a",)),))
    assert alone.stage_s[0] == pytest.approx(12.5)  # nothing to send
    middle = evaluate(cm, (Stage((0, 0), ("b",)), Stage((1, 4), ("a",)), Stage((5, 5), ("c",))))
    assert middle.stage_s[1] == pytest.approx(8.0 + 0.5 + 2 * 0.25)


def test_a_plan_says_when_its_replicas_forward_on_stale_weights() -> None:
    from orchestrator.partition import run_planner

    profile = make_profile([(1.0, 1.0)] * 2, param_bytes=[MB, MB])
    cm = build_cost_model(profile, DeviceSet(devices=(make_device("a", 1.0),
                                                      make_device("b", 0.25))))
    bsp = run_planner(cm, "bsp")
    assert bsp.lag is not None and bsp.lag[0] > (bsp.inflight or (1,))[0]
    assert any(f"weights {bsp.lag[0]} updates old" in n for n in bsp.notes)
    assert not run_planner(cm, "bsp", schedule="gpipe").notes  # synchronous: no staleness
    assert not run_planner(cm, "optimal").notes  # one device per stage
