"""Fixtures of the dashboard's tests: logged-in browser clients (a staff user, the operator who
adds and retires devices; a viewer, who is not staff) and a run planned with the real planners
and simulator on three profiled devices; a running run whose agents reported events."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.webapp.factories import (
    DeviceFactory,
    LayerProfileFactory,
    ModelSpecFactory,
    RunFactory,
    UserFactory,
)
from webapp.runs import services
from webapp.runs.models import Run


@pytest.fixture
def browser(db: None) -> Client:
    """A staff user's browser: every button and form of the dashboard."""
    client = Client()
    client.force_login(UserFactory(is_staff=True))
    return client


@pytest.fixture
def viewer(db: None) -> Client:
    """A logged-in user who is not staff: reads every page, manages no device."""
    client = Client()
    client.force_login(UserFactory())
    return client


def planned(run_kwargs: dict, capture) -> Run:
    spec = ModelSpecFactory()
    devices = [DeviceFactory(name=f"edge {k}") for k in range(3)]
    for k, device in enumerate(devices):
        LayerProfileFactory(device=device, model_spec=spec, layers=6, scale=1.0 + 0.5 * k)
    run = RunFactory(model_spec=spec, devices=devices, **run_kwargs)
    with capture(execute=True):
        services.run_plan(run=run)
    run.refresh_from_db()
    assert run.state == Run.State.PLANNED, run.error
    return run


@pytest.fixture
def gpipe_run(db: None, django_capture_on_commit_callbacks) -> Run:
    return planned({"algorithms": ["ftpipehd", "uniform"], "schedule": "gpipe",
                    "microbatches": 3, "batches": 20}, django_capture_on_commit_callbacks)


@pytest.fixture
def onef1b_run(db: None, django_capture_on_commit_callbacks) -> Run:
    return planned({"algorithms": ["ftpipehd"], "schedule": "1f1b", "microbatches": 4,
                    "batches": 50}, django_capture_on_commit_callbacks)


@pytest.fixture
def reported() -> Run:
    """A running run on three devices whose agents reported forwards, backwards, overlapping
    sends to two neighbours, metrics and faults."""
    devices = [DeviceFactory(name=n) for n in ("pi one", "pi two", "pi three")]
    run = RunFactory(devices=devices, state=Run.State.RUNNING)
    for k, device in enumerate(devices):
        timeline = []
        for m in range(5):
            t = 1.0 * m + 0.25 * k
            timeline += [
                {"run": run.pk, "device": device.uid, "stage": k, "kind": "forward",
                 "microbatch": m, "version": 0, "start": t, "end": t + 0.2},
                {"run": run.pk, "device": device.uid, "stage": k, "kind": "backward",
                 "microbatch": m, "version": 0, "start": t + 0.3, "end": t + 0.7},
                # two transfers at once, to both neighbours: two lanes in the trace
                {"run": run.pk, "device": device.uid, "stage": k, "kind": "send",
                 "microbatch": m, "version": 0, "start": t + 0.2, "end": t + 0.5,
                 "bytes": 4096},
                {"run": run.pk, "device": device.uid, "stage": k, "kind": "send",
                 "microbatch": m, "version": 0, "start": t + 0.3, "end": t + 0.6,
                 "bytes": 4096}]
        services.run_events_store(
            run=run, device=device, timeline=timeline,
            metrics=[{"at": 5.0 + k, "kind": "network_bps", "device": device.uid,
                      "value": 1e6 * (k + 1)}],
            faults=[{"run": run.pk, "at": 2.5, "kind": "device_lost", "device": device.uid,
                     "detail": {"reason": "heartbeat timeout"}}] if k == 2 else [])
    services.run_events_store(run=run, device=devices[0], metrics=[
        {"at": 4.0, "kind": "throughput_sps", "value": 120.5},
        {"at": 4.0, "kind": "loss", "value": 1.75}])
    return run
