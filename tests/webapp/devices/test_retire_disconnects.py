"""Retiring a device closes its agent's control connection (code 4003) once the retirement is
committed, through the real ASGI application; the key no longer opens a new one."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from rest_framework.test import APIClient

from tests.webapp.devices.test_stop_agent import listen
from tests.webapp.factories import DATA_KEY, DeviceFactory, UserFactory
from tests.webapp.runs.test_events import drain
from webapp.asgi import application
from webapp.devices import services
from webapp.devices.models import Device


def agent(device: Device) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Device {device.uid}:{device.key}".encode())]
    return WebsocketCommunicator(application, "/ws/agent/", headers=headers)


@pytest.mark.django_db
def test_retiring_tells_the_devices_connections_to_close(django_capture_on_commit_callbacks):
    device, other = DeviceFactory(), DeviceFactory()
    channel, elsewhere = listen(device.uid), listen(other.uid)
    with django_capture_on_commit_callbacks(execute=False) as pending:
        services.device_retire(device=device)
    assert drain(channel) == []  # nothing before the commit
    for callback in pending:
        callback()
    assert drain(channel) == [{"type": "agent.close", "code": services.CLOSE_RETIRED,
                               "reason": "device retired"}]
    assert drain(elsewhere) == []


@pytest.mark.django_db(transaction=True)
def test_retiring_a_device_closes_its_agents_websocket() -> None:
    device = DeviceFactory(data_address="")
    staff_client = APIClient()
    staff_client.force_login(UserFactory(is_staff=True))

    async def scenario() -> tuple[Any, Any, Any]:
        link = agent(device)
        assert (await link.connect())[0]
        await link.send_json_to({"type": "hello", "data_key": DATA_KEY,
                                 "data_address": "tcp://127.0.0.1:6000"})
        assert (await link.receive_json_from(timeout=5))["type"] == "welcome"
        answer = await database_sync_to_async(staff_client.post)(
            f"/api/devices/{device.pk}/retire/")
        closed = await link.receive_output(timeout=5)
        await link.disconnect(code=4003)  # what the server then tells the consumer
        again = await agent(device).connect()
        return answer, closed, again

    answer, closed, again = async_to_sync(scenario)()
    assert answer.status_code == 200 and answer.json()["status"] == "retired"
    assert closed == {"type": "websocket.close", "code": 4003, "reason": "device retired"}
    assert again == (False, 4401)  # the key no longer works
    device.refresh_from_db()
    # the disconnect was handled as any other: no connection left, still retired
    assert device.status == Device.Status.RETIRED
    assert device.control_channel == "" and device.data_address == ""

