"""A device's emulated compute resources (its agent's ``--resources``, said in its hello) reach
planning: scaled to the device's planning speed, and split by Duan-Wu's beta when their
backward/forward ratios differ."""

import re

import pytest

from orchestrator.errors import PlanningError
from tests.webapp.factories import (
    DATA_KEY,
    DeviceFactory,
    LayerProfileFactory,
    ModelSpecFactory,
    RunFactory,
)
from webapp.devices.models import Device
from webapp.gateway.services import agent_message
from webapp.runs import selectors, services
from webapp.runs.models import Plan, Run

pytestmark = pytest.mark.django_db

TWO_LANES = [{"kind": "cpu", "speed": 1.0, "backward_speed": 0.5},
             {"kind": "gpu", "speed": 2.0, "backward_speed": 4.0}]


def run_with(resources: list[dict] | None, *, algorithms: tuple[str, ...] = ("duanwu",)) -> Run:
    spec = ModelSpecFactory()
    devices = [DeviceFactory() for _ in range(2)]
    for device, scale in zip(devices, (1.0, 2.0), strict=True):
        LayerProfileFactory(device=device, model_spec=spec, layers=6, scale=scale)
    if resources is not None:  # the second device's agent says them in its hello
        agent_message(device_id=devices[1].pk, message={
            "type": "hello", "data_key": DATA_KEY, "data_address": "tcp://127.0.0.1:5601",
            "resources": resources})
    return RunFactory(model_spec=spec, devices=devices, algorithms=list(algorithms))


def test_a_hello_s_resources_are_kept_and_said_anew_by_each_hello() -> None:
    run = run_with(TWO_LANES)
    device = Device.objects.get(uid=run.run_devices.order_by("position")[1].device.uid)
    assert device.resources == TWO_LANES
    agent_message(device_id=device.pk, message={"type": "hello", "data_key": DATA_KEY,
                                                "data_address": "tcp://127.0.0.1:5601"})
    device.refresh_from_db()
    assert device.resources == []  # an agent started without --resources


def test_planning_scales_the_resources_to_the_device_s_speed() -> None:
    run = run_with(TWO_LANES)
    _, devices = selectors.run_planning_inputs(run=run)
    plain, emulated = devices.devices
    assert plain.resources == ()  # no --resources: one resource at its speed, as before
    assert [r.kind for r in emulated.resources] == ["cpu", "gpu"]
    assert sum(r.speed for r in emulated.resources) == pytest.approx(emulated.speed)
    cpu, gpu = emulated.resources
    assert gpu.speed == pytest.approx(2 * cpu.speed)  # relative speeds kept
    assert cpu.backward_speed / cpu.speed == pytest.approx(0.5)  # and each one's ratio
    assert gpu.backward_speed / gpu.speed == pytest.approx(2.0)


def test_a_device_with_two_kinds_of_resource_gets_a_beta_split_in_a_duanwu_plan(
        django_capture_on_commit_callbacks) -> None:
    # Prepare: a CPU better at forwards, a GPU better at backwards
    run = run_with(TWO_LANES)
    emulated = run.run_devices.order_by("position")[1].device.uid
    # Execute
    with django_capture_on_commit_callbacks(execute=True):
        services.run_plan(run=run)
    # Assert: the planner splits them between the passes (the agent's two lanes)
    run.refresh_from_db()
    assert run.state == Run.State.PLANNED, run.error
    plan = run.plans.get(algorithm="duanwu")
    assert plan.status == Plan.Status.DONE
    beta = plan.document["beta"]
    assert set(beta) == {emulated} and set(beta[emulated]) == {"cpu", "gpu"}
    # the CPU leans to forwards, the GPU to backwards
    assert beta[emulated]["cpu"] > beta[emulated]["gpu"]


def test_malformed_stored_resources_fail_planning_naming_the_device() -> None:
    run = run_with(None)
    device = run.run_devices.order_by("position")[1].device
    Device.objects.filter(pk=device.pk).update(resources=[{"kind": "cpu"}])
    with pytest.raises(PlanningError, match=re.escape(f"({device.uid}) has malformed resources: "
                                                      "speed: is missing")):
        selectors.run_planning_inputs(run=run)
