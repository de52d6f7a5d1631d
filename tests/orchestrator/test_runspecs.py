"""A split run from settings to the stage specs agents get (orchestrator.runspecs,
orchestrator.sl.settings, orchestrator.sl.turns.run_turns)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from orchestrator.cost import build_cost_model
from orchestrator.formats import DeviceSet
from orchestrator.protocol import StageSpec
from orchestrator.runspecs import run_plan_specs
from orchestrator.sl.runtime import SplitCuts, instance_from_measurements, split_run_plan
from orchestrator.sl.settings import SplitSettings
from orchestrator.sl.solve import solve
from orchestrator.sl.turns import run_turns
from tests.orchestrator.instances import make_device
from tests.orchestrator.test_sl_runtime import CUTS, PROFILE

SHARED = {"run": 7, "model": "mlp", "dataset": "digits", "batch_size": 16, "lr": 0.05,
          "seed": 7}


def devices() -> DeviceSet:
    return DeviceSet(devices=(
        make_device("c0", 1.0, bandwidth_bps=1e7), make_device("c1", 0.5, bandwidth_bps=1e6),
        make_device("c2", 0.8, bandwidth_bps=1e7), make_device("h0", 4.0, bandwidth_bps=1e8),
        make_device("h1", 3.0, bandwidth_bps=1e8)))


def planned(method: str = "balanced-greedy", *, rounds: int = 2, per_round: int = 3
            ) -> tuple[Any, ...]:
    clients, helpers = ["c0", "c1", "c2"], ["h0", "h1"]
    instance = instance_from_measurements(profile=PROFILE, devices=devices(), clients=clients,
                                          helpers=helpers, cuts=CUTS, slot_ms=50.0, name="t")
    schedule = solve(instance=instance, method=method, time_limit_s=2.0)
    run_plan = split_run_plan(schedule=schedule, cuts=CUTS, clients=clients, helpers=helpers,
                              num_layers=PROFILE.num_layers,
                              microbatches_per_round=[per_round] * 3, rounds=rounds,
                              samples=[48, 48, 48])
    turns = run_turns(cm=build_cost_model(PROFILE, devices()), instance=instance,
                      schedule=schedule, run_plan=run_plan, helpers=helpers)
    return instance, schedule, run_plan, turns


def test_every_stage_of_every_pipeline_gets_a_spec_a_client_two_and_a_helper_one_each() -> None:
    _, schedule, run_plan, turns = planned()
    specs = run_plan_specs(run_plan, shared=SHARED, turns=turns, shard_split="label-skew")
    assert len(specs) == 9
    for j, client in enumerate(["c0", "c1", "c2"]):
        mine = [s for s in specs if s.pipeline == j]
        helper = ["h0", "h1"][schedule.assignment[j]]
        assert [(s.device, s.stage, s.layers) for s in mine] == [
            (client, 0, (0, 0)), (helper, 1, (1, 2)), (client, 2, (3, 3))]
        for s in mine:
            assert s.u_shaped and s.microbatches == 6 and s.flush_every == 1
            assert s.shard == (j, 3) and s.shard_split == "label-skew"
            assert s.round_every == 3 and len(s.group) == 3 and s.group_weight == 48.0
            # the member of its group is itself, and the ring lists each pipeline once
            assert s.member in s.group and sorted(q for _, q, _ in s.group) == [0, 1, 2]
            # a helper's stages carry its turns; a client's none
            assert s.turns == (turns[helper] if s.stage == 1 else ())
            assert StageSpec.from_json(s.to_json()) == s


def test_a_helpers_turns_name_its_clients_passes_in_the_schedules_order() -> None:
    _, schedule, run_plan, turns = planned("exact")
    for i, helper in enumerate(["h0", "h1"]):
        served = {j for j, h in enumerate(schedule.assignment) if h == i}
        if not served:
            assert helper not in turns
            continue
        mine = turns[helper]
        assert {t[0] for t in mine} == served
        # each served client's forward comes before its backward, and covers part-2
        for j in served:
            kinds = [t[1] for t in mine if t[0] == j]
            assert kinds.index("backward") > kinds.index("forward")
            forward = [t for t in mine if t[0] == j and t[1] == "forward"]
            assert min(t[3] for t in forward) == 1 and max(t[4] for t in forward) == 2
            assert all(t[2] == run_plan.microbatches[j] for t in mine if t[0] == j)


@pytest.mark.parametrize(("change", "field"), [
    ({"clients": ()}, "clients"), ({"helpers": ()}, "helpers"),
    ({"helpers": ("c0",)}, "helpers[0]"), ({"slot_ms": 0}, "slot_ms"),
    ({"shard_split": "random"}, "shard_split"), ({"time_limit_s": -1}, "time_limit_s"),
    ({"switch_slots": -1}, "switch_slots")])
def test_split_settings_refuse_bad_input_naming_the_field(change: dict[str, Any],
                                                          field: str) -> None:
    kwargs: dict[str, Any] = {"clients": ("c0", "c1"), "helpers": ("h0",),
                              "cuts": SplitCuts(0, 2), **change}
    with pytest.raises(ValueError, match="^" + re.escape(field) + ":"):
        SplitSettings(**kwargs)


def test_split_settings_round_trip_and_check_the_models_layers() -> None:
    settings = SplitSettings(clients=("c0", "c1"), helpers=("h0",), cuts=SplitCuts(1, 3),
                             shard_split="label-skew", switch_slots=1)
    assert SplitSettings.from_json(settings.to_json()) == settings
    settings.check_layers(5)
    with pytest.raises(ValueError, match=r"^cuts\.sigma2: must be at most 2"):
        settings.check_layers(4)
    with pytest.raises(ValueError, match=r"^cuts\.sigma2: must be after sigma1"):
        SplitSettings.from_json({**settings.to_json(), "cuts": {"sigma1": 2, "sigma2": 2}})


# ------------------------------------------------------------------ planned and measured batches


def test_a_schedules_batch_as_timeline_events_ends_at_its_makespan() -> None:
    from orchestrator.sl.planned import batch_events

    instance, schedule, _, _ = planned("exact")
    events = batch_events(instance=instance, schedule=schedule, clients=["c0", "c1", "c2"],
                          helpers=["h0", "h1"], run=7, microbatch=3)
    slot = instance.slot_ms / 1000
    assert max(e.end for e in events) == pytest.approx(schedule.makespan * slot)
    for j in range(3):
        mine = [e for e in events if e.pipeline == j]
        helper = ["h0", "h1"][schedule.assignment[j]]
        # the client's part-1 forward first, its part-1 backward last, at its completion
        assert (mine[0].device, mine[0].stage, mine[0].kind) == (f"c{j}", 0, "forward")
        last = max(mine, key=lambda e: e.end)
        assert (last.stage, last.kind) == (0, "backward")
        assert last.end == pytest.approx(schedule.completion[j] * slot)
        # the helper's bars are the schedule's segments of this client
        on_helper = sorted((e.kind, round(e.start / slot), round(e.end / slot))
                           for e in mine if e.device == helper)
        segments = sorted((kind, s.start, s.end)
                          for kind, segs in (("forward", schedule.forward),
                                             ("backward", schedule.backward))
                          for s in segs if s.client == j)
        assert on_helper == segments
        assert {e.microbatch for e in mine} == {3} and {e.run for e in mine} == {7}
