"""Fixtures of the dashboard's tests: logged-in browser clients (a staff user, the operator who
adds and retires devices; a viewer, who is not staff) and a run planned with the real planners
and simulator on three profiled devices."""

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
