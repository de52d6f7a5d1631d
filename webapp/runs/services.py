"""Writes on runs: creating them, the state machine's transitions, planning (queued as one
Celery task per plan) and storing what a run produces in bulk."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import DatabaseError, transaction
from django.utils import timezone

from orchestrator.cost import build_cost_model, memory_shortfall
from orchestrator.errors import FormatError, PlanningError
from orchestrator.events import FaultEvent as FaultRecord
from orchestrator.events import TimelineEvent as TimelineRecord
from orchestrator.events import parse_event, parse_fault
from orchestrator.formats import SCHEDULES
from orchestrator.partition import PLANNERS, run_planner
from orchestrator.simulator import simulate
from webapp.common.exceptions import Conflict, InvalidInput
from webapp.devices.models import Device, ModelSpec
from webapp.runs import events, selectors
from webapp.runs.models import FaultEvent, MetricPoint, Plan, Run, RunDevice, TimelineEvent
from webapp.runs.selectors import plan_best, run_planning_inputs
from webapp.runs.states import ACTIVE, RunState, check_transition

log = logging.getLogger(__name__)

BULK_BATCH = 2000
# what the event tables' integer columns hold
COLUMN_LIMITS = {"stage": 2**31 - 1, "microbatch": 2**31 - 1, "version": 2**31 - 1,
                 "bytes": 2**63 - 1}
UNFINISHED = (Plan.Status.PENDING, Plan.Status.RUNNING)


# --------------------------------------------------------------------------- creation


def _check_algorithms(algorithms: Sequence[str], field: str = "algorithms") -> list[str]:
    if not algorithms:
        raise InvalidInput(field, "must name at least one algorithm")
    for i, name in enumerate(algorithms):
        if name not in PLANNERS:
            raise InvalidInput(f"{field}[{i}]", f"unknown algorithm {name!r}; known: "
                                                f"{', '.join(PLANNERS)}")
        if name in algorithms[:i]:
            raise InvalidInput(f"{field}[{i}]", f"repeats {name!r}")
    return list(algorithms)


@transaction.atomic
def run_create(*, name: str, model_spec: ModelSpec, devices: Sequence[Device],
               algorithms: Sequence[str], schedule: str = "1f1b", microbatches: int = 8,
               batches: int = 100, epochs: int = 1,
               created_by: AbstractBaseUser | None = None) -> Run:
    """A draft run of ``model_spec`` on ``devices`` (in pipeline order)."""
    if not devices:
        raise InvalidInput("devices", "must name at least one device")
    for i, device in enumerate(devices):
        if device.status == Device.Status.RETIRED:
            raise InvalidInput(f"devices[{i}]", f"device {device.pk} ({device.uid}) is retired")
        if device in devices[:i]:
            raise InvalidInput(f"devices[{i}]", f"repeats device {device.pk}")
    if schedule not in SCHEDULES:
        raise InvalidInput("schedule", f"must be one of {', '.join(SCHEDULES)}")
    run = Run.objects.create(name=name, model_spec=model_spec,
                             algorithms=_check_algorithms(algorithms), schedule=schedule,
                             microbatches=microbatches, batches=batches, epochs=epochs,
                             created_by=created_by)
    RunDevice.objects.bulk_create(RunDevice(run=run, device=d, position=k)
                                  for k, d in enumerate(devices))
    events.run_event_send(run.pk, events.event_run(run))
    return run


# --------------------------------------------------------------------------- state machine


def _locked(run: Run) -> Run:
    return Run.objects.select_for_update().get(pk=run.pk)


def _transition(run: Run, target: str, *, action: str, **changes: Any) -> Run:
    """Move a locked run to ``target`` (409 if not allowed) and tell its group."""
    check_transition(entity=f"run {run.pk}", state=run.state, target=target, action=action)
    run.state = target
    for name, value in changes.items():
        setattr(run, name, value)
    run.save()
    events.run_event_send(run.pk, events.event_run(run))
    return run


@transaction.atomic
def run_transition(*, run: Run, target: str, action: str | None = None, **changes: Any) -> Run:
    """Move ``run`` to ``target`` if the state machine allows it; IllegalTransition (409)
    otherwise. ``changes`` are saved with the new state."""
    return _transition(_locked(run), target, action=action or f"move it to {target}", **changes)


@transaction.atomic
def run_plan(*, run: Run, algorithms: Sequence[str] | None = None) -> Run:
    """Queue planning: one plan per algorithm, each computed by a Celery task; the run is
    planning until all are computed. Plans from an earlier planning are replaced."""
    locked = _locked(run)
    chosen = _check_algorithms(algorithms) if algorithms is not None else locked.algorithms
    check_transition(entity=f"run {locked.pk}", state=locked.state, target=RunState.PLANNING,
                     action="plan")
    locked.chosen_plan = None
    locked.save(update_fields=["chosen_plan"])
    Plan.objects.filter(run=locked).delete()
    plans = Plan.objects.bulk_create(Plan(run=locked, algorithm=a) for a in chosen)
    _transition(locked, RunState.PLANNING, action="plan", algorithms=chosen, error="")
    from webapp.runs.tasks import plan_compute  # the task module imports these services

    for plan in plans:
        transaction.on_commit(partial(plan_compute.delay, plan.pk))
    return locked


@transaction.atomic
def run_start(*, run: Run, plan: Plan | None = None) -> Run:
    """Start a planned run with ``plan`` (default: the best), or resume a paused run."""
    locked = _locked(run)
    if locked.state == RunState.PAUSED:
        if plan is not None and plan.pk != locked.chosen_plan_id:
            raise InvalidInput("plan", "a paused run resumes with its plan "
                                       f"({locked.chosen_plan_id}); stop it to use another")
        return _transition(locked, RunState.RUNNING, action="resume")
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
    return _transition(locked, RunState.STARTING, action="start", chosen_plan=plan,
                       started_at=timezone.now())


def run_pause(*, run: Run) -> Run:
    return run_transition(run=run, target=RunState.PAUSED, action="pause")


def run_stop(*, run: Run) -> Run:
    return run_transition(run=run, target=RunState.CANCELLED, action="stop",
                          finished_at=timezone.now())


# --------------------------------------------------------------------------- planning


def _plan_claim(plan_id: int, worker: str) -> Plan | None:
    """Mark a plan running (again, if a worker died on it); None if there is nothing to do."""
    with transaction.atomic():
        plan = Plan.objects.select_for_update().select_related("run").filter(pk=plan_id).first()
        if plan is None or plan.status not in UNFINISHED:
            return None
        if plan.run.state != RunState.PLANNING:
            plan.status, plan.error = Plan.Status.FAILED, f"run {plan.run_id} is {plan.run.state}"
            plan.finished_at = timezone.now()
            plan.save()
            events.run_event_send(plan.run_id, events.event_plan(plan))
            return None
        plan.status = Plan.Status.RUNNING
        plan.attempts += 1
        plan.worker = worker
        plan.started_at = timezone.now()
        plan.save(update_fields=["status", "attempts", "worker", "started_at"])
        events.run_event_send(plan.run_id, events.event_plan(plan))
        return plan


def _plan_figures(plan: Plan) -> dict[str, Any]:
    """Plan ``plan``'s run with its algorithm and simulate a few batches of the result."""
    run = plan.run
    profile, devices = run_planning_inputs(run=run)
    cm = build_cost_model(profile, devices)
    computed = run_planner(cm, plan.algorithm, schedule=run.schedule,
                           microbatches=run.microbatches)
    predicted = computed.predicted
    assert predicted is not None  # every planner returns the cost model's verdict
    figures: dict[str, Any] = {
        "document": computed.to_json(), "stages": len(computed.stages),
        "period_s": predicted.period_s, "throughput_sps": predicted.throughput_sps,
        "bottleneck": predicted.bottleneck, "memory_ok": predicted.memory_ok,
        "planner_s": computed.planner_s, "error": "",
    }
    if not predicted.memory_ok:
        figures["error"] = ("does not fit in memory: "
                            f"{memory_shortfall(cm, computed.stages, predicted)}")
    try:
        result = simulate(cm, computed, run=run.pk,
                          microbatches=run.microbatches * settings.PLANNING_SIMULATED_BATCHES)
    except RuntimeError as exc:  # a schedule the simulator cannot run to the end
        figures["simulation"] = {"error": str(exc)}
    else:
        figures["simulated_throughput_sps"] = result.throughput_sps
        figures["simulation"] = result.summary_json()
    return figures


def _run_settle(run: Run) -> None:
    """With the run locked: once no plan is left to compute, the run is planned if a plan
    fits in memory and failed (saying why each plan failed) otherwise."""
    if run.state != RunState.PLANNING:
        return
    plans = list(Plan.objects.filter(run=run))
    if any(p.status in UNFINISHED for p in plans):
        return
    if any(p.status == Plan.Status.DONE and p.memory_ok for p in plans):
        _transition(run, RunState.PLANNED, action="finish planning", error="")
        return
    reasons = "; ".join(f"{p.algorithm}: {p.error}" for p in plans)
    _transition(run, RunState.FAILED, action="fail planning",
                error=f"no plan could be used. {reasons}")


def plan_compute(*, plan_id: int, worker: str = "") -> dict[str, Any]:
    """Compute one plan (the body of the Celery task): plan with the orchestrator, simulate,
    store, and settle the run when it was the last. Idempotent: a plan already computed is
    left alone, and one whose worker died is computed again."""
    plan = _plan_claim(plan_id, worker)
    if plan is None:
        return {"plan": plan_id, "status": "skipped"}
    try:
        figures = _plan_figures(plan)
        status = Plan.Status.DONE
    except (PlanningError, FormatError, ValueError) as exc:
        figures, status = {"error": str(exc)}, Plan.Status.FAILED
    except DatabaseError:
        raise  # the task retries
    except Exception as exc:  # a bug in a planner must not leave the run planning forever
        log.exception("planning plan %s (%s) crashed", plan_id, plan.algorithm)
        figures, status = {"error": f"the planner crashed: {type(exc).__name__}: {exc}"}, \
            Plan.Status.FAILED
    with transaction.atomic():
        run = _locked(plan.run)
        updated = Plan.objects.filter(pk=plan_id).update(
            status=status, finished_at=timezone.now(), **figures)
        if updated:
            events.run_event_send(run.pk, events.event_plan(Plan.objects.get(pk=plan_id)))
        _run_settle(run)
    return {"plan": plan_id, "status": status}


def plans_requeue_unfinished() -> list[int]:
    """Queue again every plan still pending or running of a planning run.

    For the embedded topology only, when its single worker (re)starts: the filesystem broker
    forgets a message its worker took, so a worker killed mid-task would leave its plans
    unfinished. (Redis redelivers such messages itself.) Computing a plan twice is harmless.
    """
    from webapp.runs.tasks import plan_compute

    ids = list(Plan.objects.filter(status__in=UNFINISHED, run__state=RunState.PLANNING)
               .values_list("pk", flat=True))
    for pk in ids:
        plan_compute.delay(pk)
    return ids


# --------------------------------------------------------------------------- what runs produce


def timeline_events_store(*, run: Run, records: Iterable[TimelineRecord]) -> list[TimelineEvent]:
    """Store timeline events in bulk; returns the rows."""
    return TimelineEvent.objects.bulk_create(
        (TimelineEvent(run=run, device=e.device, stage=e.stage, kind=e.kind,
                       microbatch=e.microbatch, version=e.version, start=e.start, end=e.end,
                       bytes=e.bytes) for e in records), batch_size=BULK_BATCH)


def fault_events_store(*, run: Run, records: Iterable[FaultRecord]) -> list[FaultEvent]:
    return FaultEvent.objects.bulk_create(
        (FaultEvent(run=run, at=f.at, kind=f.kind, device=f.device or "",
                    detail=dict(f.detail or {})) for f in records), batch_size=BULK_BATCH)


def metric_points_store(*, run: Run, points: Iterable[dict[str, Any]]) -> list[MetricPoint]:
    return MetricPoint.objects.bulk_create(
        (MetricPoint(run=run, at=p["at"], kind=p["kind"], device=p.get("device") or "",
                     value=p["value"]) for p in points), batch_size=BULK_BATCH)


def _parsed(items: Sequence[Any], field: str, parse: Any, run: Run) -> list[Any]:
    out = []
    for i, raw in enumerate(items):
        try:
            record = parse(raw, file=field, path=f"{field}[{i}]")
        except FormatError as exc:
            raise InvalidInput(exc.field, exc.reason) from None
        if record.run != run.pk:
            raise InvalidInput(f"{field}[{i}].run", f"is {record.run} but the events are "
                                                    f"posted to run {run.pk}")
        for name, limit in COLUMN_LIMITS.items():
            if getattr(record, name, 0) > limit:
                raise InvalidInput(f"{field}[{i}].{name}", f"must be at most {limit}")
        out.append(record)
    return out


@transaction.atomic
def run_events_store(*, run: Run, device: Device, timeline: Sequence[Any] = (),
                     faults: Sequence[Any] = (), metrics: Sequence[dict[str, Any]] = ()
                     ) -> dict[str, int]:
    """Store a batch an agent reports for a run it belongs to: timeline events (its own),
    fault events and metric points. Validated whole before anything is stored."""
    if run.state not in ACTIVE:
        raise Conflict(f"run {run.pk} is {run.state}: it takes events only while "
                       f"{', '.join(sorted(ACTIVE))}", state=run.state, action="report events")
    records = _parsed(timeline, "timeline", parse_event, run)
    for i, record in enumerate(records):
        if record.device != device.uid:
            raise InvalidInput(f"timeline[{i}].device", f"is {record.device!r} but this device "
                                                        f"is {device.uid!r}")
    faults_parsed = _parsed(faults, "faults", parse_fault, run)
    stored_timeline = timeline_events_store(run=run, records=records)
    stored_faults = fault_events_store(run=run, records=faults_parsed)
    stored_metrics = metric_points_store(run=run, points=metrics)
    # the run page's deltas, in the snapshot's own shapes
    if stored_timeline:
        events.run_event_send(run.pk, events.event_timeline(
            [selectors.timeline_json(r) for r in stored_timeline]))
    if stored_faults:
        events.run_event_send(run.pk, events.event_faults(
            [selectors.fault_json(r) for r in stored_faults]))
    if stored_metrics:
        events.run_event_send(run.pk, events.event_metrics(
            [selectors.metric_json(r) for r in stored_metrics]))
    if stored_timeline:
        events.run_event_send(run.pk, events.event_idle(run))
    return {"timeline": len(stored_timeline), "faults": len(stored_faults),
            "metrics": len(stored_metrics)}
