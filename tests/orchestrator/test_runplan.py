"""Runs of several pipelines over shared devices, with aggregation groups: the run plan's
checks and JSON, and the simulator running every pipeline together."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.cost import build_cost_model, evaluate_plan, stage_figures
from orchestrator.errors import FormatError
from orchestrator.events import TimelineEvent
from orchestrator.formats import DeviceSet
from orchestrator.planformat import Plan, Stage
from orchestrator.runplan import AggregationGroup, RunPlan, parse_run_plan, single
from orchestrator.schedule import Action
from orchestrator.simulator import simulate, simulate_run
from tests.orchestrator.instances import make_device, make_profile


def pipelearn_like(devices: int = 2, *, every: int = 4, schedule: str = "1f1b"
                   ) -> tuple[RunPlan, object]:
    """One two-stage pipeline per device (layers 0-1 on it, 2-3 on the server), the device
    stages averaged every ``every`` micro-batches, the server's copies too."""
    profile = make_profile([(0.1, 0.2), (0.1, 0.2), (0.2, 0.4), (0.2, 0.4)],
                           output_bytes=[1000] * 4, param_bytes=[4000] * 4)
    names = [f"d{i}" for i in range(devices)]
    cm = build_cost_model(profile, DeviceSet(devices=(
        *(make_device(n, 1.0, bandwidth_bps=1e6) for n in names),
        make_device("server", 4.0, bandwidth_bps=1e6))))
    pipelines = tuple(Plan(algorithm="manual", schedule=schedule, microbatches=4,
                           stages=(Stage((0, 1), (n,)), Stage((2, 3), ("server",))))
                      for n in names)
    groups = () if devices == 1 else (
        AggregationGroup(members=tuple((p, 0) for p in range(devices)),
                         every=(every,) * devices),
        AggregationGroup(members=tuple((p, 1) for p in range(devices)),
                         every=(every,) * devices,
                         weights=tuple(float(p + 1) for p in range(devices))))
    return RunPlan(pipelines=pipelines, microbatches=(12,) * devices, groups=groups), cm


def assert_every_pass_once(events: Sequence[TimelineEvent], *, pipelines: int, stages: int,
                           microbatches: int) -> None:
    """Every stage of every pipeline forwarded and backwarded each micro-batch once."""
    for p in range(pipelines):
        for k in range(stages):
            for kind in ("forward", "backward"):
                done = Counter(e.microbatch for e in events
                               if (e.pipeline, e.stage, e.kind) == (p, k, kind))
                assert sorted(done) == list(range(microbatches)), (p, k, kind)
                assert set(done.values()) == {1}, (p, k, kind)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pipelines_sharing_the_server_train_every_micro_batch_and_average_each_round(
        schedule: str) -> None:
    run, cm = pipelearn_like(2, schedule=schedule)
    sim = simulate_run(cm, run)
    assert_every_pass_once(sim.events, pipelines=2, stages=2, microbatches=12)
    # the server computes one pass at a time, whichever pipeline it is for
    passes = sorted((e.start, e.end) for e in sim.events
                    if e.device == "server" and e.kind in ("forward", "backward"))
    assert all(b[0] >= a[1] - 1e-12 for a, b in itertools.pairwise(passes))
    assert {e.pipeline for e in sim.events if e.device == "server"} == {0, 1}
    # each group averages at the end of every round of 4 micro-batches, all its members at
    # once, after each member's update that ends the round
    for k in (0, 1):
        rounds = sorted({(e.microbatch, e.start, e.end) for e in sim.events
                         if e.kind == "aggregate" and e.stage == k})
        assert [r[0] for r in rounds] == [3, 7, 11]
        for m, start, _ in rounds:
            updates = [e.end for e in sim.events
                       if e.kind == "backward" and e.stage == k and e.microbatch <= m]
            assert start >= max(updates) - 1e-12
    # the lists carry their pipeline
    lists = [sim.schedules[p].actions["server"] for p in range(2)]
    assert {a.pipeline for a in lists[1]} == {1} and Action(1, "G", 3, 1) in lists[1]


def test_one_pipeline_simulates_as_a_plan_does() -> None:
    run, cm = pipelearn_like(1)
    one = run.pipelines[0]
    alone = simulate(cm, one, microbatches=12)
    together = simulate_run(cm, single(one, 12))
    assert together.events == alone.events and together.makespan_s == alone.makespan_s
    assert together.throughput_sps == (alone.throughput_sps,)


def test_run_plans_are_checked_and_round_trip() -> None:
    run, cm = pipelearn_like(3)
    assert parse_run_plan(run.to_json(), profile=cm.profile, devices=cm.devices) == run
    assert run.rounds(2) == {0: 4, 1: 4} and run.device_ids == ("d0", "server", "d1", "d2")
    doc = run.to_json()
    for change, reason in [
            ({"microbatches": [12, 12]}, "a positive count for each pipeline"),
            ({"groups": [{"members": [[0, 0]], "every": [2]}]}, "two members or more"),
            ({"groups": [{"members": [[0, 0], [5, 0]], "every": [2, 2]}]},
             r"\(5, 0\) is no stage"),
            ({"groups": [{"members": [[0, 0], [1, 1]], "every": [2, 2]}]}, "different layers"),
            ({"groups": [{"members": [[0, 0], [1, 0]], "every": [2, 2], "weights": [1]}]},
             "one positive weight per member"),
            ({"groups": [{"members": [[0, 0], [1, 0]], "every": [2]}]},
             "a positive round length per member"),
            ({"groups": [{"members": [[0, 0], [1, 0]], "every": [2, 3]}]},
             r"make \[4, 6\] rounds"),
            ({"groups": [{"members": [[0, 0], [1, 0]], "every": [2, 2]},
                         {"members": [[0, 0], [2, 0]], "every": [2, 2]}]}, "in two groups")]:
        with pytest.raises(FormatError, match=reason):
            parse_run_plan({**doc, **change}, profile=cm.profile, devices=cm.devices)


@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4),
       st.sampled_from(["1f1b", "gpipe"]))
def test_any_number_of_pipelines_sharing_a_device_runs_to_the_end(
        devices: int, microbatches: int, every: int, schedule: str) -> None:
    # pipelines of different lengths (shards of different sizes): rounds of their own
    # lengths, as many in each; under GPipe whole batches of 4
    run, cm = pipelearn_like(devices, schedule=schedule)
    unit = 4 if schedule == "gpipe" else every
    counts = tuple(unit * (p + 1) * microbatches for p in range(devices))
    lengths = tuple(unit * (p + 1) for p in range(devices))
    groups = tuple(AggregationGroup(members=g.members, every=lengths, weights=g.weights)
                   for g in run.groups)
    run = RunPlan(pipelines=run.pipelines, microbatches=counts, groups=groups)
    sim = simulate_run(cm, run)
    for p in range(devices):
        done = [e.microbatch for e in sim.events if e.pipeline == p and e.kind == "backward"
                and e.stage == 0]
        assert sorted(done) == list(range(counts[p]))


def split_like(clients: int, *, microbatches: int = 4) -> tuple[RunPlan, object]:
    """One U-shaped pipeline per client (layer 0 and layer 3 on it, layers 1-2 on a helper 4x
    faster), one micro-batch a batch."""
    profile = make_profile([(0.1, 0.2), (0.1, 0.2), (0.2, 0.4), (0.2, 0.4)],
                           output_bytes=[1000] * 4, param_bytes=[4000] * 4)
    names = [f"c{j}" for j in range(clients)]
    cm = build_cost_model(profile, DeviceSet(devices=(
        *(make_device(n, 1.0, bandwidth_bps=1e6) for n in names),
        make_device("helper", 4.0, bandwidth_bps=1e6))))
    pipelines = tuple(Plan(algorithm="manual", schedule="gpipe", microbatches=1,
                           stages=(Stage((0, 0), (n,)), Stage((1, 2), ("helper",)),
                                   Stage((3, 3), (n,))))
                      for n in names)
    return RunPlan(pipelines=pipelines, microbatches=(microbatches,) * clients), cm


def test_a_u_shaped_pipeline_simulates_its_clients_two_stages_one_pass_at_a_time() -> None:
    # the simulator ran a device's list in order: a client's part-1 backward waited, ahead of
    # its part-3 forward in the one list, for a gradient that needed that forward (deadlock)
    run, cm = split_like(1, microbatches=1)
    sim = simulate_run(cm, run)
    # part-1, the cut's transfer, part-2 on the helper (4x), back, part-3 and its backward,
    # back, part-2's backward, back, part-1's backward: 1 ms a transfer
    expected = 0.1 + 0.001 + 0.075 + 0.001 + 0.2 + 0.4 + 0.001 + 0.15 + 0.001 + 0.2
    assert sim.makespan_s == pytest.approx(expected)
    run, cm = split_like(3)
    sim = simulate_run(cm, run)
    assert_every_pass_once(sim.events, pipelines=3, stages=3, microbatches=4)
    for device in ("c0", "helper"):  # a client's two stages, the helper's three
        passes = sorted((e.start, e.end) for e in sim.events
                        if e.device == device and e.kind in ("forward", "backward"))
        assert all(b[0] >= a[1] - 1e-12 for a, b in itertools.pairwise(passes))
    assert {e.stage for e in sim.events if e.device == "c1"} >= {0, 2}


def test_the_cost_model_counts_a_u_shaped_clients_two_stages_together() -> None:
    # it kept the memory of the client's last stage only (a device's need was overwritten
    # stage by stage) and took the larger of its two stages' times as if they ran at once
    run, cm = split_like(1)
    plan = run.pipelines[0]
    prediction = evaluate_plan(cm, plan)
    parts = [cm.memory_need_bytes(a, e, k, 3) for k, (a, e) in
             enumerate(s.layers for s in plan.stages)]
    assert prediction.memory_need_bytes["c0"] == math.ceil(parts[0]) + math.ceil(parts[2])
    assert prediction.memory_need_bytes["helper"] == math.ceil(parts[1])
    client = sum(stage_figures(cm, plan.stages[k]).compute_s for k in (0, 2))
    assert prediction.period_s == pytest.approx(client)  # 0.1 + 0.2 + 0.2 + 0.4
    assert prediction.bottleneck == "device c0 compute (stages 0 and 2)"
    tight = build_cost_model(cm.profile, DeviceSet(devices=(
        make_device("c0", 1.0, bandwidth_bps=1e6,
                    memory_bytes=max(math.ceil(parts[0]), math.ceil(parts[2])) + 1),
        make_device("helper", 4.0, bandwidth_bps=1e6))))
    assert not evaluate_plan(tight, plan).memory_ok  # either part fits alone, not both
