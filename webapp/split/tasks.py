"""Celery tasks of split learning: thin, taking ids. A schedule is acknowledged only once
computed (``acks_late``) and given back to the broker if the worker process dies
(``reject_on_worker_lost``); database hiccups are retried with backoff."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.signals import worker_ready
from django.db import InterfaceError, OperationalError

from webapp.split import services


@shared_task(acks_late=True, reject_on_worker_lost=True,
             autoretry_for=(OperationalError, InterfaceError), retry_backoff=True,
             retry_backoff_max=60, max_retries=8)
def split_schedule_compute(schedule_id: int) -> dict[str, Any]:
    """Compute schedule ``schedule_id`` (:func:`webapp.split.services.split_schedule_compute`)."""
    return services.split_schedule_compute(schedule_id=schedule_id)


@worker_ready.connect
def _resume_split_schedules(sender: Any = None, **kwargs: object) -> None:
    """The filesystem broker (embedded topology) forgets the messages a killed worker had
    taken: queue unfinished schedules again when a worker starts. Redis redelivers them."""
    app = getattr(sender, "app", None)
    if app is not None and str(app.conf.broker_url).startswith("filesystem"):
        services.split_schedules_requeue_unfinished()
