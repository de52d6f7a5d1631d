"""FTPipeHD's dynamic re-partition, made to pay: checked as training progresses, deployed as a
recovery that lost nobody when the time it saves exceeds moving."""

from __future__ import annotations

import logging
from dataclasses import replace

from django.db import transaction

from orchestrator.errors import FormatError, PlanningError
from orchestrator.partition import run_planner
from orchestrator.planformat import parse_plan
from orchestrator.recovery import (
    Decision,
    repartition_decision,
)
from orchestrator.redistribution import redistribute_weights
from webapp.runs.models import (
    Run,
)
from webapp.runs.recovery.inputs import (
    dynamic_planner,
    measured_period_s,
    next_generation_inputs,
)
from webapp.runs.recovery.replan import candidates, lose
from webapp.runs.services.control import (
    control_event,
    lock_run,
)
from webapp.runs.states import Deployment, RunState

log = logging.getLogger(__name__)


def _checks(run: Run) -> int:
    """Micro-batches at which the next dynamic re-partition check is due."""
    return run.repartition_after * run.microbatches

def _repartition_due(run: Run, progress: int) -> bool:
    deployment = Deployment.from_json(run.deployment)
    due = deployment.next_check or _checks(run)
    return bool(run.state == RunState.RUNNING and run.repartition_every and progress >= due
                and deployment.plan)

def run_repartition_check(*, run_id: int, progress: int, seen: Run | None = None
                          ) -> Run | None:
    """FTPipeHD's dynamic re-partition, made to pay: after ``repartition_after`` batches and then
    every ``repartition_every``, re-estimate the devices from their measured stage times, plan
    again, and move only if the time saved over the remaining micro-batches exceeds the cost
    of moving (the weights over the slowest link, the restart, the micro-batches redone).
    ``progress``: the furthest micro-batch an update was reported for. ``seen``: the run as the
    caller has just read it; when that copy is not due, the check ends there, without a
    transaction (every batch of an agent's events asks, several times a second; the next batch
    reads the run again)."""
    if seen is not None and not _repartition_due(seen, progress):
        return None
    with transaction.atomic():
        run = lock_run(Run(pk=run_id))
        if not _repartition_due(run, progress):
            return None
        run.deployment = replace(
            Deployment.from_json(run.deployment),
            next_check=progress + run.repartition_every * run.microbatches).to_json()
        run.save(update_fields=["deployment"])
        decision = _repartition_decision(run, progress)
        if decision is None:
            return run
        detail = {"saved_s": round(decision.saved_s, 4), "cost_s": round(decision.cost_s, 4)}
        if not decision.move:
            control_event(run, "repartition_skipped", detail={
                **detail, **Deployment.from_json(run.deployment).estimate})
            return run
        return lose(run, [], reason="", detected_by="", cause="dynamic", decision=detail)

def _repartition_decision(run: Run, progress: int) -> Decision | None:
    deployment = Deployment.from_json(run.deployment)
    try:
        profile, all_devices, cm = next_generation_inputs(run, candidates(run))
        current = parse_plan(dict(deployment.plan or {}), profile=profile, devices=all_devices,
                             file="the current plan")
        measured = measured_period_s(run=run, since_s=deployment.since_s,
                                     last=current.stages[-1].devices)
        if measured is None:
            return None
        plan = run_planner(cm, dynamic_planner(run), schedule=run.schedule,
                           microbatches=run.microbatches)
    except (PlanningError, FormatError, ValueError, KeyError) as exc:
        log.warning("run %s: no dynamic re-partition: %s", run.pk, exc)
        return None
    predicted = plan.predicted
    if predicted is None:
        return None
    same = [(s.layers, s.devices) for s in plan.stages] == [
        (s.layers, s.devices) for s in current.stages]
    moved = 0 if same else redistribute_weights(
        old=current, new=plan, failed=(), profile=profile,
        momentum=run.momentum > 0).bytes_moved
    bandwidth = min(d.bandwidth_bps for d in cm.devices.devices)
    decision = repartition_decision(
        measured_period_s=measured, new_period_s=predicted.period_s,
        remaining_microbatches=max(0, run.total_microbatches - progress),
        bytes_to_move=moved, bandwidth_bps=bandwidth,
        restart_s=deployment.restart_s or 1.0,
        redo_microbatches=len(current.stages))
    run.deployment = replace(deployment, estimate={
        "measured_throughput_sps": round(run.model_spec.batch_size / measured, 2),
        "predicted_throughput_sps": round(predicted.throughput_sps, 2)}).to_json()
    run.save(update_fields=["deployment"])
    if same:
        return Decision(saved_s=0.0, cost_s=decision.cost_s)
    return decision
