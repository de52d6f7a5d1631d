"""Celery tasks of runs: thin, taking ids. Planning is acknowledged only once done
(``acks_late``) and given back to the broker if the worker process dies
(``reject_on_worker_lost``), so a worker killed mid-task loses no plan; database hiccups are
retried with backoff."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError

from webapp.runs import recovery, services
from webapp.runs.recovery.replan import recoveries_fail_stalled
from webapp.runs.services import split_rounds


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True,
             autoretry_for=(OperationalError, InterfaceError), retry_backoff=True,
             retry_backoff_max=60, max_retries=8)
def plan_compute(self: Any, plan_id: int) -> dict[str, Any]:
    """Compute plan ``plan_id`` (see :func:`webapp.runs.services.plan_compute`)."""
    return services.plan_compute(plan_id=plan_id, worker=self.request.hostname or "")


@shared_task
def plans_watch() -> list[int]:
    """Beat: plans whose worker went silent are queued again, and their run page says so."""
    return services.plans_watch(silent_s=settings.PLAN_WORKER_SILENT_S)


@shared_task
def runs_fail_stalled() -> list[int]:
    """Beat: runs whose deployment, or whose recovery's halts, got no answer in time fail,
    naming the silent devices."""
    return [*services.runs_fail_stalled(older_than_s=settings.DEPLOY_TIMEOUT_S),
            *recoveries_fail_stalled(older_than_s=settings.HALT_TIMEOUT_S)]


@shared_task(autoretry_for=(OperationalError, InterfaceError), retry_backoff=True,
             max_retries=5)
def probe_verdict(run_id: int, generation: int | None = None) -> list[str]:
    """A probe's countdown ran out: the devices that did not answer are lost (see
    :func:`webapp.runs.recovery.probe_verdict`)."""
    return recovery.probe_verdict(run_id, generation)


@shared_task(autoretry_for=(OperationalError, InterfaceError), retry_backoff=True,
             max_retries=5)
def split_round_evaluate(run_id: int, applied: int) -> float | None:
    """A split run's round ended at ``applied``: its aggregated model's held-out accuracy
    (see :func:`webapp.runs.services.split_rounds.split_round_evaluate`)."""
    return split_rounds.split_round_evaluate(run_id=run_id, applied=applied)
