"""A run's life: planning it, starting, pausing and stopping it, and its agents' reports on their
stages (ready, failed, done) that move it on."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from orchestrator.errors import FormatError
from orchestrator.planformat import parse_plan_stages
from orchestrator.recovery import unprotected_stages
from orchestrator.validation import At
from webapp.common.exceptions import InvalidInput
from webapp.devices.models import Device, LayerProfile
from webapp.devices.selectors import planning_costs
from webapp.runs import events
from webapp.runs.models import (
    Generation,
    Plan,
    Run,
    RunDevice,
)
from webapp.runs.selectors import plan_best
from webapp.runs.services.control import (
    command_all_stages,
    control_event,
    fail_run,
    finish_if_done,
    lock_run,
    move_run,
    part_reached,
    run_clock_origin,
    runs_fail_silent,
    staged_devices,
)
from webapp.runs.services.creation import check_algorithms
from webapp.runs.services.deployment import deploy_plan
from webapp.runs.services.pipelearn import check_methods as check_pipelearn_methods
from webapp.runs.services.split import check_methods
from webapp.runs.states import ACTIVE, Deployment, Recovery, RunState, check_transition

log = logging.getLogger(__name__)


START_DELAY_S = 0.5  # between the last agent's ready and the common start, for the message


@transaction.atomic
def run_transition(*, run: Run, target: str, action: str | None = None, **changes: Any) -> Run:
    """Move ``run`` to ``target`` if the state machine allows it; IllegalTransition (409)
    otherwise. ``changes`` are saved with the new state."""
    return move_run(lock_run(run), target, action=action or f"move it to {target}", **changes)


@transaction.atomic
def run_plan(*, run: Run, algorithms: Sequence[str] | None = None) -> Run:
    """Queue planning: one plan per algorithm, each computed by a Celery task; the run is
    planning until all are computed. Plans from an earlier planning are replaced."""
    locked = lock_run(run)
    check = {"split": check_methods, "pipelearn": check_pipelearn_methods}.get(
        locked.kind, check_algorithms)
    chosen = check(algorithms) if algorithms is not None else locked.algorithms
    check_transition(entity=f"run {locked.pk}", state=locked.state, target=RunState.PLANNING,
                     action="plan")
    locked.chosen_plan = None
    locked.save(update_fields=["chosen_plan"])
    profiles = {p.device_id: p for p in LayerProfile.objects.filter(
        model_spec=locked.model_spec, device__run_devices__run=locked)}
    rows = list(RunDevice.objects.filter(run=locked).select_related("device"))
    for rd in rows:
        rd.overhead_s, rd.message_s, rd.pass_overhead_s = planning_costs(  # these plans'
            device=rd.device, profile=profiles.get(rd.device_id))
    RunDevice.objects.bulk_update(rows, ["overhead_s", "message_s", "pass_overhead_s"])
    Plan.objects.filter(run=locked).delete()
    plans = Plan.objects.bulk_create(Plan(run=locked, algorithm=a) for a in chosen)
    move_run(locked, RunState.PLANNING, action="plan", algorithms=chosen, error="")
    from webapp.runs.tasks import plan_compute  # the task module imports these services

    for plan in plans:
        transaction.on_commit(partial(plan_compute.delay, plan.pk))
    return locked


@transaction.atomic
def run_start(*, run: Run, plan: Plan | None = None) -> Run:
    """Start a planned run with ``plan`` (default: the best), or resume a paused run. Starting
    deploys each stage of the plan to its device; the run runs once every agent is ready."""
    locked = lock_run(run)
    if locked.state == RunState.PAUSED:
        if plan is not None and plan.pk != locked.chosen_plan_id:
            raise InvalidInput("plan", "a paused run resumes with its plan "
                                       f"({locked.chosen_plan_id}); stop it to use another")
        command_all_stages(locked, "resume")
        control_event(locked, "run_started", detail={"resumed": True})
        return move_run(locked, RunState.RUNNING, action="resume")
    check_transition(entity=f"run {locked.pk}", state=locked.state, target=RunState.STARTING,
                     action="start")
    if plan is None:
        plan = plan_best(run=locked)
        if plan is None:
            raise InvalidInput("plan", "the run has no finished plan that fits in memory")
    elif plan.run_id != locked.pk:
        raise InvalidInput("plan", f"plan {plan.pk} belongs to run {plan.run_id}")
    elif plan.status != Plan.Status.DONE:
        raise InvalidInput("plan", f"plan {plan.pk} ({plan.algorithm}) is {plan.status}, "
                                   "not done")
    elif not plan.memory_ok:
        raise InvalidInput("plan", f"plan {plan.pk} ({plan.algorithm}) does not fit in the "
                                   "devices' memory")
    started = move_run(locked, RunState.STARTING, action="start", chosen_plan=plan,
                          started_at=timezone.now(), error="")
    return deploy_plan(started, plan)


@transaction.atomic
def run_pause(*, run: Run) -> Run:
    """Pause a running run: every stage stops before its next pass. A recovering run is paused
    when its recovery ends (webapp.runs.recovery.recovery_ready): until then its devices are
    halting or deploying, not training."""
    locked = lock_run(run)
    if locked.state == RunState.RECOVERING:
        recovery = Recovery.from_json(locked.recovery)
        if recovery is not None and not recovery.paused:
            locked.recovery = replace(recovery, paused=True).to_json()
            locked.save(update_fields=["recovery"])
            control_event(locked, "run_paused", detail={"after_recovery": True})
        return locked
    locked = move_run(locked, RunState.PAUSED, action="pause")
    events.run_event_send(locked.pk, events.event_idle(locked))
    command_all_stages(locked, "pause")
    control_event(locked, "run_paused")
    return locked


@transaction.atomic
def run_stop(*, run: Run) -> Run:
    locked = move_run(lock_run(run), RunState.CANCELLED, action="stop",
                         finished_at=timezone.now())
    command_all_stages(locked, "stop")
    return locked


def _stage_of(run: Run, device: Device) -> RunDevice:
    rd = RunDevice.objects.select_for_update().filter(run=run, device=device).first()
    if rd is None or rd.stage is None:
        raise InvalidInput("run", f"device {device.uid} holds no stage of run {run.pk}")
    return rd


@transaction.atomic
def run_stage_ready(*, run: Run, device: Device, generation: int | None = None,
                    pipeline: int | None = None, stage: int | None = None) -> Run:
    """An agent built its stage (of ``pipeline``, ``stage``: a device of a split run holds
    several, and is ready once each is). When every stage is ready, all start at one time."""
    locked = lock_run(run)
    rd = _stage_of(locked, device)
    recovering = locked.state == RunState.RECOVERING
    if recovering and generation != _recovering_generation(locked):
        return locked  # ready for a generation a further loss has replaced
    if locked.state != RunState.STARTING and not recovering:
        return locked  # a late answer to a run that failed or was stopped meanwhile
    if rd.stage_state != RunDevice.StageState.DEPLOYING:
        return locked
    if rd.parts and not part_reached(rd, pipeline=pipeline, stage=stage,
                                     target=RunDevice.StageState.READY,
                                     source=(RunDevice.StageState.DEPLOYING,)):
        return locked
    rd.stage_state = RunDevice.StageState.READY
    rd.save(update_fields=["stage_state"])
    staged = staged_devices(locked)
    if any(s.stage_state != RunDevice.StageState.READY for s in staged):
        return locked
    if recovering:
        from webapp.runs.recovery import recovery_ready  # it builds on these services

        return recovery_ready(locked)
    begin_at = time.time() + START_DELAY_S
    # a run started again goes on with its clock: one origin for all it records
    origin, resume_s = run_clock_origin(locked, begin_at)
    RunDevice.objects.filter(pk__in=[s.pk for s in staged]).update(
        stage_state=RunDevice.StageState.RUNNING)
    command_all_stages(locked, "start", started_at=origin.timestamp(), begin_at=begin_at)
    plan = locked.chosen_plan
    # the generation's own measurements (capacity, the re-partition checks) start with it
    running = move_run(locked, RunState.RUNNING, action="run", started_at=origin,
                       generation=0, recovery={}, deployment=Deployment(
                           plan=None if plan is None else plan.document,
                           since_s=resume_s).to_json())
    if plan is not None:
        Generation.objects.update_or_create(run=running, number=0, defaults={
            "cause": Generation.Cause.START, "planner": plan.algorithm, "plan": plan.document,
            "predicted_throughput_sps": plan.throughput_sps, "resumed_at": resume_s})
    control_event(running, "run_started", detail=_protection(running, plan), at=resume_s)
    return running


def _protection(run: Run, plan: Plan | None) -> dict[str, Any]:
    """What the run_started event says of the layers no replica covers (a lost device's
    restart from the seed), before it is needed; nothing when every stage is covered."""
    if plan is None or not isinstance(plan.document, dict):
        return {}
    try:
        stages = parse_plan_stages(plan.document.get("stages"), At(f"plan {plan.pk}"))
    except FormatError:
        return {}
    bare = unprotected_stages(stages, chain_every=run.chain_every,
                              global_every=run.global_every)
    return {"unprotected": bare} if bare else {}


def _recovering_generation(run: Run) -> int | None:
    """The generation the run's recovery under way deploys."""
    recovery = Recovery.from_json(run.recovery)
    return None if recovery is None else recovery.generation


def _stale(run: Run, generation: int | None) -> bool:
    """A report of a generation a recovery has replaced (or is replacing)."""
    if generation is None:
        return False
    if run.state == RunState.RECOVERING:
        return generation != _recovering_generation(run)
    return generation != run.generation


@transaction.atomic
def run_stage_failed(*, run: Run, device: Device, error: str, generation: int | None = None,
                     pipeline: int | None = None, stage: int | None = None) -> Run:
    """An agent could not deploy or run its stage: the run fails with its reason."""
    locked = lock_run(run)
    if _stale(locked, generation):
        return locked
    rd = _stage_of(locked, device)
    where = f"stage {rd.stage if stage is None else stage}"
    if rd.parts and (pipeline is not None or len(rd.parts) == 1):  # a refused deploy's
        # ack may not say which of its stages it was
        part_reached(rd, pipeline=pipeline, stage=stage, target=RunDevice.StageState.FAILED)
        where = f"stage {stage} of pipeline {pipeline}"
    rd.stage_state = RunDevice.StageState.FAILED
    rd.stage_error = error
    rd.save(update_fields=["stage_state", "stage_error"])
    if locked.state not in ACTIVE:
        return locked
    return fail_run(locked, f"device {device.named}, {where}: {error}",
                    device=device.uid)


@transaction.atomic
def run_stage_done(*, run: Run, device: Device, generation: int | None = None,
                   pipeline: int | None = None, stage: int | None = None) -> Run:
    """An agent ran its stage (of ``pipeline``, ``stage``: a device of a split run is done
    once each of its stages is) to the end; the run finishes with its last stage."""
    locked = lock_run(run)
    if _stale(locked, generation):
        return locked
    rd = _stage_of(locked, device)
    if rd.parts and not part_reached(rd, pipeline=pipeline, stage=stage,
                                     target=RunDevice.StageState.DONE):
        return locked
    rd.stage_state = RunDevice.StageState.DONE
    rd.save(update_fields=["stage_state"])
    events.run_event_send(locked.pk, events.event_idle(locked))  # the throttle's last word
    if locked.state not in (RunState.RUNNING, RunState.PAUSED):
        return locked
    return finish_if_done(locked)


def runs_fail_stalled(*, older_than_s: float) -> list[int]:
    """Fail the runs still starting ``older_than_s`` after their deployment was sent, naming the
    devices that did not answer (their agent stopped or lost its connection meanwhile)."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)

    def deploying(run: Run) -> list[Device] | None:
        if run.state != RunState.STARTING:
            return None
        return [rd.device for rd in staged_devices(run)
                if rd.stage_state == RunDevice.StageState.DEPLOYING]

    return runs_fail_silent(
        Run.objects.filter(state=RunState.STARTING, started_at__lt=cutoff
                           ).values_list("pk", flat=True), deploying,
        lambda names: f"{names} did not answer the deployment within {older_than_s:.0f} s: "
                      "is its agent running?")
