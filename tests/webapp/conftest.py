"""Fixtures for the webapp tests: users and API clients for browsers and for agents."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rest_framework.test import APIClient

from tests.webapp.factories import UserFactory
from webapp.devices.models import Device


@pytest.fixture
def user(db: None) -> object:
    return UserFactory()


@pytest.fixture
def api(user: object) -> APIClient:
    """A client logged in with a Django session."""
    client = APIClient()
    client.force_login(user)
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
