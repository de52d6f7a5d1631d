"""Exactly-once recovery over versioned holdings (orchestrator.recovery): the resume point, the
restore plan (Algorithm 1 over copies at one applied) and dynamic re-partition's break-even."""

from __future__ import annotations

import math
from itertools import groupby, pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.errors import PlanningError
from orchestrator.formats import ModelProfile
from orchestrator.planformat import Plan, Stage
from orchestrator.recovery import (
    CENTRAL,
    SELF,
    Decision,
    Holding,
    Part,
    RecoveryError,
    RestorePlan,
    group_shrinks,
    repartition_decision,
    restore_plan,
    resume_point,
)
from orchestrator.redistribution import CENTRAL as REDISTRIBUTION_CENTRAL
from orchestrator.redistribution import holdings as old_holdings
from orchestrator.redistribution import redistribute_weights
from tests.orchestrator.instances import make_profile

N = 8
PROFILE = make_profile([(1.0, 2.0)] * N, param_bytes=[100 * (i + 1) for i in range(N)])
POOL = ("a", "b", "c", "d", "e")


def plan_of(*stages: tuple[tuple[int, int], tuple[str, ...]]) -> Plan:
    return Plan(algorithm="manual", schedule="1f1b", microbatches=4,
                stages=tuple(Stage(layers, devices) for layers, devices in stages))


def own(device: str, a: int, e: int, applied: int) -> Holding:
    return Holding(device=device, layers=(a, e), applied=applied, kind="own")


def replica(device: str, a: int, e: int, applied: int) -> Holding:
    return Holding(device=device, layers=(a, e), applied=applied, kind="replica")


def central(a: int, e: int, applied: int) -> Holding:
    return Holding(device=CENTRAL, layers=(a, e), applied=applied, kind="central")


def per_layer(plan: RestorePlan) -> dict[tuple[str, int], Part]:
    """(device, layer) -> the part that loads it; fails on a layer loaded twice."""
    out: dict[tuple[str, int], Part] = {}
    for part in plan.parts:
        for layer in range(part.layers[0], part.layers[1] + 1):
            assert (part.device, layer) not in out, f"{part.device} loads {layer} twice"
            out[part.device, layer] = part
    return out


# --------------------------------------------------------------------------- strategies


@st.composite
def holdings_st(draw: st.DrawFn, *, num_layers: int = N, max_applied: int = 4) -> list[Holding]:
    out = []
    for _ in range(draw(st.integers(0, 12))):
        device = draw(st.sampled_from((*POOL[:4], CENTRAL)))
        kind = "central" if device == CENTRAL else draw(st.sampled_from(("own", "replica")))
        a = draw(st.integers(0, num_layers - 1))
        e = draw(st.integers(a, num_layers - 1))
        out.append(Holding(device=device, layers=(a, e), applied=draw(st.integers(0, max_applied)),
                           kind=kind))
    return out


@st.composite
def covering_st(draw: st.DrawFn) -> list[Holding]:
    """Random holdings plus a few that together cover every layer at one applied (so that a
    resume point usually exists, often contested by several copies of a layer)."""
    out = draw(holdings_st())
    for _ in range(draw(st.integers(1, 3))):
        v = draw(st.integers(0, 4))
        cuts = sorted(draw(st.sets(st.integers(1, N - 1), max_size=N - 1)))
        bounds = [0, *cuts, N]
        for a, end in pairwise(bounds):
            device = draw(st.sampled_from((*POOL[:4], CENTRAL)))
            kind = "central" if device == CENTRAL else draw(st.sampled_from(("own", "replica")))
            out.append(Holding(device=device, layers=(a, end - 1), applied=v, kind=kind))
    return out


@st.composite
def plans_st(draw: st.DrawFn, *, devices: tuple[str, ...] = POOL, num_layers: int = N,
             max_per_stage: int = 2) -> Plan:
    """A plan over some of ``devices`` (each serving one stage), stages of 1 or more devices."""
    chosen = draw(st.permutations(devices))
    chosen = chosen[: draw(st.integers(1, len(chosen)))]
    groups: list[tuple[str, ...]] = []
    i = 0
    while i < len(chosen):
        size = draw(st.integers(1, max_per_stage))
        groups.append(tuple(chosen[i:i + size]))
        i += size
    groups = groups[:num_layers]
    cuts = sorted(draw(st.sets(st.integers(1, num_layers - 1), min_size=len(groups) - 1,
                               max_size=len(groups) - 1)))
    bounds = [0, *cuts, num_layers]
    return plan_of(*(((bounds[k], bounds[k + 1] - 1), group) for k, group in enumerate(groups)))


# --------------------------------------------------------------------------- brute force


def brute_resume(holdings: list[Holding], num_layers: int, at_most: int | None) -> int | None:
    top = max((h.applied for h in holdings), default=-1)
    if at_most is not None:
        top = min(top, at_most)
    for v in range(top, -1, -1):
        if all(any(h.has(layer, v) for h in holdings) for layer in range(num_layers)):
            return v
    return None


def brute_choice(device: str, layer: int, holdings: list[Holding], v: int) -> tuple[str, str]:
    """The best copy by one sort key: own memory first, then own < replica < central, then the
    holder's id."""
    ranks = {"own": 0, "replica": 1, "central": 2}
    best = min((h for h in holdings if h.has(layer, v)),
               key=lambda h: (h.device != device, ranks[h.kind], h.device))
    return (SELF if best.device == device else best.device), best.kind


# --------------------------------------------------------------------------- resume point


@given(holdings_st(), st.one_of(st.none(), st.integers(-1, 5)))
def test_resume_point_is_the_newest_complete_applied(holdings: list[Holding],
                                                     at_most: int | None) -> None:
    assert (resume_point(holdings, num_layers=N, at_most=at_most)
            == brute_resume(holdings, N, at_most))


def test_resume_point_needs_every_layer_at_one_applied() -> None:
    # layers 0..3 at 6, 4..7 at 5: no single applied has both; 4 has both (one via the server)
    holdings = [own("a", 0, 3, 6), own("b", 4, 7, 5), replica("b", 0, 3, 4), central(4, 7, 4)]
    assert resume_point(holdings, num_layers=N) == 4
    assert resume_point(holdings, num_layers=N, at_most=3) is None
    assert resume_point([*holdings, own("a", 4, 7, 6)], num_layers=N) == 6
    assert resume_point([*holdings, own("a", 4, 7, 6)], num_layers=N, at_most=5) == 4
    assert resume_point([], num_layers=N) is None


def test_resume_point_rejects_a_holding_past_the_last_layer() -> None:
    with pytest.raises(RecoveryError, match=r"'a': layers: \[0, 8\] go past the last layer"):
        resume_point([own("a", 0, 8, 1)], num_layers=N)


# --------------------------------------------------------------------------- restore plan


@given(st.one_of(holdings_st(), covering_st()), plans_st(),
       st.one_of(st.none(), st.integers(0, 4)))
def test_restore_plan_obeys_the_preference_order(holdings: list[Holding], new: Plan,
                                                 at_most: int | None) -> None:
    v = brute_resume(holdings, N, at_most)
    if v is None:
        with pytest.raises(RecoveryError, match=r"layer \d+ has"):
            restore_plan(new, holdings, PROFILE, at_most=at_most)
        return
    plan = restore_plan(new, holdings, PROFILE, at_most=at_most)
    assert plan.resume == v
    got = per_layer(plan)
    wanted = {(d, layer) for s in new.stages for d in s.devices
              for layer in range(s.first, s.last + 1)}
    assert set(got) == wanted  # every device gets its layers, exactly once (per_layer checks)
    for (device, layer), part in got.items():
        assert part.applied == v
        assert (part.source, part.kind) == brute_choice(device, layer, holdings, v)
        holder = device if part.source == SELF else part.source
        assert any(h.device == holder and h.kind == part.kind and h.has(layer, v)
                   for h in holdings)
    for part in plan.parts:
        a, e = part.layers
        assert part.bytes == sum(100 * (i + 1) for i in range(a, e + 1))
    # parts are maximal: neighbours of one device differ in (source, kind) or are not adjacent
    for first, second in pairwise(plan.parts):
        if first.device == second.device and first.layers[1] + 1 == second.layers[0]:
            assert (first.source, first.kind) != (second.source, second.kind)
    moving = [p for p in plan.parts if p.source != SELF]
    assert plan.transfers == len(moving)
    assert plan.bytes_moved == sum(p.bytes for p in moving)
    # parts come device by device, in the plan's order
    assert sum((plan.parts_of(d) for d in new.device_ids), ()) == plan.parts


def test_restore_plan_example() -> None:
    # a: own 0..2 at 10 (and 0..2 at 12, newer than anything else); b: own 3..5 at 10 and a
    # replica of 0..2; the server: everything at 10 and a stale 6..7 at 8
    holdings = [own("a", 0, 2, 10), own("a", 0, 2, 12), own("b", 3, 5, 10),
                replica("b", 0, 2, 10), central(0, 7, 10), central(6, 7, 8)]
    new = plan_of(((0, 3), ("a",)), ((4, 7), ("b", "c")))
    plan = restore_plan(new, holdings, PROFILE)
    assert plan.resume == 10
    assert [(p.device, p.layers, p.source, p.kind, p.bytes) for p in plan.parts] == [
        ("a", (0, 2), SELF, "own", 600),
        ("a", (3, 3), "b", "own", 400),
        ("b", (4, 5), SELF, "own", 1100),
        ("b", (6, 7), CENTRAL, "central", 1500),
        ("c", (4, 5), "b", "own", 1100),
        ("c", (6, 7), CENTRAL, "central", 1500),
    ]
    assert plan.transfers == 4
    assert plan.bytes_moved == 400 + 1500 + 1100 + 1500
    assert [p.layers for p in plan.parts_of("c")] == [(4, 5), (6, 7)]
    assert plan.to_json()["parts"][1] == {"device": "a", "layers": [3, 3], "applied": 10,
                                          "source": "b", "kind": "own", "bytes": 400}
    assert plan.to_json()["bytes_moved"] == plan.bytes_moved
    assert plan.to_json()["transfers"] == 4
    assert plan.to_json()["resume"] == 10


def test_momentum_buffers_move_with_their_weights() -> None:
    # under SGD with momentum every parameter's buffer travels beside it: twice the bytes, the
    # same sources, in the restore plan and in Algorithm 1 alike
    holdings = [own("a", 0, 3, 10), own("b", 4, 7, 10), central(0, 7, 10)]
    new = plan_of(((0, 5), ("a",)), ((6, 7), ("c",)))
    plain = restore_plan(new, holdings, PROFILE)
    doubled = restore_plan(new, holdings, PROFILE, momentum=True)
    assert [(p.device, p.layers, p.source) for p in doubled.parts] == [
        (p.device, p.layers, p.source) for p in plain.parts]
    assert [p.bytes for p in doubled.parts] == [2 * p.bytes for p in plain.parts]
    assert doubled.bytes_moved == 2 * plain.bytes_moved > 0
    old = plan_of(((0, 3), ("a",)), ((4, 7), ("b",)))
    moved = redistribute_weights(old=old, new=new, failed=(), profile=PROFILE)
    with_momentum = redistribute_weights(old=old, new=new, failed=(), profile=PROFILE,
                                         momentum=True)
    assert [t.bytes for t in with_momentum.fetch] == [2 * t.bytes for t in moved.fetch]
    assert with_momentum.bytes_moved == 2 * moved.bytes_moved == 2 * (500 + 600 + 700 + 800)


def test_own_replica_beats_a_peer_and_ties_go_to_the_first_id() -> None:
    holdings = [own("c", 0, 7, 3), own("b", 0, 7, 3), replica("a", 2, 3, 3),
                replica("d", 4, 4, 3), replica("e", 4, 5, 3)]
    plan = restore_plan(plan_of(((0, 7), ("a",))), holdings, PROFILE)
    assert [(p.layers, p.source, p.kind) for p in plan.parts] == [
        ((0, 1), "b", "own"), ((2, 3), SELF, "replica"), ((4, 7), "b", "own")]
    only_replicas = [replica("e", 0, 7, 3), replica("d", 0, 7, 3), central(0, 7, 3)]
    plan = restore_plan(plan_of(((0, 7), ("a",))), only_replicas, PROFILE)
    assert [(p.layers, p.source, p.kind) for p in plan.parts] == [((0, 7), "d", "replica")]


def test_a_layer_without_a_copy_is_named() -> None:
    holdings = [own("a", 0, 2, 5), own("b", 4, 7, 5)]
    new = plan_of(((0, 7), ("a",)))
    with pytest.raises(RecoveryError, match="layer 3 has no copy anywhere"):
        restore_plan(new, holdings, PROFILE)
    with pytest.raises(RecoveryError, match=r"layer 0 has no copy anywhere at applied <= 4"):
        restore_plan(new, holdings, PROFILE, at_most=4)
    split = [own("a", 0, 3, 5), own("b", 4, 7, 6)]
    with pytest.raises(RecoveryError, match=r"at the newest, 6, layer 0 has none"):
        restore_plan(new, split, PROFILE)
    assert issubclass(RecoveryError, PlanningError)


def test_restore_plan_rejects_a_plan_that_does_not_fit_the_model() -> None:
    holdings = [central(0, 7, 1)]
    with pytest.raises(RecoveryError, match=r"leave layers 6..7 unassigned"):
        restore_plan(plan_of(((0, 5), ("a",))), holdings, PROFILE)
    with pytest.raises(RecoveryError, match="already serves stage 0"):
        restore_plan(plan_of(((0, 3), ("a",)), ((4, 7), ("a",))), holdings, PROFILE)
    with pytest.raises(RecoveryError, match="names device 'central'"):
        restore_plan(plan_of(((0, 7), (CENTRAL,))), holdings, PROFILE)


# --------------------------------------------------------------------------- Algorithm 1


def ranges(layers: set[int]) -> list[tuple[int, int]]:
    out = []
    for _, run in groupby(enumerate(sorted(layers)), key=lambda x: x[1] - x[0]):
        values = [v for _, v in run]
        out.append((values[0], values[-1]))
    return out


def versioned(old: Plan, failed: set[str], applied: int) -> list[Holding]:
    """What the survivors of ``old`` and the server hold when everything is at ``applied``."""
    live, rep = old_holdings(old)
    out = [central(0, N - 1, applied)]
    for kind, held in (("own", live), ("replica", rep)):
        for device, layers in held.items():
            if device not in failed:
                out += [Holding(device=device, layers=r, applied=applied, kind=kind)
                        for r in ranges(layers)]
    return out


@st.composite
def recoveries_st(draw: st.DrawFn) -> tuple[Plan, set[str], Plan]:
    old = draw(plans_st(devices=POOL[:4]))
    failed = set(draw(st.sets(st.sampled_from(old.device_ids), max_size=len(old.device_ids))))
    survivors = tuple(d for d in POOL if d not in failed)  # "e" joins fresh
    return old, failed, draw(plans_st(devices=survivors))


@given(recoveries_st(), st.integers(0, 50))
def test_agrees_with_redistribute_weights(case: tuple[Plan, set[str], Plan],
                                          applied: int) -> None:
    """At one applied, with a complete central copy, restore_plan is Algorithm 1, except that a
    device's own replica beats a peer's live weights (the same weights at V, and free)."""
    old, failed, new = case
    assert CENTRAL == REDISTRIBUTION_CENTRAL
    plan = restore_plan(new, versioned(old, failed, applied), PROFILE)
    assert plan.resume == applied
    alg1 = redistribute_weights(old=old, new=new, failed=failed, profile=PROFILE)
    _, rep = old_holdings(old)
    fetched = {(t.device, layer): (t.source, t.replica) for t in alg1.fetch
               for layer in range(t.layers[0], t.layers[1] + 1)}
    differs: set[str] = set()
    for (device, layer), part in per_layer(plan).items():
        kept = any(a <= layer <= e for a, e in alg1.keep.get(device, ()))
        if part.source == SELF:
            if not kept:  # the one difference: own replica instead of a peer's live weights
                assert part.kind == "replica" and layer in rep[device]
                assert fetched[device, layer][1] is False
                differs.add(device)
        else:
            assert not kept
            assert fetched[device, layer] == (part.source, part.kind != "own")
    for device in set(new.device_ids) - differs:  # and the same ranges, part for part
        selfs = {layer for p in plan.parts_of(device) if p.source == SELF
                 for layer in range(p.layers[0], p.layers[1] + 1)}
        assert tuple(ranges(selfs)) == alg1.keep[device]
        assert [(p.layers, p.source, p.kind != "own", p.bytes)
                for p in plan.parts_of(device) if p.source != SELF] == [
            (t.layers, t.source, t.replica, t.bytes) for t in alg1.fetch if t.device == device]


OLD = plan_of(((0, 1), ("a",)), ((2, 3), ("b",)), ((4, 5), ("c",)), ((6, 7), ("d",)))


def test_the_documented_difference_from_algorithm_1() -> None:
    # Algorithm 1 fetches layer 1 from a's live weights rather than b's possibly stale replica;
    # at one applied they are the same weights, so b loads its own
    new = plan_of(((0, 0), ("a",)), ((1, 7), ("b",)))
    alg1 = redistribute_weights(old=OLD, new=new, failed=set(), profile=PROFILE)
    assert ("b", (1, 1), "a", False) in {(t.device, t.layers, t.source, t.replica)
                                         for t in alg1.fetch}
    plan = restore_plan(new, versioned(OLD, set(), 7), PROFILE)
    assert [(p.layers, p.source, p.kind) for p in plan.parts_of("b")] == [
        ((1, 1), SELF, "replica"), ((2, 3), SELF, "own"), ((4, 5), "c", "own"),
        ((6, 7), "d", "own")]


def test_a_middle_failure_matches_algorithm_1() -> None:
    new = plan_of(((0, 2), ("a",)), ((3, 5), ("b",)), ((6, 7), ("d",)))
    plan = restore_plan(new, versioned(OLD, {"c"}, 4), PROFILE)
    assert {(p.device, p.layers, p.source, p.kind) for p in plan.parts if p.source != SELF} == {
        ("a", (2, 2), "b", "own"), ("b", (4, 5), "d", "replica")}
    assert plan.bytes_moved == 300 + 500 + 600


# --------------------------------------------------------------------------- holdings JSON


def test_holding_round_trips_through_json() -> None:
    h = replica("a", 2, 5, 40)
    assert h.to_json() == {"layers": [2, 5], "applied": 40, "kind": "replica"}
    assert Holding.from_json(h.to_json(), device="a") == h
    assert Holding.from_json({"layers": [0, 7], "applied": 3, "kind": "central"},
                             device=CENTRAL) == central(0, 7, 3)


@pytest.mark.parametrize(("raw", "message"), [
    ([], "holding of 'a': must be a JSON object"),
    ({"layers": [0, 1], "applied": 1}, "holding of 'a': kind: is missing"),
    ({"layers": [0, 1], "applied": 1, "kind": "own", "x": 1}, "x: is not a known field"),
    ({"layers": [0], "applied": 1, "kind": "own"}, r"layers: must be \[first, last\]"),
    ({"layers": "0-1", "applied": 1, "kind": "own"}, "layers: must be a JSON array"),
    ({"layers": [0, "1"], "applied": 1, "kind": "own"}, r"layers\[1\]: must be an integer"),
    ({"layers": [-1, 1], "applied": 1, "kind": "own"}, r"layers\[0\]: must be at least 0"),
    ({"layers": [3, 1], "applied": 1, "kind": "own"}, "layers: ends before it starts"),
    ({"layers": [0, 1], "applied": -2, "kind": "own"}, "applied: must be at least 0"),
    ({"layers": [0, 1], "applied": True, "kind": "own"}, "applied: must be an integer"),
    ({"layers": [0, 1], "applied": 1.5, "kind": "own"}, "applied: must be an integer"),
    ({"layers": [0, 1], "applied": 1, "kind": "live"}, "kind: must be one of own, replica"),
    ({"layers": [0, 1], "applied": 1, "kind": "central"}, "kind: 'central' is the kind of"),
])
def test_holding_from_json_names_the_bad_field(raw: object, message: str) -> None:
    with pytest.raises(RecoveryError, match=message):
        Holding.from_json(raw, device="a")


def test_holding_constructor_validates_too() -> None:
    with pytest.raises(RecoveryError, match="server's store holds kind 'central' only"):
        Holding(device=CENTRAL, layers=(0, 1), applied=0, kind="own")
    with pytest.raises(RecoveryError, match="layers: must be"):
        Holding(device="a", layers=(2, 1), applied=0, kind="own")
    with pytest.raises(RecoveryError, match="applied: must be an integer >= 0"):
        Holding(device="a", layers=(0, 1), applied=-1, kind="own")
    with pytest.raises(RecoveryError, match="device: must be a non-empty string"):
        Holding(device="", layers=(0, 1), applied=0, kind="own")


# --------------------------------------------------------------------------- re-partition


GOOD = {"measured_period_s": 2.0, "new_period_s": 1.5, "remaining_microbatches": 100,
        "bytes_to_move": 4_000_000, "bandwidth_bps": 1_000_000.0, "restart_s": 3.0,
        "redo_microbatches": 6}


def test_repartition_decision_arithmetic() -> None:
    d = repartition_decision(**GOOD)  # type: ignore[arg-type]
    assert d.saved_s == pytest.approx(0.5 * 100)
    assert d.cost_s == pytest.approx(4.0 + 3.0 + 6 * 1.5)
    assert d.move
    assert d.to_json() == {"saved_s": d.saved_s, "cost_s": d.cost_s, "move": True}
    slower = repartition_decision(**{**GOOD, "new_period_s": 2.5})  # type: ignore[arg-type]
    assert slower.saved_s == pytest.approx(-50.0) and not slower.move
    assert not Decision(saved_s=7.0, cost_s=7.0).move  # break-even does not move
    assert repartition_decision(**{**GOOD, "remaining_microbatches": 0}).saved_s == 0  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "value"), [
    ("measured_period_s", -1.0), ("measured_period_s", math.nan), ("new_period_s", math.inf),
    ("new_period_s", "1"), ("remaining_microbatches", -1), ("remaining_microbatches", 2.0),
    ("bytes_to_move", -5), ("bytes_to_move", True), ("bandwidth_bps", 0.0),
    ("bandwidth_bps", -1.0), ("bandwidth_bps", math.nan), ("restart_s", -0.5),
    ("restart_s", math.inf), ("redo_microbatches", -1),
])
def test_repartition_decision_names_a_bad_argument(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{name} must"):
        repartition_decision(**{**GOOD, name: value})  # type: ignore[arg-type]


def test_the_respipe_baseline_hands_a_failed_stage_to_its_successor() -> None:
    from orchestrator.cost import build_cost_model
    from orchestrator.formats import Device, DeviceSet
    from orchestrator.recovery import successor_takes_over

    profile = _profile_for_respipe()
    ids = ("a", "b", "c", "d")
    devices = DeviceSet(devices=tuple(Device(id=i, speed=1.0, memory_bytes=2**34,
                                             bandwidth_bps=1e9) for i in ids))
    old = Plan(algorithm="x", schedule="1f1b", microbatches=4, stages=(
        Stage((0, 1), ("a",)), Stage((2, 3), ("b",)), Stage((4, 5), ("c",)),
        Stage((6, 7), ("d",))))

    def cut(failed: set[str]) -> list[tuple[tuple[int, int], tuple[str, ...]]]:
        keep = DeviceSet(devices=tuple(d for d in devices.devices if d.id not in failed))
        plan = successor_takes_over(build_cost_model(profile, keep), old, failed)
        assert plan.predicted is not None and plan.algorithm == "respipe"
        return [(s.layers, s.devices) for s in plan.stages]

    assert cut({"b"}) == [((0, 1), ("a",)), ((2, 5), ("c",)), ((6, 7), ("d",))]
    assert cut({"d"}) == [((0, 1), ("a",)), ((2, 3), ("b",)), ((4, 7), ("c",))]
    assert cut({"b", "c"}) == [((0, 1), ("a",)), ((2, 7), ("d",))]
    assert cut({"a"}) == [((0, 3), ("b",)), ((4, 5), ("c",)), ((6, 7), ("d",))]
    with pytest.raises(RecoveryError, match="every device"):
        successor_takes_over(build_cost_model(profile, devices), old, set(ids))


def _profile_for_respipe() -> ModelProfile:
    from orchestrator.formats import Layer

    return ModelProfile(model="m", batch_size=1, reference="r", layers=tuple(
        Layer(name=f"l{i}", kind="dense", forward_s=0.01, backward_s=0.02,
                     output_bytes=1000, param_bytes=4000, activation_bytes=1000)
        for i in range(8)))


def test_a_failure_that_took_replicas_only_shrinks_groups() -> None:
    plan = Plan(algorithm="pipedream", schedule="1f1b", microbatches=4,
                stages=(Stage((0, 1), ("a",)), Stage((2, 3), ("b", "c"))))
    assert group_shrinks(plan, {"c"})  # b keeps the second stage
    assert not group_shrinks(plan, {"a"})  # the first stage has no device left
    assert not group_shrinks(plan, {"b", "c"})
    assert not group_shrinks(plan, {"z"})  # nothing of the plan was lost


def test_with_the_seed_a_layer_without_a_copy_restarts_training_from_it() -> None:
    # a device lost before its layers' first replica left them with no copy, and the run
    # failed; the run's seed is a copy of every layer at applied 0
    holdings = [own("a", 0, 2, 5), own("b", 4, 7, 5)]
    plan = restore_plan(plan_of(((0, 3), ("a",)), ((4, 7), ("b",))), holdings, PROFILE,
                        seed=True)
    assert plan.resume == 0 and plan.parts == () and plan.bytes_moved == 0
    assert plan.from_seed == "layer 3 has no copy anywhere"
    assert plan.to_json()["from_seed"] == plan.from_seed
    # copies at one applied for every layer: they are used, the seed is not
    covered = restore_plan(plan_of(((0, 7), ("a",))), [*holdings, replica("b", 3, 3, 5)],
                           PROFILE, seed=True)
    assert covered.resume == 5 and covered.from_seed == "" and covered.parts
    assert "from_seed" not in covered.to_json()


def test_unprotected_stages_against_a_direct_reading_of_the_rules() -> None:
    from itertools import product

    from orchestrator.planformat import Stage
    from orchestrator.recovery import unprotected_stages

    layouts = [
        [Stage((0, 3), ("a",))],
        [Stage((0, 1), ("a",)), Stage((2, 3), ("b",))],
        [Stage((0, 1), ("a", "b")), Stage((2, 3), ("c",))],
        [Stage((0, 0), ("a",)), Stage((1, 2), ("b",)), Stage((3, 3), ("c",))],
    ]
    for stages, chain, global_ in product(layouts, (0, 2), (0, 10)):
        got = unprotected_stages(stages, chain_every=chain, global_every=global_)
        want = []
        for k, stage in enumerate(stages):
            copies = set(stage.devices)  # who holds the stage's layers after a loss of one
            if global_:
                copies.add("server")
            if chain:
                copies.add(stages[(k + 1) % len(stages)].devices[0])
            if len(copies) < 2:
                want.append({"layers": [stage.first, stage.last],
                             "only_on": list(stage.devices)})
        assert got == want, (stages, chain, global_)
