"""What every write on a run builds on: locking it, moving it through the state machine, its
clock, control events on its timeline, commands to all its stages, failing it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from orchestrator.events import FaultEvent as FaultRecord
from webapp.common.exceptions import InvalidInput
from webapp.devices.commands import command_build, device_command_send
from webapp.devices.models import Device, devices_named
from webapp.runs import events, selectors
from webapp.runs.models import (
    Run,
    RunDevice,
)
from webapp.runs.services.ingest import fault_events_store
from webapp.runs.states import Recovery, RunState, check_transition

log = logging.getLogger(__name__)


ACTIVE_DEVICE = (Device.Status.ONLINE, Device.Status.BUSY)


def lock_run(run: Run) -> Run:
    return Run.objects.select_for_update().get(pk=run.pk)


def move_run(run: Run, target: str, *, action: str, **changes: Any) -> Run:
    """Move a locked run to ``target`` (409 if not allowed) and tell its group."""
    check_transition(entity=f"run {run.pk}", state=run.state, target=target, action=action)
    run.state = target
    for name, value in changes.items():
        setattr(run, name, value)
    run.save()
    events.run_event_send(run.pk, events.event_run(run))
    return run


def run_clock(run: Run) -> float:
    """Seconds on the run's clock, the one origin of everything a run records (timeline,
    faults, metrics): 0 at its first start, and a run started again (failed, planned again)
    goes on from the newest time on its record rather than from 0. 0 before the first start;
    while a run starts, or recovers from a device lost as it started, the clock waits where
    its record ends (its training has not begun)."""
    if run.started_at is None:
        return 0.0
    if run.state == RunState.STARTING or (
            run.state == RunState.RECOVERING and _recovering_from_start(run)):
        return selectors.run_record_end(run=run)
    return max(0.0, (timezone.now() - run.started_at).total_seconds())


def run_clock_origin(run: Run, begin_at: float) -> tuple[datetime, float]:
    """The ``started_at`` of a run whose training begins at ``begin_at`` (epoch seconds), the
    instant its clock reads 0, and what it reads at ``begin_at``: where the run's record ends
    (0 on a first start). Agents time their events from it."""
    resume_s = selectors.run_record_end(run=run)
    return datetime.fromtimestamp(begin_at - resume_s, tz=UTC), resume_s


def _recovering_from_start(run: Run) -> bool:
    recovery = Recovery.from_json(run.recovery)
    return recovery is not None and recovery.from_start


def control_event(run: Run, kind: str, *, device: str = "",
                  detail: dict[str, Any] | None = None, at: float | None = None) -> None:
    """A control event of the run, at ``at`` on its clock (default: now)."""
    rows = fault_events_store(run=run, records=[FaultRecord(
        run=run.pk, at=run_clock(run) if at is None else at, kind=kind, device=device or None,
        detail=detail or {})])
    events.run_event_send(run.pk, events.event_faults([selectors.fault_json(r) for r in rows]))


def staged_devices(run: Run) -> list[RunDevice]:
    return list(RunDevice.objects.filter(run=run, stage__isnull=False)
                .select_related("device").order_by("stage", "position"))


def part_reached(rd: RunDevice, *, pipeline: int | None, stage: int | None, target: str,
                 source: tuple[str, ...] | None = None) -> bool:
    """For a device holding several stages of its run (``rd.parts``; lock its row first):
    move the one of ``pipeline`` and ``stage`` to ``target`` (from ``source`` only, when
    given) and save; whether every one of them is then at ``target``. A report that names
    none of its stages is InvalidInput; one that does not name the stage, when the device
    holds several, too."""
    if pipeline is None and stage is None and len(rd.parts) == 1:
        pipeline, stage = rd.parts[0]["pipeline"], rd.parts[0]["stage"]
    found = next((p for p in rd.parts if (p["pipeline"], p["stage"]) == (pipeline, stage)),
                 None)
    if found is None:
        raise InvalidInput("stage", f"device {rd.device.uid} holds no stage {stage} of "
                                    f"pipeline {pipeline} in run {rd.run_id}")
    if source is None or found["state"] in source:
        found["state"] = target
        rd.save(update_fields=["parts"])
    return all(p["state"] == target for p in rd.parts)


def command_all_stages(run: Run, name: str, **fields: Any) -> None:
    for rd in staged_devices(run):
        device_command_send(uid=rd.device.uid, command=command_build(name, run=run.pk, **fields))


def finish_if_done(run: Run) -> Run:
    """With the run locked, running or paused: finish it once every staged device is done."""
    if any(s.stage_state != RunDevice.StageState.DONE for s in staged_devices(run)):
        return run
    control_event(run, "run_finished")
    finished = move_run(run, RunState.FINISHED, action="finish", finished_at=timezone.now())
    # the agents forget the run at once: its weights, and its peers' admission to their data
    # planes (without it, a finished run's peers stayed admitted until RUN_END_GRACE_S)
    command_all_stages(finished, "stop")
    return finished


def fail_run(run: Run, error: str, *, device: str = "") -> Run:
    """Fail a run that is starting or running: tell its agents to stop, say why."""
    failed = move_run(run, RunState.FAILED, action="fail", error=error,
                         finished_at=timezone.now())
    events.run_event_send(failed.pk, events.event_idle(failed))
    control_event(failed, "run_failed", device=device, detail={"error": error})
    command_all_stages(failed, "stop")
    return failed


def runs_fail_silent(run_ids: Iterable[int], silent_of: Callable[[Run], list[Device] | None],
                     why: Callable[[str], str]) -> list[int]:
    """Lock each run and fail those that still have devices that did not answer: the ones
    ``silent_of`` names (None: the run no longer waits, leave it), with ``why`` of their
    names as the error. Returns the ids of the runs failed."""
    failed = []
    for run_id in run_ids:
        with transaction.atomic():
            locked = Run.objects.select_for_update().get(pk=run_id)
            silent = silent_of(locked)
            if silent is None:
                continue
            fail_run(locked, why(devices_named(silent) or "no device"))
            failed.append(run_id)
    return failed
