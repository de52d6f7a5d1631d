"""Detection beyond a closed connection: stage 0's backward timer makes the server probe every
staged device; one that does not answer, or answers without its stage (it restarted), is lost
and the run recovers without it. A lost device that connects again shows on the timeline."""

from __future__ import annotations

import pytest

from tests.webapp.runs.test_dynamic_repartition import running_run
from webapp.devices.models import Device
from webapp.runs import recovery
from webapp.runs.models import FaultEvent, Run, RunDevice

pytestmark = pytest.mark.django_db(transaction=True)  # planning runs on commit


def staged(run: Run) -> list[Device]:
    return [rd.device for rd in RunDevice.objects.filter(run=run).order_by("position")]


def test_a_device_silent_to_a_probe_or_restarted_is_lost(settings) -> None:  # type: ignore[no-untyped-def]
    settings.PROBE_TIMEOUT_S = 60  # the verdict is called by hand below
    run = running_run()
    first, middle, last = staged(run)
    recovery.run_suspect(run=run, device=first, generation=0)
    recovery.run_probe_answered(run=run, device=first, holds=True)
    recovery.run_probe_answered(run=run, device=last, holds=False)  # restarted: stage gone
    recovery._probe_verdict(run.pk)
    run.refresh_from_db()
    assert run.state == Run.State.RECOVERING
    assert sorted(run.recovery["lost"]) == sorted([middle.uid, last.uid])
    lost = {f.device: f.detail for f in FaultEvent.objects.filter(run=run, kind="device_lost")}
    assert lost[middle.uid]["detected_by"] == "probe"
    assert "no answer to a probe" in lost[middle.uid]["reason"]
    assert "restarted" in lost[last.uid]["reason"]


def test_healthy_answers_change_nothing_and_a_stale_suspect_is_ignored(settings) -> None:  # type: ignore[no-untyped-def]
    settings.PROBE_TIMEOUT_S = 60
    run = running_run()
    recovery.run_suspect(run=run, device=staged(run)[0], generation=7)  # not this generation
    assert run.pk not in recovery._probes
    recovery.run_suspect(run=run, device=staged(run)[0], generation=0)
    for device in staged(run):
        recovery.run_probe_answered(run=run, device=device, holds=True)
    recovery._probe_verdict(run.pk)
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING
    assert not FaultEvent.objects.filter(run=run, kind="device_lost").exists()


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
