"""The dynamic re-partition: a device measured slower than its profile moves the cuts when the
time saved pays for the move, and is only reported (with the break-even) when it does not."""

from __future__ import annotations

import pytest

from orchestrator.events import TimelineEvent as TimelineRecord
from tests.webapp.factories import DeviceFactory, LayerProfileFactory, ModelSpecFactory, RunFactory
from webapp.devices.models import Device
from webapp.runs import recovery, services
from webapp.runs.models import FaultEvent, Generation, Run, RunDevice
from webapp.runs.selectors import run_planning_inputs

pytestmark = pytest.mark.django_db(transaction=True)  # planning runs on commit

MICROBATCHES = 4


def running_run(*, batches: int = 500, algorithm: str = "optimal",
                measured: tuple[float, float | None] | None = None, **settings: int) -> Run:
    """A run of three devices profiled alike, started with the ``algorithm``'s plan (the
    plan a re-partition compares with: three stages); every agent acked its stage.
    ``measured``: the first device's ``overhead_s`` and ``pass_overhead_s`` as an earlier
    run measured them."""
    spec = ModelSpecFactory()
    devices = [DeviceFactory(status=Device.Status.ONLINE) for _ in range(3)]
    for k, device in enumerate(devices):
        device.control_channel = f"channel-{k}"
        device.save()
        overhead, in_passes = measured if measured and k == 0 else (None, None)
        LayerProfileFactory(device=device, model_spec=spec, overhead_s=overhead,
                            pass_overhead_s=in_passes)
    run = RunFactory(model_spec=spec, devices=devices, algorithms=[algorithm],
                     microbatches=MICROBATCHES, batches=batches, **settings)
    services.run_plan(run=run)
    run.refresh_from_db()
    services.run_start(run=run)
    for device in devices:
        services.run_stage_ready(run=run, device=device)
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING and len(run.deployment["plan"]["stages"]) == 3
    return run


def train(run: Run, *, slower: dict[int, float], microbatches: int = 64,
          in_pass: dict[int, float] | None = None) -> None:
    """Store timeline events as if each stage ran at its profiled speed, the stages named in
    ``slower`` that many times slower, those in ``in_pass`` with that many seconds more in
    their passes (a fixed cost, not the layers)."""
    stages = run.deployment["plan"]["stages"]
    # the profile: layer i takes 0.03 (i + 1) s forward and backward on every device
    times = []
    for k, stage in enumerate(stages):
        device = stage["devices"][0]
        a, e = stage["layers"]
        work = sum(0.03 * (i + 1) for i in range(a, e + 1))
        times.append((device, k, work * slower.get(k, 1.0) + (in_pass or {}).get(k, 0.0)))
    period = max(t for _, _, t in times)
    records = []
    for m in range(microbatches):
        for device, k, work in times:
            start = m * period
            records += [
                TimelineRecord(run.pk, device, k, "forward", m, m, start, start + work / 3),
                TimelineRecord(run.pk, device, k, "backward", m, m, start + work / 3,
                               start + work),
                TimelineRecord(run.pk, device, k, "update", m, m, start + work,
                               start + work + 1e-4)]
    services.timeline_events_store(run=run, records=records)


def test_a_slowed_down_device_makes_the_cuts_move_when_it_pays() -> None:
    run = running_run()
    train(run, slower={1: 20.0})
    moved = recovery.run_repartition_check(run_id=run.pk, progress=64)
    assert moved is not None and moved.state == Run.State.RECOVERING
    assert moved.recovery["cause"] == "dynamic" and moved.recovery["lost"] == []
    decision = moved.recovery["decision"]
    assert decision["saved_s"] > decision["cost_s"] > 0
    started = FaultEvent.objects.get(run=run, kind="recovery_started")
    assert started.detail == {"generation": 1, "lost": []}
    # every device halts for the move (and reports what it holds)
    assert set(RunDevice.objects.filter(run=run).values_list("stage_state", flat=True)) == {
        "halting"}


def test_a_move_deploys_the_plan_its_break_even_was_judged_on() -> None:
    # the decision prices the run's own planner's plan (ftpipehd's here): once every device
    # has halted, that planner's plan is deployed, not the optimal planner's a failure uses
    run = running_run(algorithm="ftpipehd")
    train(run, slower={1: 20.0})
    moved = recovery.run_repartition_check(run_id=run.pk, progress=64)
    assert moved is not None and moved.state == Run.State.RECOVERING
    before = moved.deployment["plan"]
    for rd in RunDevice.objects.filter(run=run).select_related("device"):
        stage = next(s for s in before["stages"] if rd.device.uid in s["devices"])
        moved = recovery.run_stage_halted(
            run=moved, device=rd.device, generation=1,
            holdings=[{"layers": stage["layers"], "applied": 64, "kind": "own"}])
    generation = Generation.objects.get(run=run, number=1)
    assert generation.planner == "ftpipehd" and generation.cause == "dynamic"
    assert generation.plan["algorithm"] == "ftpipehd"
    # ftpipehd keeps every device, in order (the optimal planner dropped the slow one), and
    # moves the cuts, none of them onto the slow device
    stages = generation.plan["stages"]
    assert [s["devices"] for s in stages] == [s["devices"] for s in before["stages"]]
    assert [s["layers"] for s in stages] != [s["layers"] for s in before["stages"]]

    def width(stage: dict) -> int:
        return int(stage["layers"][1] - stage["layers"][0])

    assert width(stages[1]) <= width(before["stages"][1])


def test_a_move_that_does_not_pay_is_only_reported_with_its_break_even() -> None:
    run = running_run(batches=17)  # 68 micro-batches: 4 left after the check
    train(run, slower={1: 3.0})
    assert recovery.run_repartition_check(run_id=run.pk, progress=64) is not None
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING
    skipped = FaultEvent.objects.get(run=run, kind="repartition_skipped")
    assert skipped.detail["saved_s"] < skipped.detail["cost_s"]
    assert skipped.detail["measured_throughput_sps"] < skipped.detail["predicted_throughput_sps"]


def test_devices_as_fast_as_profiled_keep_their_plan_and_the_next_check_waits() -> None:
    run = running_run()
    assert recovery.run_repartition_check(run_id=run.pk, progress=10) is None  # not due yet
    train(run, slower={})
    assert recovery.run_repartition_check(run_id=run.pk, progress=64) is not None
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING
    assert FaultEvent.objects.get(run=run, kind="repartition_skipped").detail["saved_s"] == 0
    # the next check comes repartition_every batches later
    assert run.deployment["next_check"] == 64 + run.repartition_every * MICROBATCHES
    assert recovery.run_repartition_check(run_id=run.pk, progress=100) is None


def test_a_device_left_out_keeps_its_measured_capacity() -> None:
    # the generation after a move has no stage times of a device it left out: the capacity
    # measured before stays with it, so the next re-plan does not take it back at its profile
    run = running_run()
    slow = run.deployment["plan"]["stages"][1]["devices"][0]
    train(run, slower={1: 20.0})
    moved = recovery.run_repartition_check(run_id=run.pk, progress=64)
    assert moved is not None
    kept = moved.deployment["capacity"]
    assert kept[slow] == pytest.approx(1 / 20, rel=0.05)
    assert all(r == pytest.approx(1.0, rel=0.05) for d, r in kept.items() if d != slow)
    # as the next generation runs, on the others only, with nothing measured yet
    others = [s for s in moved.deployment["plan"]["stages"] if slow not in s["devices"]]
    moved.deployment = {"plan": {**moved.deployment["plan"], "stages": others},
                        "since_s": 1e9, "capacity": kept}
    profile, devices = run_planning_inputs(run=moved)
    planned = recovery.planning_devices(moved, profile, devices)
    before = {d.id: d for d in devices.devices}
    for device in planned.devices:
        factor = 1 / 20 if device.id == slow else 1.0
        assert device.speed == pytest.approx(before[device.id].speed * factor, rel=0.05)


def test_a_copy_of_the_run_that_is_not_due_ends_the_check_and_a_due_one_is_checked_again(
        django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    run = running_run()
    train(run, slower={})
    stale = Run.objects.get(pk=run.pk)
    stale.state = Run.State.PAUSED  # as read before a resume: not due
    with django_assert_num_queries(0):
        assert recovery.run_repartition_check(run_id=run.pk, progress=64, seen=stale) is None
    # a copy that is due goes on to the locked run, which decides
    fresh = Run.objects.get(pk=run.pk)
    assert recovery.run_repartition_check(run_id=run.pk, progress=64, seen=fresh) is not None
    fresh.refresh_from_db()
    assert fresh.deployment["next_check"] == 64 + run.repartition_every * MICROBATCHES
    assert recovery.run_repartition_check(run_id=run.pk, progress=70, seen=fresh) is None


def test_a_fixed_cost_inside_the_passes_is_not_read_as_a_slower_device() -> None:
    # a device whose passes hold 50 ms of fixed cost a micro-batch (the last stage's loss, a
    # pass's own cost), which an earlier run measured as its overhead_s: when that run also
    # said the 50 ms are inside the passes (pass_overhead_s), the events agree with the plan
    # and nothing moves; without it, the device looks slower than profiled
    predicted = []
    for in_passes in (0.05, None):
        run = running_run(measured=(0.05, in_passes))
        device = RunDevice.objects.get(run=run, position=0).device.uid
        stage = next(k for k, s in enumerate(run.deployment["plan"]["stages"])
                     if device in s["devices"])
        train(run, slower={}, in_pass={stage: 0.05})
        assert recovery.run_repartition_check(run_id=run.pk, progress=64) is not None
        run.refresh_from_db()
        if in_passes:
            assert run.state == Run.State.RUNNING
            skipped = FaultEvent.objects.get(run=run, kind="repartition_skipped")
            assert skipped.detail["saved_s"] == 0
        predicted.append(run.deployment["estimate"]["predicted_throughput_sps"])
    assert predicted[1] < 0.95 * predicted[0]
