"""Probing a run's devices when stage 0's backward timer fires: the probe is a row (any web
process may take an answer) and the verdict a Celery task with a countdown."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import transaction

from webapp.devices.commands import command_build, device_command_send
from webapp.devices.models import Device
from webapp.runs.models import (
    Probe,
    Run,
    RunDevice,
)
from webapp.runs.recovery.replan import run_device_lost
from webapp.runs.services.control import (
    staged_devices,
)
from webapp.runs.states import RunState

log = logging.getLogger(__name__)


def run_suspect(*, run: Run, device: Device, generation: Any) -> None:
    """Stage 0's backward timer fired: probe every staged device; whoever has not answered
    within PROBE_TIMEOUT_S is lost (a device that answers without the stage restarted and is
    lost too). The probe is a row (any web process may take an answer) and the verdict a
    Celery task with that countdown."""
    if run.state != RunState.RUNNING or generation != run.generation:
        return
    # a device whose every stage has ended (a split run's helper of a client counted out
    # holds no stage any more) answers without one: it was taken for restarted and lost,
    # and the recovery that followed never ended
    staged = [rd.device.uid for rd in staged_devices(run)
              if rd.stage_state != RunDevice.StageState.DONE]
    generation = run.generation
    with transaction.atomic():
        # an earlier generation's probe whose verdict has not come yet is moot (the verdict
        # judges only its own generation's) and would keep this one from going out
        Probe.objects.filter(run=run).exclude(generation=generation).delete()
        _, created = Probe.objects.get_or_create(
            run=run, defaults={"generation": generation, "asked": staged, "answers": {}})
        if not created:
            return  # a probe is already out
        transaction.on_commit(lambda: probe_verdict_schedule(run.pk, generation))
    for uid in staged:
        device_command_send(uid=uid, command=command_build("probe", run=run.pk))

def probe_verdict_schedule(run_id: int, generation: int) -> None:
    from webapp.runs.tasks import probe_verdict  # the tasks module imports this one

    probe_verdict.apply_async(args=[run_id, generation], countdown=settings.PROBE_TIMEOUT_S)

@transaction.atomic
def run_probe_answered(*, run: Run, device: Device, holds: Any) -> None:
    probe = Probe.objects.select_for_update().filter(run=run).first()
    if probe is not None and device.uid in probe.asked:
        probe.answers = {**probe.answers, device.uid: bool(holds)}
        probe.save(update_fields=["answers"])

def probe_verdict(run_id: int, generation: int | None = None) -> list[str]:
    """The countdown of the run's probe of ``generation`` ran out: every device asked that did
    not answer holding its stage is lost, unless its stages have all ended meanwhile. Returns
    their uids (none when the probe is gone: already judged or replaced by a later
    generation's, whose own verdict judges it; none either when the run has left the
    generation it probed: a recovery that started meanwhile halted the survivors, whose
    answers then say they hold no stage; its halts find the silent ones, HALT_TIMEOUT_S).
    ``generation`` None: whichever probe is out (a verdict queued by an older server)."""
    with transaction.atomic():
        probe = Probe.objects.select_for_update().filter(run_id=run_id).first()
        if probe is None or generation not in (None, probe.generation):
            return []
        asked, answers = list(probe.asked), dict(probe.answers)
        probe.delete()
        run = Run.objects.get(pk=run_id)
        if run.state != RunState.RUNNING or run.generation != probe.generation:
            log.info("run %s: the probe of generation %s is moot (the run is %s at generation "
                     "%s); answers %s", run_id, probe.generation, run.state, run.generation,
                     answers)
            return []
    ended = set(RunDevice.objects.filter(run_id=run_id, device__uid__in=asked,
                                         stage_state=RunDevice.StageState.DONE)
                .values_list("device__uid", flat=True))  # its stages ended since it was asked
    lost = [uid for uid in asked if not answers.get(uid) and uid not in ended]
    for uid in lost:
        device = Device.objects.get(uid=uid)
        reason = ("it restarted: its stage is gone" if uid in answers
                  else f"no answer to a probe within {settings.PROBE_TIMEOUT_S:g} s")
        run_device_lost(device=device, reason=reason, detected_by="probe")
    return lost
