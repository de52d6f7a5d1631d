"""The Celery task that computes a split-learning schedule, and the worker's restart hook."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.webapp.split.factories import SplitScheduleFactory
from webapp.split import services, tasks
from webapp.split.models import SplitSchedule
from webapp.split.tasks import split_schedule_compute

pytestmark = pytest.mark.django_db


def test_the_task_survives_a_killed_worker_by_design():
    # a message is acknowledged after the task, and given back if the worker process dies
    assert split_schedule_compute.acks_late is True
    assert split_schedule_compute.reject_on_worker_lost is True
    assert split_schedule_compute.max_retries >= 3
    assert split_schedule_compute.name == "webapp.split.tasks.split_schedule_compute"


def test_the_task_computes_the_schedule_through_celery():
    row = SplitScheduleFactory(status="pending", method="auto", makespan=None, solver_s=None)
    assert split_schedule_compute.delay(row.pk).get() == {"schedule": row.pk, "status": "done"}
    row.refresh_from_db()
    assert row.status == SplitSchedule.Status.DONE and row.schedule["method"] == "auto"
    assert split_schedule_compute.delay(row.pk).get() == {"schedule": row.pk,
                                                          "status": "skipped"}


@pytest.mark.parametrize(("broker", "requeued"), [("filesystem://localhost//", True),
                                                  ("redis://127.0.0.1:6379/0", False)])
def test_a_starting_worker_requeues_unfinished_schedules_on_the_filesystem_broker(
        monkeypatch, broker, requeued):
    calls = []
    monkeypatch.setattr(services, "split_schedules_requeue_unfinished",
                        lambda: calls.append(1) or [])
    consumer = SimpleNamespace(app=SimpleNamespace(conf=SimpleNamespace(broker_url=broker)))
    tasks._resume_split_schedules(sender=consumer)
    assert bool(calls) is requeued
