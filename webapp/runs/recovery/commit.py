"""A recovery's commit: every stage of the next generation is ready, and all start at the
resume point at one time."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace

from webapp.devices.commands import command_build, device_command_send
from webapp.runs.models import (
    Generation,
    Run,
    RunDevice,
    WeightReplica,
)
from webapp.runs.services.control import (
    ACTIVE_DEVICE,
    control_event,
    move_run,
    run_clock_origin,
    staged_devices,
)
from webapp.runs.states import Deployment, Recovery, RunState

log = logging.getLogger(__name__)

S = RunDevice.StageState
RESUME_DELAY_S = 0.1  # between the last ready and the common resume, for the start message


def recovery_ready(run: Run) -> Run:
    """With the run locked, recovering and every stage of the next generation ready: the
    commit. Everyone starts at the resume point at one time; the survivors the new plan left
    out drop what they held. A run paused before or during the recovery starts its stages
    paused and is paused again; resuming it resumes them."""
    recovery = Recovery.from_json(run.recovery)
    assert recovery is not None  # the run is recovering
    generation, paused = recovery.generation, recovery.paused
    now = time.time()
    begin_at = now + RESUME_DELAY_S
    from_start = recovery.from_start  # lost while starting: this begins the run
    if from_start or run.started_at is None:  # the run's clock starts with its training
        run.started_at, _ = run_clock_origin(run, begin_at)  # (where a restart's goes on)
    started_at = run.started_at.timestamp()
    staged = staged_devices(run)
    RunDevice.objects.filter(pk__in=[s.pk for s in staged]).update(stage_state=S.RUNNING)
    RunDevice.objects.filter(run=run).update(holdings=[])
    # the server's replicas past the resume point hold training the recovery threw away: with
    # the next generation's replicas they could restore a model no run ever had
    WeightReplica.objects.filter(run=run, applied__gt=recovery.resume).delete()
    for rd in staged:
        device_command_send(uid=rd.device.uid, command=command_build(
            "start", run=run.pk, generation=generation, started_at=started_at,
            begin_at=begin_at, paused=paused))
    for uid in recovery.release:
        device_command_send(uid=uid, command=command_build("stop", run=run.pk))
    detected = recovery.detected_wall or now
    moved_s = now - (recovery.replanned_wall or now)
    control_event(run, "weights_redistributed", detail={
        "generation": generation, "bytes_moved": recovery.bytes_moved,
        "transfers": recovery.transfers, "duration_s": round(moved_s, 4)})
    recovery_s = begin_at - detected
    resumed_at = begin_at - started_at
    Generation.objects.filter(run=run, number=generation).update(resumed_at=resumed_at)
    run.generation = generation
    run.deployment = replace(Deployment.from_json(run.deployment), plan=recovery.next_plan,
                             since_s=resumed_at, restart_s=recovery_s).to_json()
    run.recovery = {}
    after = move_run(run, RunState.PAUSED if paused else RunState.RUNNING,
                        action="resume after recovery")
    control_event(after, "recovered", detail={
        "generation": generation, "recovery_s": round(recovery_s, 4),
        "resume_microbatch": recovery.resume,
        "microbatches_redone": recovery.redone, "paused": paused})
    if from_start:
        control_event(after, "run_started", detail={"after_recovery": True})
    _rejoin_connected(after, recovery.back)
    return after

def _rejoin_connected(run: Run, back: Sequence[str]) -> None:
    """Devices lost in the recovery just committed whose agent connected again meanwhile (one
    restarted at once): run_device_back kept them for the commit; they join now, as if they
    had connected after it."""
    for rd in (RunDevice.objects.filter(run=run, stage_state=S.LOST, device__uid__in=list(back),
                                        device__status__in=ACTIVE_DEVICE)
               .select_related("device")):
        RunDevice.objects.filter(pk=rd.pk).update(stage_state=S.IDLE, stage=None)
        control_event(run, "device_joined", device=rd.device.uid,
                      detail={"during_recovery": True})
