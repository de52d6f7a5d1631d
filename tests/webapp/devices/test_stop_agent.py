"""Fault injection: POST /api/devices/<id>/stop-agent/ sends the device's agent the command
``exit`` on its Channels group, and refuses clearly when no agent is connected."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from tests.webapp.factories import DeviceFactory
from tests.webapp.runs.test_events import drain
from webapp.devices.commands import device_group
from webapp.devices.models import Device

pytestmark = pytest.mark.django_db


def listen(uid: str) -> str:
    """A channel in the device's group, as the agent's control connection is."""
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(device_group(uid), channel)
    return channel


def test_stop_agent_sends_exit_to_the_devices_agent(staff_api,
                                                     django_capture_on_commit_callbacks):
    device = DeviceFactory(control_channel="specific.agent!1")
    other = DeviceFactory(control_channel="specific.agent!2")
    channel, elsewhere = listen(device.uid), listen(other.uid)
    with django_capture_on_commit_callbacks(execute=True):
        answer = staff_api.post(f"/api/devices/{device.pk}/stop-agent/")
    assert answer.status_code == 202, answer.content
    body = answer.json()
    assert body["device"] == device.uid and body["sent"] == "exit"
    [message] = drain(channel)
    assert message["type"] == "agent.command"
    assert message["command"] == {"type": "command", "id": body["command"], "command": "exit"}
    assert drain(elsewhere) == []


@pytest.mark.parametrize(("fields", "says"), [
    ({"control_channel": ""}, "has no agent connected"),
    ({"control_channel": "specific.agent!1", "status": Device.Status.OFFLINE},
     "has no agent connected"),
    ({"control_channel": "", "status": Device.Status.RETIRED}, "is retired"),
])
def test_stop_agent_without_an_agent_is_a_409_saying_why(staff_api,
                                                         django_capture_on_commit_callbacks,
                                                         fields, says):
    device = DeviceFactory(name="pi", **fields)
    channel = listen(device.uid)
    with django_capture_on_commit_callbacks(execute=True) as sent:
        answer = staff_api.post(f"/api/devices/{device.pk}/stop-agent/")
    assert answer.status_code == 409
    body = answer.json()
    assert body["detail"].startswith(f"device 'pi' ({device.uid}) ") and says in body["detail"]
    assert body["action"] == "stop its agent" and body["state"] == device.status
    assert sent == [] and drain(channel) == []


def test_stop_agent_needs_a_session_and_a_known_device(anon, staff_api):
    device = DeviceFactory(control_channel="specific.agent!1")
    assert anon.post(f"/api/devices/{device.pk}/stop-agent/").status_code in (401, 403)
    missing = staff_api.post("/api/devices/999/stop-agent/")
    assert missing.status_code == 404 and missing.json()["detail"] == "device 999 does not exist"
    assert staff_api.get(f"/api/devices/{device.pk}/stop-agent/").status_code == 405
