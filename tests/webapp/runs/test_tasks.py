import pytest

from tests.webapp.factories import DeviceFactory, LayerProfileFactory, ModelSpecFactory, RunFactory
from webapp.runs.models import Plan, Run
from webapp.runs.tasks import plan_compute

pytestmark = pytest.mark.django_db


def test_plan_compute_survives_a_killed_worker_by_design():
    # a message is acknowledged after the task, and given back if the worker process dies
    assert plan_compute.acks_late is True
    assert plan_compute.reject_on_worker_lost is True
    assert plan_compute.max_retries >= 3


def test_plan_compute_task_plans_and_reports_its_worker():
    spec = ModelSpecFactory()
    devices = [DeviceFactory(), DeviceFactory()]
    for device in devices:
        LayerProfileFactory(device=device, model_spec=spec)
    run = RunFactory(model_spec=spec, devices=devices, state=Run.State.PLANNING)
    plan = Plan.objects.create(run=run, algorithm="pipedream")
    assert plan_compute.delay(plan.pk).get() == {"plan": plan.pk, "status": "done"}
    plan.refresh_from_db()
    assert plan.status == "done" and plan.document["algorithm"] == "pipedream"
