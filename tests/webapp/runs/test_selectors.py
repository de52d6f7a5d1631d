import pytest

from orchestrator.errors import PlanningError
from tests.webapp import testbed
from tests.webapp.factories import (
    DeviceFactory,
    LayerProfileFactory,
    ModelSpecFactory,
    PlanFactory,
    RunFactory,
)
from webapp.runs import selectors
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db


def test_planning_inputs_from_profiles_uploaded_by_the_testbeds_agents(resnet_testbed):
    # Prepare: a run on the five devices, the VM (the file's reference) first
    run = Run.objects.create(name="r", model_spec_id=resnet_testbed.spec, algorithms=["bsp"])
    for k, device in enumerate(resnet_testbed.devices):
        run.run_devices.create(device_id=device.id, position=k)
    # Execute
    profile, devices = selectors.run_planning_inputs(run=run)
    # Assert: the same model and devices as the files, with the devices' uids
    assert profile.reference == resnet_testbed.devices[0].uid
    assert profile.num_layers == 37 and profile.batch_size == 32
    assert [la.forward_s for la in profile.layers] == [
        t for t in testbed.DEVICES[0]["layer_times"]["forward_s"]]
    assert devices.ids == tuple(d.uid for d in resnet_testbed.devices)
    for got, raw in zip(devices.devices, testbed.DEVICES, strict=True):
        assert got.speed == pytest.approx(raw["speed"], rel=1e-4)
        assert got.layer_times.forward_s == tuple(raw["layer_times"]["forward_s"])
        assert got.layer_times.backward_s == tuple(raw["layer_times"]["backward_s"])
        assert (got.memory_bytes, got.bandwidth_bps, got.latency_s) == (
            raw["memory_bytes"], raw["bandwidth_bps"], raw["latency_s"])
        assert got.label == raw["id"]


def test_the_first_device_of_the_run_is_the_reference():
    spec = ModelSpecFactory()
    fast, slow = DeviceFactory(), DeviceFactory()
    LayerProfileFactory(device=fast, model_spec=spec, scale=1.0)
    LayerProfileFactory(device=slow, model_spec=spec, scale=4.0)
    run = RunFactory(model_spec=spec, devices=[slow, fast])
    profile, devices = selectors.run_planning_inputs(run=run)
    assert profile.reference == slow.uid
    assert [d.speed for d in devices.devices] == pytest.approx([1.0, 4.0])


def test_a_device_without_a_profile_is_a_planning_error_naming_it():
    spec = ModelSpecFactory()
    profiled, bare = DeviceFactory(), DeviceFactory(name="lonely pi")
    LayerProfileFactory(device=profiled, model_spec=spec)
    LayerProfileFactory(device=bare, model_spec=ModelSpecFactory(model="other"))
    run = RunFactory(model_spec=spec, devices=[profiled, bare])
    with pytest.raises(PlanningError, match=rf"device 'lonely pi' \({bare.uid}\): ask it to "
                                            "profile the model"):
        selectors.run_planning_inputs(run=run)


def test_profiles_with_different_layer_counts_are_a_planning_error():
    spec = ModelSpecFactory()
    a, b = DeviceFactory(), DeviceFactory()
    LayerProfileFactory(device=a, model_spec=spec, layers=4)
    LayerProfileFactory(device=b, model_spec=spec, layers=5)
    with pytest.raises(PlanningError, match=f"{b.uid}.*profiled 5 layers.*{a.uid} profiled 4"):
        selectors.run_planning_inputs(run=RunFactory(model_spec=spec, devices=[a, b]))


def test_plan_compare_ranks_fitting_plans_first_and_says_why_the_best_is_best():
    run = RunFactory()
    slow = PlanFactory(run=run, algorithm="uniform", period_s=0.4, throughput_sps=80)
    best = PlanFactory(run=run, algorithm="ftpipehd", period_s=0.2, throughput_sps=160,
                       bottleneck="boundary 0->1")
    too_big = PlanFactory(run=run, algorithm="bsp", period_s=0.1, memory_ok=False)
    failed = PlanFactory(run=run, algorithm="optimal", status="failed", period_s=None,
                         memory_ok=None, error="no plan fits")
    compared = selectors.plan_compare(run=run)
    assert compared["best"] == best.pk
    assert [r["plan"] for r in compared["rows"]] == [best.pk, slow.pk, too_big.pk, failed.pk]
    assert compared["rows"][1]["vs_best"] == pytest.approx(2.0)
    assert "ftpipehd" in compared["reason"] and "boundary 0->1" in compared["reason"]
    assert "uniform, is 2.00x slower" in compared["reason"]
