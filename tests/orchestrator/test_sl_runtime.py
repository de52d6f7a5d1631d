"""Split learning from measurements to agents (orchestrator.sl.runtime): the study instance
built through the cost model, the run plan of U-shaped pipelines with its FedAvg groups, the
order a helper serves its clients in, and the errors, each naming its field."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.errors import PlanningError
from orchestrator.formats import DeviceSet, load_devices, load_profile
from orchestrator.planformat import Stage, check_stages
from orchestrator.runplan import parse_run_plan
from orchestrator.sl.check import check_schedule
from orchestrator.sl.formats import Instance, Schedule, Segment, parse_instance
from orchestrator.sl.runtime import (
    HelperTask,
    SplitCuts,
    cuts_per_client,
    helper_task_order,
    instance_from_measurements,
    predicted_makespan_s,
    split_run_plan,
)
from orchestrator.sl.solve import solve
from tests.conftest import DATA
from tests.orchestrator.instances import make_device, make_profile

# Four layers; cuts (0, 2): part-1 = layer 0, part-2 = layers 1-2, part-3 = layer 3.
PROFILE = make_profile([(0.1, 0.2), (0.2, 0.4), (0.3, 0.6), (0.1, 0.1)],
                       output_bytes=[1_000_000, 500_000, 200_000, 0],
                       param_bytes=[1000, 2_000_000, 3_000_000, 1000],
                       activation_bytes=[0, 1_000_000, 1_000_000, 0])
CUTS = SplitCuts(0, 2)


def tiny_devices(*, helper_memory: int = 10**9, **helper: Any) -> DeviceSet:
    """Client c0 at reference speed on a 10 MB/s link, c1 at half speed on 1 MB/s with 10 ms
    latency, helper h four times the reference on 100 MB/s."""
    return DeviceSet(devices=(
        make_device("c0", 1.0, bandwidth_bps=1e7),
        make_device("c1", 0.5, bandwidth_bps=1e6, latency_s=0.01),
        make_device("h", 4.0, bandwidth_bps=1e8, memory_bytes=helper_memory, **helper)))


def tiny(**changes: Any) -> Instance:
    kwargs: dict[str, Any] = {"profile": PROFILE, "devices": tiny_devices(),
                              "clients": ["c0", "c1"], "helpers": ["h"], "cuts": CUTS,
                              "slot_ms": 100.0, "name": "tiny"}
    kwargs.update(changes)
    return instance_from_measurements(**kwargs)


# ------------------------------------------------------------------ the study instance


def test_the_matrices_are_the_papers_steps_in_slots_computed_by_hand() -> None:
    inst = tiny()
    # c0: part-1 forward 0.1 s + cut-1 upload 1 MB / 10 MB/s = 0.2 s -> 2 slots; the helper's
    # part-2 forward (0.2 + 0.3) / 4 = 0.125 s -> 2; cut-2 download 0.02 + part-3 forward 0.1
    # -> 2; part-3 backward 0.1 + gradient upload 0.02 -> 2; part-2 backward (0.4 + 0.6) / 4 =
    # 0.25 -> 3; gradient download 0.1 + part-1 backward 0.2 = 0.3 s -> exactly 3, not 4.
    # c1 (half speed, 1 MB/s, 10 ms): r = 0.2 + 1.01 = 1.21 s -> 13; l = 0.21 + 0.2 -> 5;
    # lp = 0.2 + 0.21 -> 5; rp = 1.01 + 0.4 = 1.41 s -> 15.
    assert (inst.clients, inst.helpers, inst.slot_ms) == (2, 1, 100.0)
    assert inst.r == ((2,), (13,))
    assert inst.p == ((2,), (2,))
    assert inst.l == ((2,), (5,))
    assert inst.lp == ((2,), (5,))
    assert inst.pp == ((3,), (3,))
    assert inst.rp == ((3,), (15,))
    # part-2 as the cost model counts the middle of three stages: 2 (P + A) + 2 P with
    # P = 5 MB, A = 2 MB; the helper's 10^9 bytes
    assert inst.demand == (24.0, 24.0)
    assert inst.capacity == (1000.0,)
    assert inst.memory_unit == "MB"
    assert parse_instance(inst.to_json()) == inst


def test_per_client_cuts_change_that_clients_times_and_demand() -> None:
    inst = tiny(cuts=[CUTS, SplitCuts(1, 2)])
    # c1's part-1 is layers 0-1: (0.1 + 0.2) / 0.5 = 0.6 s + 0.5 MB / 1 MB/s + 10 ms -> 12;
    # its part-2 is layer 2 alone: 0.3 / 4 -> 1 slot; P = 3 MB, A = 1 MB -> 14 MB
    assert inst.r == ((2,), (12,))
    assert inst.p == ((2,), (1,))
    assert inst.demand == (24.0, 14.0)


def test_the_helpers_overhead_and_messages_count_as_the_cost_model_counts_them() -> None:
    inst = tiny(devices=tiny_devices(overhead_s=0.2, message_s=0.05))
    # half the overhead in each pass, and the middle stage sends a message in each
    assert inst.p == ((3,), (3,))  # 0.125 + 0.1 + 0.05 = 0.275 s
    assert inst.pp == ((4,), (4,))  # 0.25 + 0.1 + 0.05 = 0.4 s
    assert inst.r == tiny().r


def test_p_and_pp_take_a_slot_at_least_while_a_step_without_work_or_bytes_takes_none(
        ) -> None:
    idle_parts = make_profile([(0.1, 0.2), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)],
                              output_bytes=[1_000_000, 0, 0, 0])
    inst = tiny(profile=idle_parts)
    assert inst.p == inst.pp == ((1,), (1,))
    assert inst.l == inst.lp == ((0,), (1,))  # c1's link still has its 10 ms latency
    assert inst.r == ((2,), (13,)) and inst.rp == ((3,), (15,))
    coarse = tiny(slot_ms=10_000.0)
    assert coarse.r == coarse.p == coarse.l == coarse.lp == coarse.pp == coarse.rp == ((1,),
                                                                                      (1,))


@pytest.mark.parametrize("slow_bps", [1e6, 2e5, 5e4])
def test_a_slower_client_link_gives_a_larger_release_and_final_step(slow_bps: float) -> None:
    devices = DeviceSet(devices=(make_device("fast", 1.0, bandwidth_bps=1e7),
                                 make_device("slow", 1.0, bandwidth_bps=slow_bps),
                                 make_device("h", 4.0, bandwidth_bps=1e8, memory_bytes=10**9)))
    inst = tiny(devices=devices, clients=["fast", "slow"])
    assert inst.r[1][0] > inst.r[0][0]
    assert inst.rp[1][0] > inst.rp[0][0]
    assert inst.l[1][0] >= inst.l[0][0] and inst.lp[1][0] >= inst.lp[0][0]
    assert inst.p[1] == inst.p[0] and inst.pp[1] == inst.pp[0]


@given(st.lists(st.sampled_from([0.05, 0.3, 1.0, 3.0]), min_size=3, max_size=3),
       st.lists(st.sampled_from([1e5, 1e6, 1e7, 1e8]), min_size=3, max_size=3),
       st.sampled_from([10.0, 73.5, 250.0]))
def test_every_built_instance_is_a_valid_instance_document(
        speeds: list[float], bandwidths: list[float], slot_ms: float) -> None:
    devices = DeviceSet(devices=tuple(
        make_device(n, s, bandwidth_bps=b, memory_bytes=10**9)
        for n, s, b in zip(("c0", "c1", "h"), speeds, bandwidths, strict=True)))
    inst = tiny(devices=devices, slot_ms=slot_ms)
    assert parse_instance(inst.to_json()) == inst
    # part-2's forward is the helper's alone, whichever client it serves
    assert inst.p[0][0] == inst.p[1][0] == max(1, math.ceil(0.5 / speeds[2] * 1000 / slot_ms
                                                            * (1 - 1e-9)))


def _shared_testbed() -> tuple[Any, DeviceSet]:
    """The ResNet-101 testbed with a second VM, so that four clients have two helpers."""
    profile = load_profile(DATA / "profiles" / "resnet101_cifar10.model.json")
    devices = load_devices(DATA / "profiles" / "resnet101_cifar10.devices.json")
    vm = devices.device("edge-vm")
    return profile, DeviceSet(devices=(*devices.devices, dataclasses.replace(vm, id="edge-vm-2")))


@pytest.mark.parametrize("method", ["balanced-greedy", "admm", "auto"])
def test_the_shared_resnet101_testbed_gives_an_instance_the_methods_schedule(
        method: str) -> None:
    profile, devices = _shared_testbed()
    clients = ["m1-laptop", "rpi4", "jetson-cpu", "jetson-gpu"]
    # the paper's scenario-1 cuts, its layers 3 and 33 counted from 1
    inst = instance_from_measurements(profile=profile, devices=devices, clients=clients,
                                      helpers=["edge-vm", "edge-vm-2"],
                                      cuts=SplitCuts(2, 32), slot_ms=100.0, name="resnet-K4-H2")
    assert (inst.clients, inst.helpers) == (4, 2)
    assert all(row[0] == row[1] for m in (inst.r, inst.p, inst.l, inst.lp, inst.pp, inst.rp)
               for row in m)  # the two helpers are alike
    assert len(set(inst.demand)) == 1 and inst.capacity[0] > 4 * inst.demand[0]
    assert inst.r[2][0] > inst.r[0][0]  # the Jetson's CPU is far slower than the M1
    schedule = solve(instance=inst, method=method, time_limit_s=2.0)
    check_schedule(instance=inst, schedule=schedule)
    assert predicted_makespan_s(schedule=schedule, instance=inst) == pytest.approx(
        schedule.makespan * 0.1)
    tasks = [t for i in range(2) for t in helper_task_order(instance=inst, schedule=schedule,
                                                              helper=i)]
    assert sorted((t.client, t.kind) for t in tasks) == sorted(
        (j, kind) for j in range(4) for kind in ("forward", "backward"))


# ------------------------------------------------------------------ the run plan


def _schedule(assignment: tuple[int, ...]) -> Schedule:
    return Schedule(method="hand", assignment=assignment, forward=(), backward=(),
                    completion=(0,) * len(assignment), makespan=0)


def test_the_run_plan_is_one_u_shaped_pipeline_per_client_with_three_fedavg_groups() -> None:
    run = split_run_plan(schedule=_schedule((0, 1, 0)), cuts=CUTS, clients=["a", "b", "c"],
                         helpers=["h0", "h1"], num_layers=4, microbatches_per_round=[2, 1, 3],
                         rounds=3, samples=[100, 50, 150])
    assert [p.stages for p in run.pipelines] == [
        (Stage((0, 0), (c,)), Stage((1, 2), (h,)), Stage((3, 3), (c,)))
        for c, h in (("a", "h0"), ("b", "h1"), ("c", "h0"))]
    assert {(p.schedule, p.microbatches, p.algorithm) for p in run.pipelines} == {
        ("gpipe", 1, "sflwo")}
    assert run.microbatches == (6, 3, 9)
    assert run.device_ids == ("a", "h0", "b", "h1", "c")
    assert [g.members for g in run.groups] == [((0, k), (1, k), (2, k)) for k in range(3)]
    assert {g.every for g in run.groups} == {(2, 1, 3)}
    assert {g.weights for g in run.groups} == {(100.0, 50.0, 150.0)}
    # h0 holds two part-2 copies, averaged with b's on h1 each round
    assert run.rounds(0) == {0: 2, 1: 2, 2: 2}
    assert run.to_json()["groups"][1] == {"members": [[0, 1], [1, 1], [2, 1]],
                                          "every": [2, 1, 3], "weights": [100.0, 50.0, 150.0]}


def test_the_run_plan_is_a_valid_run_plan_document_of_u_shaped_plans() -> None:
    profile, devices = _shared_testbed()
    clients = ["m1-laptop", "rpi4", "jetson-cpu"]
    run = split_run_plan(schedule=_schedule((0, 1, 1)), cuts=SplitCuts(2, 32), clients=clients,
                         helpers=["edge-vm", "edge-vm-2"], num_layers=profile.num_layers,
                         microbatches_per_round=[4, 2, 1], rounds=2, samples=[4, 2, 1])
    for plan in run.pipelines:
        check_stages(plan.stages, num_layers=profile.num_layers, device_ids=devices.ids)
    assert parse_run_plan(run.to_json(), profile=profile, devices=devices) == run


def test_with_per_client_cuts_only_copies_of_the_same_layers_are_averaged() -> None:
    run = split_run_plan(schedule=_schedule((0, 0, 1)),
                         cuts=[CUTS, SplitCuts(1, 2), CUTS], clients=["a", "b", "c"],
                         helpers=["h0", "h1"], num_layers=4, microbatches_per_round=[1, 1, 1],
                         rounds=2, samples=[1, 2, 3], schedule_name="1f1b-sync")
    assert run.pipelines[1].stages[0].layers == (0, 1)
    assert [g.members for g in run.groups] == [((0, 0), (2, 0)), ((0, 1), (2, 1)),
                                               ((0, 2), (1, 2), (2, 2))]
    assert run.groups[0].weights == (1.0, 3.0)
    assert run.schedule == "1f1b-sync"


def test_one_client_trains_alone_without_groups() -> None:
    run = split_run_plan(schedule=_schedule((0,)), cuts=CUTS, clients=["a"], helpers=["h"],
                         num_layers=4, microbatches_per_round=[5], rounds=2, samples=[10])
    assert run.groups == () and run.microbatches == (10,)


# ------------------------------------------------------------------ the helper's order


def preemptive_schedule() -> tuple[Instance, Schedule]:
    """Three clients, two helpers. Helper 0 starts client 0's forward, preempts it for client
    1's (released at slot 1), resumes it; client 1's backward, then client 0's (given as two
    adjacent segments). Helper 1 serves client 2 alone."""
    inst = parse_instance({
        "name": "hand", "slot_ms": 50.0, "clients": 3, "helpers": 2,
        "r": [[0, 0], [1, 1], [0, 0]], "p": [[3, 3], [1, 1], [2, 2]],
        "l": [[1, 1]] * 3, "lp": [[1, 1]] * 3, "pp": [[2, 2], [1, 1], [1, 1]],
        "rp": [[1, 1]] * 3, "demand": [1, 1, 1], "capacity": [3, 3], "memory_unit": "MB"})
    schedule = Schedule(
        method="hand", instance="hand", assignment=(0, 0, 1),
        forward=(Segment(0, 0, 0, 1), Segment(0, 1, 1, 2), Segment(0, 0, 2, 4),
                 Segment(1, 2, 0, 2)),
        backward=(Segment(0, 0, 7, 8), Segment(0, 1, 4, 5), Segment(0, 0, 6, 7),
                  Segment(1, 2, 4, 5)),
        completion=(9, 6, 6), makespan=9)
    check_schedule(instance=inst, schedule=schedule)
    return inst, schedule


def test_a_helper_follows_its_tasks_in_the_order_it_starts_them() -> None:
    inst, schedule = preemptive_schedule()
    assert helper_task_order(instance=inst, schedule=schedule, helper=0) == (
        HelperTask(0, "forward", ((0, 1), (2, 4))),
        HelperTask(1, "forward", ((1, 2),)),
        HelperTask(1, "backward", ((4, 5),)),
        HelperTask(0, "backward", ((6, 8),)))
    order = helper_task_order(instance=inst, schedule=schedule, helper=1)
    assert [(t.client, t.kind, t.start, t.end, t.slots) for t in order] == [
        (2, "forward", 0, 2, 2), (2, "backward", 4, 5, 1)]
    assert order[0].to_json() == {"client": 2, "kind": "forward", "segments": [[0, 2]]}
    assert predicted_makespan_s(schedule=schedule, instance=inst) == pytest.approx(0.45)


def test_a_helper_without_clients_has_nothing_to_do() -> None:
    inst, schedule = preemptive_schedule()
    alone = dataclasses.replace(
        schedule, assignment=(0, 0, 0),
        forward=(*schedule.forward[:3], Segment(0, 2, 5, 6), Segment(0, 2, 8, 9)),
        backward=(*schedule.backward[:3], Segment(0, 2, 11, 12)), completion=(9, 6, 13),
        makespan=13)
    assert helper_task_order(instance=inst, schedule=alone, helper=1) == ()
    assert [t.client for t in helper_task_order(instance=inst, schedule=alone, helper=0)] == [
        0, 1, 1, 2, 0, 2]


# ------------------------------------------------------------------ errors name their field


def _raises(field: str) -> Any:
    return pytest.raises(ValueError, match="^" + re.escape(field) + ": ")


@pytest.mark.parametrize(("sigma1", "sigma2", "field"), [
    (-1, 2, "sigma1"), (2, 2, "sigma2"), (3, 1, "sigma2"), (True, 2, "sigma1"),
    (0, 2.0, "sigma2")])
def test_cuts_that_leave_a_part_empty_are_refused(sigma1: Any, sigma2: Any, field: str) -> None:
    with _raises(field):
        SplitCuts(sigma1, sigma2)


@pytest.mark.parametrize(("changes", "field"), [
    ({"clients": []}, "clients"),
    ({"helpers": []}, "helpers"),
    ({"clients": "c0"}, "clients"),
    ({"clients": ["c0", "nowhere"]}, "clients[1]"),
    ({"helpers": ["nowhere"]}, "helpers[0]"),
    ({"clients": ["c0", "c0"]}, "clients[1]"),
    ({"helpers": ["c1"]}, "helpers[0]"),
    ({"helpers": ["h", "h"]}, "helpers[1]"),
    ({"slot_ms": 0}, "slot_ms"),
    ({"slot_ms": float("nan")}, "slot_ms"),
    ({"slot_ms": True}, "slot_ms"),
    ({"name": " "}, "name"),
    ({"cuts": SplitCuts(0, 3)}, "cuts.sigma2"),
    ({"cuts": [CUTS]}, "cuts"),
    ({"cuts": [CUTS, SplitCuts(1, 3)]}, "cuts[1].sigma2"),
    ({"cuts": [CUTS, (0, 2)]}, "cuts[1]"),
    ({"devices": tiny_devices(helper_memory=10_000_000)}, "helpers[0]"),
    ({"devices": tiny_devices(helper_memory=20_000_000), "cuts": [CUTS, SplitCuts(1, 2)]},
     "clients[0]"),
    ({"profile": make_profile([(0.1, 0.1), (0.1, 0.1)])}, "num_layers"),
])
def test_every_bad_measurement_input_names_its_field(changes: dict[str, Any],
                                                     field: str) -> None:
    with _raises(field):
        tiny(**changes)


def test_the_helper_memory_error_says_what_it_has_and_what_a_client_needs() -> None:
    with pytest.raises(ValueError, match=r"'h' has 10 MB .* smallest client's part-2 \(24 MB\)"):
        tiny(devices=tiny_devices(helper_memory=10_000_000))


@pytest.mark.parametrize(("changes", "field"), [
    ({"schedule": _schedule((0, 0))}, "schedule.assignment"),
    ({"schedule": _schedule((0, 2, 0))}, "schedule.assignment[1]"),
    ({"schedule_name": "1f1b"}, "schedule_name"),
    ({"schedule_name": "pipedream"}, "schedule_name"),
    ({"rounds": 0}, "rounds"),
    ({"microbatches_per_round": [1, 1]}, "microbatches_per_round"),
    ({"microbatches_per_round": [1, 0, 1]}, "microbatches_per_round[1]"),
    ({"samples": [1, 1, -3]}, "samples[2]"),
    ({"samples": [1, 1, 1.5]}, "samples[2]"),
    ({"num_layers": 2}, "num_layers"),
    ({"num_layers": 3}, "cuts.sigma2"),
    ({"helpers": ["h0", "a"]}, "helpers[1]"),
    ({"cuts": [CUTS, CUTS]}, "cuts"),
])
def test_every_bad_run_plan_input_names_its_field(changes: dict[str, Any], field: str) -> None:
    kwargs: dict[str, Any] = {"schedule": _schedule((0, 1, 0)), "cuts": CUTS,
                              "clients": ["a", "b", "c"], "helpers": ["h0", "h1"],
                              "num_layers": 4, "microbatches_per_round": [1, 1, 1],
                              "rounds": 1, "samples": [1, 1, 1]}
    kwargs.update(changes)
    with _raises(field):
        split_run_plan(**kwargs)


def test_task_order_and_makespan_refuse_what_does_not_belong_together() -> None:
    inst, schedule = preemptive_schedule()
    for helper in (2, -1, True):
        with _raises("helper"):
            helper_task_order(instance=inst, schedule=schedule, helper=helper)
    broken = dataclasses.replace(schedule, makespan=8)
    with pytest.raises(PlanningError, match="makespan is 9"):
        helper_task_order(instance=inst, schedule=broken, helper=0)
    with _raises("schedule"):
        predicted_makespan_s(schedule=schedule, instance=dataclasses.replace(inst, name="other"))


def test_the_runs_cuts_serve_every_client_and_their_own_must_be_one_each() -> None:
    assert cuts_per_client(CUTS, clients=3, num_layers=4) == (CUTS,) * 3
    assert SplitCuts(1, 2).parts(5) == ((0, 1), (2, 2), (3, 4))
    assert SplitCuts(1, 2).to_json() == {"sigma1": 1, "sigma2": 2}
    with _raises("cuts"):
        cuts_per_client([CUTS], clients=2, num_layers=4)
