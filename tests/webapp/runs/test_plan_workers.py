"""A worker killed mid-plan (webapp.runs.services.planning): its plan's heartbeat goes stale,
beat queues the plan again, and the plan says which worker stopped on which attempt, which the
run page shows."""

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.webapp.runs.test_events import drain, subscribe
from tests.webapp.runs.test_services import profiled_run
from webapp.runs import services
from webapp.runs.models import Plan, Run
from webapp.runs.services import planning

pytestmark = pytest.mark.django_db


def silent_plan(*, silent_s: float, state: str = Run.State.PLANNING) -> Plan:
    run = profiled_run(algorithms=("uniform",), state=state)
    return Plan.objects.create(run=run, algorithm="uniform", status=Plan.Status.RUNNING,
                               attempts=1, worker="celery@killed",
                               heartbeat_at=timezone.now() - timedelta(seconds=silent_s))


def test_a_plan_whose_worker_went_silent_is_queued_again_and_says_so(
        django_capture_on_commit_callbacks, monkeypatch):
    plan = silent_plan(silent_s=45)
    channel = subscribe(plan.run_id)
    queued = []
    monkeypatch.setattr("webapp.runs.tasks.plan_compute.delay", queued.append)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.plans_watch(silent_s=30) == [plan.pk]
    plan.refresh_from_db()
    assert (plan.status, plan.worker, plan.heartbeat_at) == ("pending", "", None)
    [interruption] = plan.interruptions
    assert interruption["worker"] == "celery@killed" and interruption["attempt"] == 1
    assert interruption["reason"] == "the worker gave no sign of life for 30 s"
    assert queued == [plan.pk]
    # the run page hears of it at once
    [sent] = [m["event"] for m in drain(channel) if m["event"]["type"] == "plan"]
    assert sent["plan"]["status"] == "pending"
    assert sent["plan"]["interruptions"][0]["worker"] == "celery@killed"
    # and the next worker computes it, keeping the history
    assert services.plan_compute(plan_id=plan.pk, worker="celery@next")["status"] == "done"
    plan.refresh_from_db()
    assert plan.attempts == 2 and len(plan.interruptions) == 1


@pytest.mark.parametrize("silent_s", [5, 29])
def test_a_plan_whose_worker_is_alive_is_left_alone(silent_s, monkeypatch):
    plan = silent_plan(silent_s=silent_s)
    monkeypatch.setattr("webapp.runs.tasks.plan_compute.delay", pytest.fail)
    assert services.plans_watch(silent_s=30) == []
    plan.refresh_from_db()
    assert plan.status == "running" and plan.interruptions == []


def test_a_plan_of_a_run_no_longer_planning_is_left_alone(monkeypatch):
    silent_plan(silent_s=100, state=Run.State.CANCELLED)
    monkeypatch.setattr("webapp.runs.tasks.plan_compute.delay", pytest.fail)
    assert services.plans_watch(silent_s=30) == []


def test_a_task_delivered_again_records_the_worker_that_stopped():
    plan = silent_plan(silent_s=1)
    assert services.plan_compute(plan_id=plan.pk, worker="celery@next")["status"] == "done"
    plan.refresh_from_db()
    assert plan.attempts == 2 and plan.worker == "celery@next"
    assert [(i["worker"], i["attempt"]) for i in plan.interruptions] == [("celery@killed", 1)]
    assert "delivered again" in plan.interruptions[0]["reason"]


@pytest.mark.django_db(transaction=True)
def test_a_worker_marks_its_plan_alive_while_it_plans(monkeypatch):
    plan = silent_plan(silent_s=100)
    plan.status, plan.attempts = Plan.Status.RUNNING, 1
    beats = threading.Event()
    real = planning._plan_outcome

    def slow(plan, progress):  # plans until the heartbeat thread has marked the row twice
        first = Plan.objects.get(pk=plan.pk).heartbeat_at
        deadline = timezone.now() + timedelta(seconds=30)
        while timezone.now() < deadline:
            current = Plan.objects.get(pk=plan.pk).heartbeat_at
            if current is not None and first is not None and current > first:
                beats.set()
                break
            threading.Event().wait(0.02)
        return real(plan, progress)

    monkeypatch.setattr(planning, "_plan_outcome", slow)
    monkeypatch.setattr("django.conf.settings.PLAN_HEARTBEAT_S", 0.05)
    assert services.plan_compute(plan_id=plan.pk, worker="celery@w")["status"] == "done"
    assert beats.is_set()
