"""Detection beyond a closed connection: stage 0's backward timer makes the server probe every
staged device; one that does not answer, or answers without its stage (it restarted), is lost
and the run recovers without it. A lost device that connects again shows on the timeline."""

from __future__ import annotations

from unittest import mock

import pytest

from tests.webapp.runs.test_dynamic_repartition import running_run
from webapp.devices.models import Device
from webapp.runs import recovery, services, tasks
from webapp.runs.models import FaultEvent, Generation, Probe, Run, RunDevice, WeightReplica
from webapp.runs.recovery.replan import candidates

pytestmark = pytest.mark.django_db(transaction=True)  # planning runs on commit


def staged(run: Run) -> list[Device]:
    return [rd.device for rd in RunDevice.objects.filter(run=run).order_by("position")]


@pytest.fixture
def verdicts(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """The probe verdicts scheduled (the tests judge by hand: tasks run eagerly here, and
    the countdown would judge before any answer)."""
    scheduled: list[int] = []
    monkeypatch.setattr(recovery.probes, "probe_verdict_schedule",
                        lambda run_id, generation: scheduled.append(run_id))
    return scheduled


def test_a_device_silent_to_a_probe_or_restarted_is_lost(verdicts: list[int]) -> None:
    run = running_run()
    first, middle, last = staged(run)
    recovery.run_suspect(run=run, device=first, generation=0)
    assert verdicts == [run.pk]
    recovery.run_probe_answered(run=run, device=first, holds=True)
    recovery.run_probe_answered(run=run, device=last, holds=False)  # restarted: stage gone
    assert recovery.probe_verdict(run.pk) == [middle.uid, last.uid]
    assert recovery.probe_verdict(run.pk) == []  # judged once
    run.refresh_from_db()
    assert run.state == Run.State.RECOVERING
    assert sorted(run.recovery["lost"]) == sorted([middle.uid, last.uid])
    lost = {f.device: f.detail for f in FaultEvent.objects.filter(run=run, kind="device_lost")}
    assert lost[middle.uid]["detected_by"] == "probe"
    assert "no answer to a probe" in lost[middle.uid]["reason"]
    assert "restarted" in lost[last.uid]["reason"]


def test_healthy_answers_change_nothing_and_a_stale_suspect_is_ignored(
        verdicts: list[int]) -> None:
    run = running_run()
    recovery.run_suspect(run=run, device=staged(run)[0], generation=7)  # not this generation
    assert not Probe.objects.filter(run=run).exists() and verdicts == []
    recovery.run_suspect(run=run, device=staged(run)[0], generation=0)
    recovery.run_suspect(run=run, device=staged(run)[1], generation=0)  # one probe at a time
    assert verdicts == [run.pk]
    for device in staged(run):
        recovery.run_probe_answered(run=run, device=device, holds=True)
    assert recovery.probe_verdict(run.pk) == []
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING
    assert not FaultEvent.objects.filter(run=run, kind="device_lost").exists()


def test_a_probe_overtaken_by_a_recovery_loses_no_survivor(verdicts: list[int]) -> None:
    # CI, two web processes: stage 0's timer fired (probe out), then the killed agent's
    # connection closed and the recovery halted the survivors; their answers to the probe,
    # after the halt, said they held no stage: both were taken for restarted and lost, and
    # the run failed ("every device of the run was lost")
    run = running_run()
    first, middle, last = staged(run)
    recovery.run_suspect(run=run, device=first, generation=0)
    recovery.run_device_lost(device=middle, reason="its connection closed",
                             detected_by="connection")
    run.refresh_from_db()
    for device in (first, last):  # halted: the stage is gone
        recovery.run_probe_answered(run=run, device=device, holds=False)
    assert recovery.probe_verdict(run.pk) == []
    run.refresh_from_db()
    assert run.state == Run.State.RECOVERING and run.recovery["lost"] == [middle.uid]
    assert not Probe.objects.filter(run=run).exists()
    assert [f.device for f in FaultEvent.objects.filter(run=run, kind="device_lost")] == [
        middle.uid]


def test_a_later_generation_s_probe_replaces_an_earlier_one_and_is_judged_alone(
        verdicts: list[int]) -> None:
    # a probe of generation 0 still waiting for its verdict kept generation 1's from going
    # out ("a probe is already out"), and its verdict would have judged generation 1's
    run = running_run()
    first, middle, last = staged(run)
    recovery.run_suspect(run=run, device=first, generation=0)
    Run.objects.filter(pk=run.pk).update(generation=1)  # a recovery ended meanwhile
    run.refresh_from_db()
    recovery.run_suspect(run=run, device=first, generation=1)
    assert verdicts == [run.pk, run.pk]
    assert Probe.objects.get(run=run).generation == 1
    recovery.run_probe_answered(run=run, device=first, holds=True)
    recovery.run_probe_answered(run=run, device=last, holds=True)
    assert recovery.probe_verdict(run.pk, 0) == []  # generation 0's verdict: nothing to judge
    assert Probe.objects.filter(run=run, generation=1).exists()
    assert recovery.probe_verdict(run.pk, 1) == [middle.uid]


def test_a_device_whose_stages_all_ended_is_not_taken_for_lost(verdicts: list[int]) -> None:
    # a split run's helper of a client counted out holds no stage any more: it answered a
    # probe without one, was taken for restarted and lost, and the run stayed recovering
    run = running_run()
    first, middle, last = staged(run)
    RunDevice.objects.filter(run=run, device=middle).update(
        stage_state=RunDevice.StageState.DONE)
    recovery.run_suspect(run=run, device=first, generation=0)
    assert sorted(Probe.objects.get(run=run).asked) == sorted([first.uid, last.uid])
    recovery.run_probe_answered(run=run, device=first, holds=True)
    recovery.run_probe_answered(run=run, device=last, holds=False)  # its stage ends meanwhile
    RunDevice.objects.filter(run=run, device=last).update(
        stage_state=RunDevice.StageState.DONE)
    assert recovery.probe_verdict(run.pk) == []
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING
    assert not FaultEvent.objects.filter(run=run, kind="device_lost").exists()


def test_a_device_lost_earlier_is_no_candidate_until_it_comes_back() -> None:
    # lost to a probe (frozen, its connection still open), a device stayed "online": the next
    # dynamic re-partition planned on it and waited for its halt until the connection dropped
    run = running_run()
    first, middle, last = staged(run)
    RunDevice.objects.filter(run=run, device=middle).update(stage_state="lost", stage=None)
    assert Device.objects.get(pk=middle.pk).status in ("online", "busy")
    assert [rd.device for rd in candidates(run)] == [first, last]
    recovery.run_device_back(device=middle)  # it connected again
    assert [rd.device for rd in candidates(run)] == [first, middle, last]


def test_a_recovery_whose_halts_never_come_fails_naming_the_silent_devices(
        verdicts: list[int], settings) -> None:  # type: ignore[no-untyped-def]
    # its survivors never acknowledged the halt (a frozen agent, or, on the embedded setup,
    # halts sent from the worker that never reached them): the run stayed recovering
    run = running_run()
    first, middle, last = staged(run)
    recovery.run_suspect(run=run, device=first, generation=0)
    recovery.run_probe_answered(run=run, device=first, holds=True)
    recovery.run_probe_answered(run=run, device=last, holds=True)
    assert recovery.probe_verdict(run.pk) == [middle.uid]
    recovery.run_stage_halted(run=run, device=first, generation=1, holdings=[])
    assert tasks.runs_fail_stalled.apply().get() == []  # not yet: the loss is recent
    run.refresh_from_db()
    Run.objects.filter(pk=run.pk).update(recovery={
        **run.recovery, "detected_wall": run.recovery["detected_wall"]
        - settings.HALT_TIMEOUT_S - 1})
    assert tasks.runs_fail_stalled.apply().get() == [run.pk]
    run.refresh_from_db()
    assert run.state == Run.State.FAILED
    assert run.error.startswith(f"{last.name!r} ({last.uid}) did not answer the recovery's "
                                "halt within 180 s of the loss")


def test_the_probe_is_shared_by_web_processes_and_judged_by_a_celery_task(
        settings) -> None:  # type: ignore[no-untyped-def]
    # the probe lived in one web process's memory with a threading.Timer: with two web
    # processes an answer reaching the other one was dropped and a healthy device was lost.
    # The answer is stored in the database; the verdict is the worker's task, scheduled with
    # the probe's countdown (recorded here: the tests' Celery runs tasks eagerly)
    run = running_run()
    first, middle, last = staged(run)
    with mock.patch("webapp.runs.tasks.probe_verdict.apply_async") as scheduled:
        recovery.run_suspect(run=run, device=first, generation=0)
    scheduled.assert_called_once_with(args=[run.pk, 0], countdown=settings.PROBE_TIMEOUT_S)
    for device in (first, middle, last):  # as if each answer reached another process
        recovery.run_probe_answered(run=Run.objects.get(pk=run.pk),
                                    device=Device.objects.get(pk=device.pk), holds=True)
    assert Probe.objects.get(run=run).answers == {d.uid: True for d in (first, middle, last)}
    assert tasks.probe_verdict.apply(args=[run.pk, 0]).get() == []
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING and not Probe.objects.filter(run=run).exists()


def test_a_lost_device_that_connects_again_joins_the_run_s_timeline() -> None:
    run = running_run()
    middle = staged(run)[1]
    rd = RunDevice.objects.get(run=run, device=middle)
    rd.stage_state = RunDevice.StageState.LOST
    rd.save()
    recovery.run_device_back(device=middle)
    rd.refresh_from_db()
    assert rd.stage_state == RunDevice.StageState.IDLE and rd.stage is None
    assert FaultEvent.objects.get(run=run, kind="device_joined").device == middle.uid


def test_a_device_back_during_the_recovery_that_lost_it_joins_at_its_commit() -> None:
    # an agent restarted at once (*Restart agent* in the demo) connected while the recovery
    # that lost it ran: it was left out then, and never joined (no device_joined, still lost)
    run = running_run()
    first, middle, last = staged(run)
    stages = {s["devices"][0]: s["layers"] for s in run.deployment["plan"]["stages"]}
    recovery.run_device_lost(device=middle, reason="connection closed", detected_by="test")
    recovery.run_device_back(device=middle)  # its agent is back before the recovery ends
    assert not FaultEvent.objects.filter(run=run, kind="device_joined").exists()
    run.refresh_from_db()
    # the server's replicas: the middle stage's had none (so it restarts from the seed, at 0);
    # one uploaded before the loss, past that point, is training thrown away
    WeightReplica.objects.create(run=run, device=first.uid, first=0, last=0, applied=8,
                                 path=f"runs/{run.pk}/thrown-away", bytes=1, sha256="0" * 64)
    for device in (first, last):
        run = recovery.run_stage_halted(run=run, device=device, generation=1, holdings=[
            {"layers": stages[device.uid], "applied": 16, "kind": "own"}])
    for rd in RunDevice.objects.filter(run=run, stage__isnull=False).select_related("device"):
        run = services.run_stage_ready(run=Run.objects.get(pk=run.pk), device=rd.device,
                                       generation=1)
    assert run.state == Run.State.RUNNING
    joined = FaultEvent.objects.get(run=run, kind="device_joined")
    assert joined.device == middle.uid and joined.detail == {"during_recovery": True}
    assert RunDevice.objects.get(run=run, device=middle).stage_state == "idle"
    resume = Generation.objects.get(run=run, number=1).resume_microbatch
    assert resume < 8 and not WeightReplica.objects.filter(run=run, applied__gt=resume).exists()


@pytest.mark.parametrize(("settings", "bare"), [
    ({}, 0),  # global replicas cover every layer
    ({"global_every": 0}, 0),  # each stage's chain replica lives on the next device
    ({"global_every": 0, "chain_every": 0}, 3),  # nothing: every stage only on its device
])
def test_a_run_says_when_it_starts_which_layers_no_replica_covers(settings, bare) -> None:
    # an agent lost with no copy of its layers anywhere restarts the run from its seed: the
    # run says so when it starts, before it is needed, and at each re-partition
    run = running_run(**settings)
    started = FaultEvent.objects.get(run=run, kind="run_started")
    unprotected = started.detail.get("unprotected", [])
    assert len(unprotected) == bare
    stages = run.deployment["plan"]["stages"]
    assert unprotected == [{"layers": s["layers"], "only_on": s["devices"]}
                           for s in stages][:bare]
    if bare:
        first, middle, last = staged(run)
        recovery.run_device_lost(device=middle, reason="gone", detected_by="test")
        run.refresh_from_db()
        for device in (first, last):
            run = recovery.run_stage_halted(run=run, device=device, generation=1, holdings=[])
        replanned = FaultEvent.objects.get(run=run, kind="repartitioned").detail
        assert replanned["unprotected"] == [
            {"layers": s["layers"], "only_on": s["devices"]} for s in replanned["stages"]
            if len(s["devices"]) == 1]
        assert replanned["unprotected"]
