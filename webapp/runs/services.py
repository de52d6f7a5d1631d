"""Writes on runs: creating them, the state machine's transitions, planning (queued as one
Celery task per plan) and storing what a run produces in bulk."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db import DatabaseError, InterfaceError, connection, models, transaction
from django.utils import timezone

from orchestrator.cost import CostModel, build_cost_model, memory_shortfall
from orchestrator.errors import FormatError, PlanningError
from orchestrator.events import FaultEvent as FaultRecord
from orchestrator.events import TimelineEvent as TimelineRecord
from orchestrator.events import parse_event, parse_fault
from orchestrator.formats import SCHEDULES, parse_plan, synchronous
from orchestrator.formats import Plan as PlanDocument
from orchestrator.partition import LEARNED, PLANNERS, run_planner
from orchestrator.protocol import MAX_REFUSALS, MetricSample, ProtocolError, StageSpec
from orchestrator.simulator import schedule_inputs, simulate
from webapp.common.exceptions import Conflict, InvalidInput, distinct_choices
from webapp.devices.commands import command_build, device_command_send
from webapp.devices.models import Device, LayerProfile, ModelSpec
from webapp.devices.selectors import planning_costs
from webapp.devices.services import data_peers
from webapp.runs import events, selectors
from webapp.runs.models import (
    AGGREGATE_EVERY_MAX,
    LR_MAX,
    MOMENTUM_MAX,
    RECOVERY_POLICIES,
    RUN_DEFAULTS,
    FaultEvent,
    Generation,
    MetricPoint,
    Plan,
    Run,
    RunDevice,
    TimelineEvent,
)
from webapp.runs.selectors import plan_best, run_planning_inputs
from webapp.runs.states import ACTIVE, RunState, check_transition

log = logging.getLogger(__name__)

BULK_BATCH = 2000
# what the event tables' integer columns hold
COLUMN_LIMITS = {"stage": 2**31 - 1, "microbatch": 2**31 - 1, "version": 2**31 - 1,
                 "bytes": 2**63 - 1}
UNFINISHED = (Plan.Status.PENDING, Plan.Status.RUNNING)
ACTIVE_DEVICE = (Device.Status.ONLINE, Device.Status.BUSY)
# a learned planner's training curve is saved (and sent) at most this often while it trains
TRAINING_SAVE_EVERY_S = 1.0


# --------------------------------------------------------------------------- creation


def _check_algorithms(algorithms: Sequence[str], field: str = "algorithms") -> list[str]:
    return distinct_choices(algorithms, PLANNERS, field=field, what="algorithm")


@transaction.atomic
def run_create(*, name: str, model_spec: ModelSpec, devices: Sequence[Device],
               algorithms: Sequence[str], schedule: str = RUN_DEFAULTS["schedule"],
               microbatches: int = RUN_DEFAULTS["microbatches"],
               batches: int = RUN_DEFAULTS["batches"], epochs: int = RUN_DEFAULTS["epochs"],
               chain_every: int = RUN_DEFAULTS["chain_every"],
               global_every: int = RUN_DEFAULTS["global_every"],
               repartition_after: int = RUN_DEFAULTS["repartition_after"],
               repartition_every: int = RUN_DEFAULTS["repartition_every"],
               recovery_policy: str = RUN_DEFAULTS["recovery_policy"],
               lr: float = RUN_DEFAULTS["lr"], momentum: float = RUN_DEFAULTS["momentum"],
               vertical_sync: bool = RUN_DEFAULTS["vertical_sync"],
               aggregate_every: int = RUN_DEFAULTS["aggregate_every"],
               created_by: AbstractBaseUser | None = None) -> Run:
    """A draft run of ``model_spec`` on ``devices`` (in pipeline order); what is left out
    takes the Run model's default (RUN_DEFAULTS). ``chain_every``, ``global_every``
    (replication) and ``repartition_every`` count batches, 0 turning each off;
    ``repartition_after``, ``lr`` and ``momentum`` (every stage's SGD), ``vertical_sync`` and
    ``aggregate_every`` (asynchronous 1F1B's: kept but ignored under gpipe and 1f1b-sync, and
    0 there) are checked here
    too since services are called without the API's validation (the run form, benches)."""
    if not devices:
        raise InvalidInput("devices", "must name at least one device")
    for i, device in enumerate(devices):
        if device.status == Device.Status.RETIRED:
            raise InvalidInput(f"devices[{i}]", f"device {device.pk} ({device.uid}) is retired")
        if device in devices[:i]:
            raise InvalidInput(f"devices[{i}]", f"repeats device {device.pk}")
    if schedule not in SCHEDULES:
        raise InvalidInput("schedule", f"must be one of {', '.join(SCHEDULES)}")
    fault_settings = {"chain_every": chain_every, "global_every": global_every,
                      "repartition_after": repartition_after,
                      "repartition_every": repartition_every}
    for field, value in fault_settings.items():
        least = 1 if field == "repartition_after" else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InvalidInput(field, f"must be an integer of at least {least} (batches)")
    if recovery_policy not in RECOVERY_POLICIES:
        raise InvalidInput("recovery_policy", f"must be {' or '.join(RECOVERY_POLICIES)}")
    if not _finite_number(lr) or not 0 < lr <= LR_MAX:
        raise InvalidInput("lr", f"must be a number above 0 and at most {LR_MAX:g}")
    if not _finite_number(momentum) or not 0 <= momentum <= MOMENTUM_MAX:
        raise InvalidInput("momentum", f"must be a number from 0 to {MOMENTUM_MAX}")
    if not isinstance(vertical_sync, bool):
        raise InvalidInput("vertical_sync", "must be true or false")
    if (isinstance(aggregate_every, bool) or not isinstance(aggregate_every, int)
            or not 0 <= aggregate_every <= AGGREGATE_EVERY_MAX):
        raise InvalidInput("aggregate_every", f"must be an integer from 0 to "
                                              f"{AGGREGATE_EVERY_MAX} (in-flight windows)")
    if aggregate_every and synchronous(schedule):
        raise InvalidInput("aggregate_every", f"must be 0 under {schedule}: weight aggregation "
                                              "is for the stale weight versions of "
                                              "asynchronous 1f1b")
    run = Run.objects.create(name=name, model_spec=model_spec,
                             algorithms=_check_algorithms(algorithms), schedule=schedule,
                             microbatches=microbatches, batches=batches, epochs=epochs,
                             created_by=created_by, recovery_policy=recovery_policy,
                             lr=float(lr), momentum=float(momentum),
                             vertical_sync=vertical_sync, aggregate_every=aggregate_every,
                             **fault_settings)
    RunDevice.objects.bulk_create(RunDevice(run=run, device=d, position=k)
                                  for k, d in enumerate(devices))
    events.run_event_send(run.pk, events.event_run(run))
    return run


def _finite_number(value: object) -> bool:
    """Is ``value`` an int or a float (not a bool), and finite? (The run form's parser of
    typed numbers is webapp.dashboard.services._number.)"""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


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
    profiles = {p.device_id: p for p in LayerProfile.objects.filter(
        model_spec=locked.model_spec, device__run_devices__run=locked)}
    rows = list(RunDevice.objects.filter(run=locked).select_related("device"))
    for rd in rows:
        rd.overhead_s, rd.message_s, rd.pass_overhead_s = planning_costs(  # these plans'
            device=rd.device, profile=profiles.get(rd.device_id))
    RunDevice.objects.bulk_update(rows, ["overhead_s", "message_s", "pass_overhead_s"])
    Plan.objects.filter(run=locked).delete()
    plans = Plan.objects.bulk_create(Plan(run=locked, algorithm=a) for a in chosen)
    _transition(locked, RunState.PLANNING, action="plan", algorithms=chosen, error="")
    from webapp.runs.tasks import plan_compute  # the task module imports these services

    for plan in plans:
        transaction.on_commit(partial(plan_compute.delay, plan.pk))
    return locked


@transaction.atomic
def run_start(*, run: Run, plan: Plan | None = None) -> Run:
    """Start a planned run with ``plan`` (default: the best), or resume a paused run. Starting
    deploys each stage of the plan to its device; the run runs once every agent is ready."""
    locked = _locked(run)
    if locked.state == RunState.PAUSED:
        if plan is not None and plan.pk != locked.chosen_plan_id:
            raise InvalidInput("plan", "a paused run resumes with its plan "
                                       f"({locked.chosen_plan_id}); stop it to use another")
        _stage_command_all(locked, "resume")
        _control_event(locked, "run_started", detail={"resumed": True})
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
    started = _transition(locked, RunState.STARTING, action="start", chosen_plan=plan,
                          started_at=timezone.now(), error="")
    return _deploy(started, plan)


@transaction.atomic
def run_pause(*, run: Run) -> Run:
    """Pause a running run: every stage stops before its next pass. A recovering run is paused
    when its recovery ends (webapp.runs.recovery.recovery_ready): until then its devices are
    halting or deploying, not training."""
    locked = _locked(run)
    if locked.state == RunState.RECOVERING:
        if not (locked.recovery or {}).get("paused"):
            locked.recovery = {**locked.recovery, "paused": True}
            locked.save(update_fields=["recovery"])
            _control_event(locked, "run_paused", detail={"after_recovery": True})
        return locked
    locked = _transition(locked, RunState.PAUSED, action="pause")
    events.run_event_send(locked.pk, events.event_idle(locked))
    _stage_command_all(locked, "pause")
    _control_event(locked, "run_paused")
    return locked


@transaction.atomic
def run_stop(*, run: Run) -> Run:
    locked = _transition(_locked(run), RunState.CANCELLED, action="stop",
                         finished_at=timezone.now())
    _stage_command_all(locked, "stop")
    return locked


# --------------------------------------------------------------------------- running a plan


START_DELAY_S = 0.5  # between the last agent's ready and the common start, for the message


def _run_clock(run: Run) -> float:
    """Seconds since the run started (its timeline's clock); 0 before it starts, and while a
    run that lost a device as it started recovers (its training has not begun)."""
    if run.started_at is None or run.state == RunState.STARTING or (
            run.state == RunState.RECOVERING and (run.recovery or {}).get("from_start")):
        return 0.0
    return max(0.0, (timezone.now() - run.started_at).total_seconds())


def _control_event(run: Run, kind: str, *, device: str = "",
                   detail: dict[str, Any] | None = None) -> None:
    rows = fault_events_store(run=run, records=[FaultRecord(
        run=run.pk, at=_run_clock(run), kind=kind, device=device or None, detail=detail or {})])
    events.run_event_send(run.pk, events.event_faults([selectors.fault_json(r) for r in rows]))


def _staged(run: Run) -> list[RunDevice]:
    return list(RunDevice.objects.filter(run=run, stage__isnull=False)
                .select_related("device").order_by("stage", "position"))


def _stage_command_all(run: Run, name: str, **fields: Any) -> None:
    for rd in _staged(run):
        device_command_send(uid=rd.device.uid, command=command_build(name, run=run.pk, **fields))


def stage_specs(*, run: Run, plan: Plan) -> dict[str, StageSpec]:
    """What each device of ``plan`` runs, by device uid."""
    profile, devices = run_planning_inputs(run=run)
    cm = build_cost_model(profile, devices)
    document = parse_plan(plan.document, profile=profile, devices=devices,
                          file=f"plan {plan.pk}")
    return spec_fields(run=run, document=document, cm=cm)


def spec_fields(*, run: Run, document: PlanDocument, cm: CostModel) -> dict[str, StageSpec]:
    """The StageSpecs (by device uid) of a plan document of ``run`` under ``cm``: generation
    0's; a recovery replaces its generation and resume point. The schedule's inputs (each
    replica's pace, the depths, the lanes) are the simulator's (``schedule_inputs``), so the
    agents run the action lists the run's prediction was simulated with."""
    spec = run.model_spec
    inputs = schedule_inputs(cm, document)
    shared: dict[str, Any] = {
        "run": run.pk, "model": spec.model, "dataset": spec.dataset,
        "batch_size": spec.batch_size, "schedule": run.schedule,
        "stage_devices": inputs.stage_devices, "stage_times_s": inputs.stage_times_s,
        "microbatches": run.total_microbatches,
        "flush_every": run.microbatches,
        "inflight": None if document.inflight is None else inputs.inflight,
        "lag": None if document.lag is None else inputs.lag,
        "replica_inflight": tuple(sorted(inputs.replica_inflight.items())),
        "two_lanes": inputs.two_lanes,
        "lr": run.lr, "momentum": run.momentum, "seed": run.pk,
        # 1F1B's answers to stale weights; GPipe has none (docs/architecture.md)
        "vertical_sync": run.vertical_sync and not synchronous(run.schedule),
        "aggregate_every": run.aggregate_every,
        # replication points, in micro-batches applied (docs/architecture.md)
        "chain_every": run.chain_every * run.microbatches,
        "global_every": run.global_every * run.microbatches,
    }
    return {uid: StageSpec(**shared, device=uid, stage=k, layers=(stage.first, stage.last),
                           lane_shares=inputs.lane_shares.get(uid))
            for k, stage in enumerate(document.stages) for uid in stage.devices}


def _deploy(run: Run, plan: Plan) -> Run:
    """Send every device of ``plan`` its stage; a device that cannot take it fails the run."""
    try:
        specs = stage_specs(run=run, plan=plan)
    except (PlanningError, FormatError) as exc:
        return _fail(run, f"the {plan.algorithm} plan cannot be deployed: {exc}")
    run_devices = {rd.device.uid: rd for rd in RunDevice.objects.filter(run=run)
                   .select_related("device")}
    absent = [uid for uid in specs if uid not in run_devices]
    if absent:
        return _fail(run, f"the plan uses device {absent[0]}, which is not in the run")
    for uid in specs:
        d = run_devices[uid].device
        if d.status not in ACTIVE_DEVICE or not d.data_address or not d.data_key:
            why = f"is {d.status}" if d.status not in ACTIVE_DEVICE else "has no agent connected"
            return _fail(run, f"device {d.name!r} ({d.uid}) {why}: start its agent "
                              "(python -m agent run) and start the run again", device=uid)
    # every device of the run, not only the plan's: a recovering stage may fetch weights
    # from any of them, and each admits only the keys it was given
    peers, keys = data_peers([rd.device for rd in run_devices.values()])
    for uid, rd in run_devices.items():
        spec = specs.get(uid)
        rd.stage = None if spec is None else spec.stage
        rd.stage_state = (RunDevice.StageState.IDLE if spec is None
                          else RunDevice.StageState.DEPLOYING)
        rd.stage_error = ""
        rd.save(update_fields=["stage", "stage_state", "stage_error"])
        if spec is not None:
            device_command_send(uid=uid, command=command_build(
                "deploy", run=run.pk, spec=spec.to_json(), peers=peers, keys=keys))
    return run


def _fail(run: Run, error: str, *, device: str = "") -> Run:
    """Fail a run that is starting or running: tell its agents to stop, say why."""
    failed = _transition(run, RunState.FAILED, action="fail", error=error,
                         finished_at=timezone.now())
    events.run_event_send(failed.pk, events.event_idle(failed))
    _control_event(failed, "run_failed", device=device, detail={"error": error})
    _stage_command_all(failed, "stop")
    return failed


def _stage_of(run: Run, device: Device) -> RunDevice:
    rd = RunDevice.objects.select_for_update().filter(run=run, device=device).first()
    if rd is None or rd.stage is None:
        raise InvalidInput("run", f"device {device.uid} holds no stage of run {run.pk}")
    return rd


@transaction.atomic
def run_stage_ready(*, run: Run, device: Device, generation: int | None = None) -> Run:
    """An agent built its stage. When every stage is ready, all start at one time."""
    locked = _locked(run)
    rd = _stage_of(locked, device)
    recovering = locked.state == RunState.RECOVERING
    if recovering and generation != locked.recovery.get("generation"):
        return locked  # ready for a generation a further loss has replaced
    if locked.state != RunState.STARTING and not recovering:
        return locked  # a late answer to a run that failed or was stopped meanwhile
    if rd.stage_state != RunDevice.StageState.DEPLOYING:
        return locked
    rd.stage_state = RunDevice.StageState.READY
    rd.save(update_fields=["stage_state"])
    staged = _staged(locked)
    if any(s.stage_state != RunDevice.StageState.READY for s in staged):
        return locked
    if recovering:
        from webapp.runs.recovery import recovery_ready  # it builds on these services

        return recovery_ready(locked)
    started_at = time.time() + START_DELAY_S
    RunDevice.objects.filter(pk__in=[s.pk for s in staged]).update(
        stage_state=RunDevice.StageState.RUNNING)
    _stage_command_all(locked, "start", started_at=started_at)
    plan = locked.chosen_plan
    running = _transition(locked, RunState.RUNNING, action="run",
                          started_at=datetime.fromtimestamp(started_at, tz=UTC),
                          generation=0, recovery={
                              "plan": None if plan is None else plan.document, "since_s": 0.0})
    if plan is not None:
        Generation.objects.update_or_create(run=running, number=0, defaults={
            "cause": Generation.Cause.START, "planner": plan.algorithm, "plan": plan.document,
            "predicted_throughput_sps": plan.throughput_sps, "resumed_at": 0.0})
    _control_event(running, "run_started")
    return running


def _stale(run: Run, generation: int | None) -> bool:
    """A report of a generation a recovery has replaced (or is replacing)."""
    if generation is None:
        return False
    if run.state == RunState.RECOVERING:
        return generation != run.recovery.get("generation")
    return generation != run.generation


@transaction.atomic
def run_stage_failed(*, run: Run, device: Device, error: str,
                     generation: int | None = None) -> Run:
    """An agent could not deploy or run its stage: the run fails with its reason."""
    locked = _locked(run)
    if _stale(locked, generation):
        return locked
    rd = _stage_of(locked, device)
    rd.stage_state = RunDevice.StageState.FAILED
    rd.stage_error = error
    rd.save(update_fields=["stage_state", "stage_error"])
    if locked.state not in ACTIVE:
        return locked
    return _fail(locked, f"device {device.name!r} ({device.uid}), stage {rd.stage}: {error}",
                 device=device.uid)


@transaction.atomic
def run_stage_done(*, run: Run, device: Device, generation: int | None = None) -> Run:
    """An agent ran its stage to the end; the run finishes with its last stage."""
    locked = _locked(run)
    if _stale(locked, generation):
        return locked
    rd = _stage_of(locked, device)
    rd.stage_state = RunDevice.StageState.DONE
    rd.save(update_fields=["stage_state"])
    events.run_event_send(locked.pk, events.event_idle(locked))  # the throttle's last word
    if locked.state not in (RunState.RUNNING, RunState.PAUSED):
        return locked
    if any(s.stage_state != RunDevice.StageState.DONE for s in _staged(locked)):
        return locked
    _control_event(locked, "run_finished")
    return _transition(locked, RunState.FINISHED, action="finish", finished_at=timezone.now())


def runs_fail_stalled(*, older_than_s: float) -> list[int]:
    """Fail the runs still starting ``older_than_s`` after their deployment was sent, naming the
    devices that did not answer (their agent stopped or lost its connection meanwhile)."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    failed = []
    for run_id in Run.objects.filter(state=RunState.STARTING, started_at__lt=cutoff
                                     ).values_list("pk", flat=True):
        with transaction.atomic():
            locked = Run.objects.select_for_update().get(pk=run_id)
            if locked.state != RunState.STARTING:
                continue
            silent = [rd.device for rd in _staged(locked)
                      if rd.stage_state == RunDevice.StageState.DEPLOYING]
            names = ", ".join(f"{d.name!r} ({d.uid})" for d in silent) or "no device"
            _fail(locked, f"{names} did not answer the deployment within {older_than_s:.0f} s: "
                          "is its agent running?")
            failed.append(run_id)
    return failed


def _plan_claim(plan_id: int, worker: str) -> Plan | None:
    """Mark a plan running (again, if a worker died on it), in a transaction of its own; None
    if there is nothing to do."""
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
        plan.training = {}  # a new attempt starts a new curve
        plan.save(update_fields=["status", "attempts", "worker", "started_at", "training"])
        events.run_event_send(plan.run_id, events.event_plan(plan))
        return plan


def _reward_json(reward: float) -> float | None:
    """A reward as the curve stores it: 6 significant digits; null when not finite."""
    return float(f"{reward:.6g}") if math.isfinite(reward) else None


class TrainingProgress:
    """A learned planner's ``on_episode``: collects its training curve and, after the first
    episode and then at most every :data:`TRAINING_SAVE_EVERY_S`, saves it on the claimed plan's
    row and sends a ``plan`` event. Planning runs outside any transaction, so each save (one
    UPDATE) commits at once and a snapshot sees it; a save that fails is only logged."""

    def __init__(self, plan: Plan, *, every_s: float | None = None) -> None:
        self.plan = plan
        self.every_s = TRAINING_SAVE_EVERY_S if every_s is None else every_s
        self.episodes: list[int] = []
        self.best_reward: list[float | None] = []
        self.mean_reward: list[float | None] = []
        self._saved_at = -math.inf

    def curve(self) -> dict[str, list[Any]]:
        """The curve so far as the plan stores it (``{}`` before the first episode)."""
        if not self.episodes:
            return {}
        return {"episodes": list(self.episodes), "best_reward": list(self.best_reward),
                "mean_reward": list(self.mean_reward)}

    def __call__(self, episode: int, best_reward: float, mean_reward: float) -> None:
        best = _reward_json(best_reward)
        self.episodes.append(episode + 1)
        self.best_reward.append(best)
        # until a candidate fits, the mean is a placeholder (no reward signal yet)
        self.mean_reward.append(None if best is None else _reward_json(mean_reward))
        now = time.monotonic()
        if now - self._saved_at >= self.every_s:
            self._saved_at = now
            self.save()

    def save(self) -> None:
        plan = self.plan
        plan.training = self.curve()
        try:  # only while this attempt still holds the plan (not after it was planned again)
            updated = Plan.objects.filter(pk=plan.pk, status=Plan.Status.RUNNING,
                                          attempts=plan.attempts).update(training=plan.training)
        except (DatabaseError, InterfaceError):
            log.warning("could not save the training curve of plan %s", plan.pk, exc_info=True)
            return
        if updated:
            events.run_event_send(plan.run_id, events.event_plan(plan))


def _planner_options(plan: Plan, progress: TrainingProgress | None) -> dict[str, Any]:
    """What the plan's planner is called with: the run's schedule and micro-batches, and for a
    learned planner the progress callback and the episodes configured."""
    run = plan.run
    options: dict[str, Any] = {"schedule": run.schedule, "microbatches": run.microbatches}
    if progress is not None:
        options["on_episode"] = progress
        if settings.PLANNING_LEARNED_EPISODES:
            options["episodes"] = settings.PLANNING_LEARNED_EPISODES
    return options


def _plan_figures(plan: Plan, progress: TrainingProgress | None = None) -> dict[str, Any]:
    """Plan ``plan``'s run with its algorithm and simulate a few batches of the result."""
    run = plan.run
    profile, devices = run_planning_inputs(run=run)
    cm = build_cost_model(profile, devices)
    computed = run_planner(cm, plan.algorithm, **_planner_options(plan, progress))
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
    # a plan that could not run fails here, so that starting the best plan never picks it:
    # its stages as the agents would get them, and its schedule run to the end
    try:
        spec_fields(run=run, document=computed, cm=cm)
        result = simulate(cm, computed, run=run.pk,
                          microbatches=run.microbatches * settings.PLANNING_SIMULATED_BATCHES)
    except (ProtocolError, RuntimeError) as exc:
        raise PlanningError(f"the {plan.algorithm} plan cannot run: {exc}") from None
    figures["simulated_throughput_sps"] = result.throughput_sps
    figures["simulation"] = result.summary_json()
    return figures


def _plan_outcome(plan: Plan, progress: TrainingProgress | None) -> tuple[str, dict[str, Any]]:
    """The plan's status and the fields to store: its figures, or why it failed. A database
    error propagates (the task retries); a crashing planner fails its plan."""
    try:
        return Plan.Status.DONE, _plan_figures(plan, progress)
    except (PlanningError, FormatError, ValueError) as exc:
        return Plan.Status.FAILED, {"error": str(exc)}
    except (DatabaseError, InterfaceError):
        raise  # the task retries
    except Exception as exc:  # a bug in a planner must not leave the run planning forever
        log.exception("planning plan %s (%s) crashed", plan.pk, plan.algorithm)
        return Plan.Status.FAILED, {"error": f"the planner crashed: {type(exc).__name__}: {exc}"}


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


def _plan_store(plan: Plan, status: str, fields: dict[str, Any]) -> None:
    """Store a computed plan, tell the run's group, and settle the run: one short transaction
    with the run locked (two plans finishing at once settle it once)."""
    with transaction.atomic():
        run = _locked(plan.run)
        updated = Plan.objects.filter(pk=plan.pk).update(
            status=status, finished_at=timezone.now(), **fields)
        if updated:
            events.run_event_send(run.pk, events.event_plan(Plan.objects.get(pk=plan.pk)))
        _run_settle(run)


def plan_compute(*, plan_id: int, worker: str = "") -> dict[str, Any]:
    """Compute one plan (the body of the Celery task): claim it, plan with the orchestrator and
    simulate, then store it and settle the run when it was the last.

    Only the claim and the store are transactions, each short: planning (a minute for a
    learned planner) holds no lock, so agents' events and other plans are written meanwhile,
    and a learned planner's training curve is committed as it learns. Idempotent: a plan
    already computed is left alone, and one whose worker died is computed again."""
    plan = _plan_claim(plan_id, worker)
    if plan is None:
        return {"plan": plan_id, "status": "skipped"}
    progress = TrainingProgress(plan) if plan.algorithm in LEARNED else None
    status, fields = _plan_outcome(plan, progress)
    if progress is not None:
        fields["training"] = progress.curve()  # the whole curve, whatever the outcome
    _plan_store(plan, status, fields)
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


TIMELINE_COLUMNS = ("run_id", "device", "stage", "kind", "microbatch", "version", "start", "end",
                    "bytes")
METRIC_COLUMNS = ("run_id", "at", "kind", "device", "value")


def timeline_events_store(*, run: Run, records: Iterable[TimelineRecord]
                          ) -> list[TimelineRecord]:
    """Store timeline events in bulk; returns the records stored.

    One ``executemany`` per BULK_BATCH rows: the ORM's ``bulk_create`` built a model and
    compiled its values per event (about 100 us each), which took a third of a core of the web
    process, on the machine the agents train on, while a busy run streamed its events."""
    stored = list(records)
    _insert_rows(TimelineEvent, TIMELINE_COLUMNS, [
        (run.pk, e.device, e.stage, e.kind, e.microbatch, e.version, e.start, e.end, e.bytes)
        for e in stored])
    return stored


def _insert_rows(model: type[models.Model], columns: Sequence[str],
                 rows: Sequence[tuple[Any, ...]]) -> None:
    """INSERT ``rows`` (values of ``columns``, in order) into ``model``'s table."""
    quote = connection.ops.quote_name
    sql = (f"INSERT INTO {quote(model._meta.db_table)} "
           f"({', '.join(quote(c) for c in columns)}) "
           f"VALUES ({', '.join(['%s'] * len(columns))})")
    with connection.cursor() as cursor:
        for first in range(0, len(rows), BULK_BATCH):
            cursor.executemany(sql, rows[first:first + BULK_BATCH])


def fault_events_store(*, run: Run, records: Iterable[FaultRecord]) -> list[FaultEvent]:
    return FaultEvent.objects.bulk_create(
        (FaultEvent(run=run, at=f.at, kind=f.kind, device=f.device or "",
                    detail=dict(f.detail or {})) for f in records), batch_size=BULK_BATCH)


def metric_points_store(*, run: Run, points: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Store metric points in bulk, as timeline_events_store does (``bulk_create`` took a sixth
    of a core of the web process while a three-stage MLP pipeline reported its loss and
    accuracy per micro-batch); returns them as the run page reads them
    (selectors.metric_json)."""
    stored = [{"at": p["at"], "kind": p["kind"], "device": p.get("device") or "",
               "value": p["value"]} for p in points]
    _insert_rows(MetricPoint, METRIC_COLUMNS, [
        (run.pk, m["at"], m["kind"], m["device"], m["value"]) for m in stored])
    return stored


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


def _metric_points(metrics: Sequence[Any]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The metric points that read as MetricSample, and {field, reason} for each one that does
    not: one point the database cannot hold (a NaN loss; SQLite stores NaN as NULL) is refused
    alone, where it failed the whole batch, timeline events included."""
    kept, refused = [], []
    read = MetricSample.reader()
    for i, raw in enumerate(metrics):
        try:
            kept.append(read(raw, f"metrics[{i}]").to_json())
        except ProtocolError as exc:
            refused.append({"field": exc.field or f"metrics[{i}]", "reason": exc.reason})
    if refused:
        log.warning("refused %d metric point(s): %s: %s", len(refused), refused[0]["field"],
                    refused[0]["reason"])
    return kept, refused


def _idle_due(run_id: int) -> bool:
    """The idle breakdown reads the whole window back from the database: recompute it at most
    every LIVE_IDLE_INTERVAL_S per run, not for every agent's batch. The mark is in the cache
    (Redis when deployed), shared by every web process: cache.add sets it only if absent."""
    return bool(cache.add(f"idle-due:{run_id}", True, timeout=settings.LIVE_IDLE_INTERVAL_S))


@transaction.atomic
def run_events_store(*, run: Run, device: Device, timeline: Sequence[Any] = (),
                     faults: Sequence[Any] = (), metrics: Sequence[dict[str, Any]] = (),
                     stream: str | None = None, seq: int | None = None) -> dict[str, Any]:
    """Store a batch an agent reports for a run it belongs to: timeline events (its own),
    fault events and metric points. Validated whole before anything is stored (metric points
    one by one). A batch numbered ``seq`` in the agent's ``stream`` is stored once: the
    same batch again (sent anew after a reconnect) stores nothing."""
    if run.state not in ACTIVE:
        raise Conflict(f"run {run.pk} is {run.state}: it takes events only while "
                       f"{', '.join(sorted(ACTIVE))}", state=run.state, action="report events")
    member = None
    if stream is not None and seq is not None:
        member = RunDevice.objects.select_for_update().filter(run=run, device=device).first()
        if member is not None and member.events_stream == stream and seq <= member.events_seq:
            return {"timeline": 0, "faults": 0, "metrics": 0, "refused": []}
    records = _parsed(timeline, "timeline", parse_event, run)
    for i, record in enumerate(records):
        if record.device != device.uid:
            raise InvalidInput(f"timeline[{i}].device", f"is {record.device!r} but this device "
                                                        f"is {device.uid!r}")
    faults_parsed = _parsed(faults, "faults", parse_fault, run)
    # each store only when there is something to store: most batches carry no faults, and
    # an empty bulk_create still cost a twentieth of taking in a batch
    stored_timeline = timeline_events_store(run=run, records=records) if records else []
    stored_faults = (fault_events_store(run=run, records=faults_parsed) if faults_parsed
                     else [])
    points, refused = _metric_points(metrics)
    stored_metrics = metric_points_store(run=run, points=points) if points else []
    # the run page's deltas, in the snapshot's own shapes
    if stored_timeline:
        events.run_event_send(run.pk, events.event_timeline(
            [e.to_json() for e in stored_timeline]))
    if stored_faults:
        events.run_event_send(run.pk, events.event_faults(
            [selectors.fault_json(r) for r in stored_faults]))
    if stored_metrics:
        events.run_event_send(run.pk, events.event_metrics(
            stored_metrics))
    if stored_timeline and _idle_due(run.pk):
        events.run_event_send(run.pk, events.event_idle(run))
    if member is not None:
        member.events_stream, member.events_seq = stream or "", seq or 0
        member.save(update_fields=["events_stream", "events_seq"])
    return {"timeline": len(stored_timeline), "faults": len(stored_faults),
            "metrics": len(stored_metrics), "refused": refused[:MAX_REFUSALS]}
