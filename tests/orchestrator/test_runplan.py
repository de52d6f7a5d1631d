"""Runs of several pipelines over shared devices, with aggregation groups: the run plan's
checks and JSON, and the simulator running every pipeline together."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.cost import build_cost_model
from orchestrator.errors import FormatError
from orchestrator.formats import DeviceSet, Plan, Stage
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


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pipelines_sharing_the_server_train_every_micro_batch_and_average_each_round(
        schedule: str) -> None:
    run, cm = pipelearn_like(2, schedule=schedule)
    sim = simulate_run(cm, run)
    for p in range(2):
        for k in range(2):
            for kind in ("forward", "backward"):
                done = Counter(e.microbatch for e in sim.events
                               if (e.pipeline, e.stage, e.kind) == (p, k, kind))
                assert sorted(done) == list(range(12)) and set(done.values()) == {1}
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
