"""One clock per run: a run that failed, was planned again and started again goes on from where
its record ends (its earlier events, its faults and its new events share one origin), and a
first start still begins at 0."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.utils import timezone

from tests.webapp.factories import DeviceFactory, LayerProfileFactory, ModelSpecFactory, RunFactory
from tests.webapp.gateway.agents import connect_all, planned_run, recover
from webapp.devices.models import Device
from webapp.runs import services
from webapp.runs.models import FaultEvent, MetricPoint, Run, TimelineEvent
from webapp.runs.selectors import run_record_end
from webapp.runs.services.control import run_clock

pytestmark = pytest.mark.django_db(transaction=True)  # planning runs on commit


def started_run() -> tuple[Run, list[Device]]:
    spec = ModelSpecFactory()
    devices = [DeviceFactory(status=Device.Status.ONLINE) for _ in range(2)]
    for k, device in enumerate(devices):
        device.control_channel = f"channel-{k}"
        device.save()
        LayerProfileFactory(device=device, model_spec=spec)
    run = RunFactory(model_spec=spec, devices=devices, algorithms=["ftpipehd"])
    return start(run, devices), devices


def start(run: Run, devices: list[Device]) -> Run:
    services.run_plan(run=run)
    services.run_start(run=Run.objects.get(pk=run.pk))
    for device in devices:
        services.run_stage_ready(run=Run.objects.get(pk=run.pk), device=device)
    run = Run.objects.get(pk=run.pk)
    assert run.state == Run.State.RUNNING
    return run


def newest_fault(run: Run, kind: str) -> FaultEvent:
    return FaultEvent.objects.filter(run=run, kind=kind).order_by("-at").first()


def test_a_first_start_begins_the_clock_at_zero():
    run, _ = started_run()
    assert newest_fault(run, "run_started").at == 0.0
    assert run_clock(run) < 5.0


def test_a_run_started_again_goes_on_from_the_end_of_its_record():
    # Prepare: a first attempt that trained 190 s and failed at 200 s of its clock
    run, devices = started_run()
    Run.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(seconds=200))
    TimelineEvent.objects.create(run=run, device=devices[0].uid, stage=0, kind="forward",
                                 microbatch=900, version=0, start=189.5, end=190.0)
    MetricPoint.objects.create(run=run, at=190.0, kind="loss", device="", value=0.5)
    services.run_stage_failed(run=Run.objects.get(pk=run.pk), device=devices[1],
                              error="out of memory")
    failed_at = newest_fault(run, "run_failed").at
    assert failed_at == pytest.approx(200.0, abs=5.0)
    assert run_record_end(run=run) == failed_at
    # Execute: planned again and started again
    run = start(run, devices)
    # Assert: the clock goes on from the failure, not from 0: it reads failed_at when the
    # training begins (START_DELAY_S after the last stage said it was ready), and the new
    # start is recorded there
    assert newest_fault(run, "run_started").at == failed_at
    # the new generation measures itself from there (not the first attempt's passes)
    assert run.deployment["since_s"] == failed_at
    assert run.generations.get(number=0).resumed_at == failed_at
    begins = run.started_at + timedelta(seconds=failed_at)
    assert timezone.now() - timedelta(seconds=5) < begins <= timezone.now() + timedelta(seconds=1)


def test_while_it_starts_again_its_clock_waits_at_the_end_of_its_record():
    run, devices = started_run()
    FaultEvent.objects.create(run=run, at=42.0, kind="run_paused", device="", detail={})
    services.run_stage_failed(run=Run.objects.get(pk=run.pk), device=devices[0], error="gone")
    FaultEvent.objects.filter(run=run, kind="run_failed").update(at=50.0)
    services.run_plan(run=Run.objects.get(pk=run.pk))
    services.run_start(run=Run.objects.get(pk=run.pk))
    run = Run.objects.get(pk=run.pk)
    assert run.state == Run.State.STARTING
    assert run_clock(run) == 50.0


def test_a_run_started_again_that_loses_a_device_as_it_starts_goes_on_with_its_clock():
    # Prepare: a first attempt's record (trained until 150 s, failed at 160 s), planned again
    run, devices = planned_run()
    TimelineEvent.objects.create(run=run, device=devices[0].uid, stage=0, kind="forward",
                                 microbatch=0, version=0, start=149.0, end=150.0)
    FaultEvent.objects.create(run=run, at=160.0, kind="run_failed", device="", detail={})

    async def scenario() -> tuple[list[dict], Run]:
        agents = await connect_all(devices)
        await database_sync_to_async(services.run_start)(run=run)
        for a in agents:
            assert (await a.receive_json_from(timeout=5))["command"] == "deploy"
        await agents[2].disconnect()  # lost before any stage was ready
        _, _, starts = await recover(agents[:2], [[], []], run)
        started = await database_sync_to_async(Run.objects.get)(pk=run.pk)
        for a in agents[:2]:
            await a.disconnect()
        return starts, started

    # Execute: started again, a device lost as it starts, the run starts on the others
    starts, run = async_to_sync(scenario)()
    # Assert: the clock waited at 160 s while it started, and the agents time the training
    # from an origin 160 s before it begins
    assert run.state == Run.State.RUNNING, run.error
    lost = FaultEvent.objects.filter(run=run, kind="device_lost", device=devices[2].uid).get()
    assert lost.at == 160.0
    begins = [s["begin_at"] for s in starts]
    # (epoch seconds: an absolute tolerance, a relative one would allow half an hour)
    assert [s["started_at"] for s in starts] == [pytest.approx(b - 160.0, rel=0, abs=1e-3)
                                                 for b in begins]
    assert run.started_at.timestamp() == pytest.approx(begins[0] - 160.0, rel=0, abs=1e-3)
