"""PipeLearn, SFL and FL as runs (orchestrator.pipelearn_run): one two-stage pipeline per
device under 1F1B-sync with N micro-batches of B // N (all N in flight on the device, one on
the server), its server stage on the server (FL: the
whole model on the device), FedAvg groups of each side's copies every epoch; and the stage
specs agents get (orchestrator.runspecs with per-pipeline micro-batch sizes)."""

from __future__ import annotations

import pytest

from orchestrator.pipelearn_plan import plan_method
from orchestrator.pipelearn_run import (
    pipelearn_run_plan,
    predicted_iteration_s,
    server_memory_need_bytes,
)
from orchestrator.protocol import StageSpec
from orchestrator.runspecs import run_plan_specs
from tests.orchestrator.test_pipelearn_plan import tiny

SHARED = {"run": 3, "model": "mlp", "dataset": "digits", "batch_size": 10, "lr": 0.05,
          "seed": 3}


def test_pipelearn_is_two_stages_with_n_microbatches_of_b_over_n() -> None:
    plan = plan_method(tiny("c", "d"), "pipelearn")
    run = pipelearn_run_plan(plan, batches=2, epochs=3)
    assert run.clients == ("c", "d") and run.server == "srv"
    for j, (device, pipeline) in enumerate(zip(("c", "d"), run.run_plan.pipelines,
                                               strict=True)):
        chosen = plan.device(device)
        assert [(s.layers, s.devices) for s in pipeline.stages] == [
            ((0, chosen.split - 1), (device,)), ((chosen.split, 1), ("srv",))]
        assert pipeline.schedule == "1f1b-sync" and pipeline.inflight == (10, 1)
        assert pipeline.microbatches == chosen.parallel_batches == 10
        assert run.microbatch_sizes[j] == 1  # B = 10 in 10 micro-batches
        # 2 iterations of 10 micro-batches an epoch, 3 epochs
        assert run.run_plan.microbatches[j] == 60
    # each side's copies averaged every epoch, weighted by samples
    groups = sorted((g.members, g.every, g.weights) for g in run.run_plan.groups)
    assert groups == [(((0, 0), (1, 0)), (20, 20), (20.0, 20.0)),
                      (((0, 1), (1, 1)), (20, 20), (20.0, 20.0))]
    assert predicted_iteration_s(plan) == max(d.iteration_s for d in plan.devices) > 11.0


def test_sfl_has_one_microbatch_and_fl_the_whole_model_on_the_device() -> None:
    sfl = pipelearn_run_plan(plan_method(tiny("c", "d"), "sfl"), batches=2, epochs=1)
    assert {p.microbatches for p in sfl.run_plan.pipelines} == {1}
    assert sfl.microbatch_sizes == (10, 10)
    fl = pipelearn_run_plan(plan_method(tiny("c", "d"), "fl"), batches=2, epochs=1)
    assert [[(s.layers, s.devices) for s in p.stages] for p in fl.run_plan.pipelines] == [
        [((0, 1), ("c",))], [((0, 1), ("d",))]]
    assert [g.members for g in fl.run_plan.groups] == [((0, 0), (1, 0))]
    assert server_memory_need_bytes(plan_method(tiny("c"), "fl")) == 0.0
    # the server holds each client's copy of layers [P, L): twice the one-client need
    one = server_memory_need_bytes(plan_method(tiny("c"), "sfl"))
    assert server_memory_need_bytes(plan_method(tiny("c", "d"), "sfl")) == pytest.approx(2 * one)


def test_the_stage_specs_carry_each_pipelines_microbatch_size_and_shard() -> None:
    run = pipelearn_run_plan(plan_method(tiny("c", "d"), "pipelearn"), batches=2, epochs=1)
    specs = run_plan_specs(run.run_plan, shared=SHARED, shard_split="iid",
                           batch_sizes=run.microbatch_sizes)
    assert sorted((s.device, s.pipeline, s.stage) for s in specs) == [
        ("c", 0, 0), ("d", 1, 0), ("srv", 0, 1), ("srv", 1, 1)]
    for s in specs:
        assert s.batch_size == 1 and s.flush_every == 10 and s.shard == (s.pipeline, 2)
        assert s.round_every == 20 and len(s.group) == 2 and not s.u_shaped
        assert StageSpec.from_json(s.to_json()) == s
    with pytest.raises(ValueError, match=r"^batch_sizes: needs one per pipeline"):
        run_plan_specs(run.run_plan, shared=SHARED, batch_sizes=[1])


def test_the_device_forwards_all_then_the_server_takes_each_as_it_arrives() -> None:
    # Table I: the device runs its N forwards, then its N backwards; the server runs each
    # micro-batch's forward and backward as it arrives, so gradients come down while the
    # device still forwards (under GPipe the server forwarded all N first, and on a
    # link-bound device no gradient came down before the last activation went up)
    run = pipelearn_run_plan(plan_method(tiny("c"), "pipelearn"), batches=2, epochs=1)
    specs = {s.stage: s for s in run_plan_specs(run.run_plan, shared=SHARED,
                                                batch_sizes=run.microbatch_sizes)}
    device = [str(a) for a in specs[0].build_schedule().actions["c"]]
    server = [str(a) for a in specs[1].build_schedule().actions["srv"]]
    n = run.run_plan.pipelines[0].microbatches
    assert device[:2 * n + 1] == ([f"0F{m}" for m in range(n)] + [f"0B{m}" for m in range(n)]
                                  + [f"0U{n - 1}"])
    assert server[:2 * n + 1] == ([a for m in range(n) for a in (f"1F{m}", f"1B{m}")]
                                  + [f"1U{n - 1}"])


def test_bad_counts_are_refused_naming_the_field() -> None:
    plan = plan_method(tiny("c"), "sfl")
    with pytest.raises(ValueError, match=r"^batches: must be a positive integer"):
        pipelearn_run_plan(plan, batches=0, epochs=1)
    with pytest.raises(ValueError, match=r"^epochs: must be a positive integer"):
        pipelearn_run_plan(plan, batches=1, epochs=True)


def test_one_split_point_for_every_device_the_fastest_for_the_slowest() -> None:
    from orchestrator.pipelearn import iteration_time, stage_times
    from orchestrator.pipelearn_run import common_split

    setting = tiny("c", "d")
    for method in ("pipelearn", "sfl"):
        chosen = common_split(setting, method=method)
        assert set(chosen) == {"c", "d"} and len({p for p, _ in chosen.values()}) == 1
        if method == "sfl":
            assert {n for _, n in chosen.values()} == {1}
        plan = plan_method(setting, method, overrides=chosen)
        run = pipelearn_run_plan(plan, batches=2, epochs=1)
        # every side's copies in one group each: whole models averaged
        assert sorted(len(g.members) for g in run.run_plan.groups) == [2, 2]
        # brute force: no other common P makes the slowest device faster
        p = next(iter(chosen.values()))[0]
        worst = max(iteration_time(stages=stage_times(
            cm=setting.cm, device=d, server="srv", split=p, batch_size=10,
            slowdown=setting.slowdown), parallel_batches=n) for d, (_, n) in chosen.items())
        assert worst <= max(d.iteration_s for d in plan.devices) + 1e-12
