import pytest

from orchestrator.errors import PlanningError
from orchestrator.events import TimelineEvent as TimelineRecord
from orchestrator.events import idle_breakdown
from tests.webapp import testbed
from tests.webapp.factories import (
    DeviceFactory,
    LayerProfileFactory,
    ModelSpecFactory,
    PlanFactory,
    RunFactory,
)
from webapp.runs import selectors
from webapp.runs.models import Run, TimelineEvent

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


def test_the_idle_breakdown_is_the_orchestrators_over_the_newest_events(monkeypatch):
    # Prepare: two devices' forwards, backwards and sends of a second pipeline, more events
    # than the window holds (so the window starts at the newest LIVE_MAX_EVENTS-th end)
    monkeypatch.setattr(selectors, "LIVE_MAX_EVENTS", 50)
    run = RunFactory(schedule="1f1b-sync")
    records = []
    for m in range(20):
        for d, device in enumerate(("edge-a", "edge-b")):
            t = 0.01 * m + 0.004 * d
            for kind, start in (("forward", t), ("send", t + 0.001), ("backward", t + 0.002)):
                records.append(TimelineRecord(run.pk, device, d, kind, m, m // 8, start,
                                              start + 0.0008, 64 if kind == "send" else 0, 1))
    TimelineEvent.objects.bulk_create(TimelineEvent(run=run, **{
        f: getattr(r, f) for f in ("device", "stage", "kind", "microbatch", "version", "start",
                                   "end", "bytes", "pipeline")}) for r in records)
    # Execute
    window, devices = selectors.run_idle(run=run)
    # Assert: the window holds the newest 50 ends, and each device's breakdown is the
    # orchestrator's over the events in it
    ends = sorted(r.end for r in records)
    assert window == [ends[-50], ends[-1]]
    kept = [r for r in records if r.end >= ends[-50]]
    assert set(devices) == {"edge-a", "edge-b"}
    for device, got in devices.items():
        expected = idle_breakdown([r for r in kept if r.device == device],
                                  window=(window[0], window[1]), schedule="1f1b-sync")
        assert got == pytest.approx(expected.to_json())
