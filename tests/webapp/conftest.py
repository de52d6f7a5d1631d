"""Fixtures for the webapp tests: users and API clients for browsers and for agents."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rest_framework.test import APIClient

from tests.webapp.factories import UserFactory
from webapp.devices.models import Device


@pytest.fixture
def user(db: None) -> object:
    """A logged-in user who is not staff: reads everything, manages no device."""
    return UserFactory()


@pytest.fixture
def api(user: object) -> APIClient:
    """A client logged in with a Django session."""
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture
def staff(db: None) -> object:
    """A staff user: manages enrolment tokens, retires devices, drives their agents."""
    return UserFactory(is_staff=True)


@pytest.fixture
def staff_api(staff: object) -> APIClient:
    """A client logged in as a staff user."""
    client = APIClient()
    client.force_login(staff)
    return client


@pytest.fixture
def anon() -> APIClient:
    return APIClient()


@pytest.fixture
def agent() -> Callable[[Device], APIClient]:
    """A client that authenticates as the given device with its key."""

    def make(device: Device, key: str | None = None) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Device {device.uid}:{key or device.key}")
        return client

    return make
