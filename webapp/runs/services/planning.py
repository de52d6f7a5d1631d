"""Planning a run: one Celery task per plan claims it, plans with the orchestrator, simulates the
result and stores it; the run is planned (or failed) once its last plan is computed."""

from __future__ import annotations

import logging
import math
import threading
import time
from datetime import timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import DatabaseError, InterfaceError, connection, transaction
from django.utils import timezone

from orchestrator.cost import build_cost_model, memory_shortfall
from orchestrator.errors import FormatError, PlanningError
from orchestrator.partition import LEARNED, run_planner
from orchestrator.protocol import ProtocolError
from orchestrator.simulator import simulate
from webapp.runs import events
from webapp.runs.models import (
    Plan,
    Run,
)
from webapp.runs.selectors import run_planning_inputs
from webapp.runs.services.control import (
    lock_run,
    move_run,
)
from webapp.runs.services.deployment import spec_fields
from webapp.runs.services.pipelearn import pipelearn_plan_figures
from webapp.runs.services.split import split_plan_figures
from webapp.runs.states import RunState

log = logging.getLogger(__name__)


UNFINISHED = (Plan.Status.PENDING, Plan.Status.RUNNING)


# a learned planner's training curve is saved (and sent) at most this often while it trains
TRAINING_SAVE_EVERY_S = 1.0


def _interruption(plan: Plan, reason: str) -> dict[str, Any]:
    """What the run page says of an attempt whose worker stopped mid-plan."""
    return {"worker": plan.worker, "attempt": plan.attempts,
            "at": timezone.now().isoformat(timespec="seconds"), "reason": reason}


def _interrupted(plan: Plan, reason: str) -> None:
    """Record that ``plan``'s current attempt was cut short (once per attempt)."""
    if not any(i.get("attempt") == plan.attempts for i in plan.interruptions):
        plan.interruptions = [*plan.interruptions, _interruption(plan, reason)]


def _plan_claim(plan_id: int, worker: str) -> Plan | None:
    """Mark a plan running (again, if a worker died on it: the run page says so), in a
    transaction of its own; None if there is nothing to do."""
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
        if plan.status == Plan.Status.RUNNING:  # its task came back: the worker stopped
            _interrupted(plan, "the worker stopped mid-plan; its task was delivered again")
        plan.status = Plan.Status.RUNNING
        plan.attempts += 1
        plan.worker = worker
        plan.started_at = plan.heartbeat_at = timezone.now()
        plan.training = {}  # a new attempt starts a new curve
        plan.save(update_fields=["status", "attempts", "worker", "started_at", "heartbeat_at",
                                 "training", "interruptions"])
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
        # until a candidate fits there is no reward signal: the mean is null
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
        if plan.run.kind == "split":
            return Plan.Status.DONE, split_plan_figures(plan)
        if plan.run.kind == "pipelearn":
            return Plan.Status.DONE, pipelearn_plan_figures(plan)
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
        move_run(run, RunState.PLANNED, action="finish planning", error="")
        return
    reasons = "; ".join(f"{p.algorithm}: {p.error}" for p in plans)
    move_run(run, RunState.FAILED, action="fail planning",
                error=f"no plan could be used. {reasons}")


def _plan_store(plan: Plan, status: str, fields: dict[str, Any]) -> None:
    """Store a computed plan, tell the run's group, and settle the run: one short transaction
    with the run locked (two plans finishing at once settle it once)."""
    with transaction.atomic():
        run = lock_run(plan.run)
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
    with _Heartbeat(plan, every_s=settings.PLAN_HEARTBEAT_S):
        status, fields = _plan_outcome(plan, progress)
    if progress is not None:
        fields["training"] = progress.curve()  # the whole curve, whatever the outcome
    _plan_store(plan, status, fields)
    return {"plan": plan_id, "status": status}


class _Heartbeat:
    """While a worker computes a plan, a thread marks the plan's row alive every ``every_s``
    (``heartbeat_at``), as long as this attempt holds it: a plan whose mark goes stale lost its
    worker (:func:`plans_watch`). The thread's database connection is its own, closed at the
    end."""

    def __init__(self, plan: Plan, *, every_s: float) -> None:
        self.plan, self.every_s = plan, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True,
                                        name=f"plan-{plan.pk}-heartbeat")

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        try:
            while not self._stop.wait(self.every_s):
                try:
                    Plan.objects.filter(pk=self.plan.pk, status=Plan.Status.RUNNING,
                                        attempts=self.plan.attempts
                                        ).update(heartbeat_at=timezone.now())
                except (DatabaseError, InterfaceError):
                    log.warning("plan %s: could not mark it alive", self.plan.pk, exc_info=True)
        finally:
            connection.close()


def plans_watch(*, silent_s: float) -> list[int]:
    """Plans of planning runs whose worker has given no sign of life for ``silent_s`` (killed,
    or its machine gone): say so on the plan (the run page shows it), and queue it again for
    any worker. The broker would give the task back too, but only after its visibility
    timeout (Redis) or when a worker restarts (the embedded broker). Returns their ids."""
    from webapp.runs.tasks import plan_compute  # the task module imports these services

    cutoff = timezone.now() - timedelta(seconds=silent_s)
    requeued = []
    for pk in Plan.objects.filter(status=Plan.Status.RUNNING, heartbeat_at__lt=cutoff,
                                  run__state=RunState.PLANNING).values_list("pk", flat=True):
        with transaction.atomic():
            plan = Plan.objects.select_for_update().filter(
                pk=pk, status=Plan.Status.RUNNING, heartbeat_at__lt=cutoff).first()
            if plan is None:
                continue
            log.warning("plan %s (%s): worker %s silent for %g s; queued again", plan.pk,
                        plan.algorithm, plan.worker, silent_s)
            _interrupted(plan, f"the worker gave no sign of life for {silent_s:g} s")
            plan.status, plan.worker, plan.heartbeat_at = Plan.Status.PENDING, "", None
            plan.save(update_fields=["status", "worker", "heartbeat_at", "interruptions"])
            events.run_event_send(plan.run_id, events.event_plan(plan))
            transaction.on_commit(partial(plan_compute.delay, plan.pk))
        requeued.append(pk)
    return requeued


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
