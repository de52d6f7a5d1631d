"""The devices group's events: sent after commit, enough to keep the Devices page's snapshot
current, and carried to the page by ws/devices/."""

from datetime import timedelta
from functools import reduce

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.utils import timezone

from tests.webapp.dashboard.test_consumers import session_headers
from tests.webapp.factories import DeviceFactory, EnrollmentTokenFactory
from tests.webapp.runs.test_events import drain
from webapp.asgi import application
from webapp.devices import events, services
from webapp.devices.models import Device
from webapp.devices.selectors import device_list

pytestmark = pytest.mark.django_db(transaction=True)

ENROL = {"memory_bytes": 2**30, "bandwidth_bps": 1e7}


def subscribe() -> str:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(events.DEVICES_GROUP, channel)
    return channel


def test_applying_the_events_to_an_old_snapshot_gives_the_fresh_snapshot():
    # Prepare: a device, and a page that took its snapshot then
    bench = DeviceFactory(name="bench")
    old = events.devices_snapshot(device_list())
    channel = subscribe()
    token = EnrollmentTokenFactory(max_uses=2)
    # Execute: enrol two, heartbeat, rename (changes the order), retire, go silent
    pi, _ = services.device_enrol(token=token.secret, name="pi", **ENROL)
    services.device_heartbeat(device=pi, status=Device.Status.BUSY)
    services.device_rename(device=pi, name="aardvark pi")
    services.device_retire(device=bench)
    jetson, _ = services.device_enrol(token=token.secret, name="jetson", **ENROL)
    Device.objects.filter(pk=jetson.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(hours=1))
    assert services.devices_mark_offline(older_than_s=60) == 1
    received = [m["event"] for m in drain(channel)]
    # Assert
    assert [e["type"] for e in received] == ["device"] * 6
    applied = reduce(events.snapshot_apply, received, old)
    fresh = events.devices_snapshot(device_list())
    assert applied == fresh
    assert [(d["name"], d["status"]) for d in fresh["devices"]] == [
        ("aardvark pi", "busy"), ("bench", "retired"), ("jetson", "offline")]


def test_nothing_is_sent_for_a_transaction_that_rolls_back():
    device = DeviceFactory()
    channel = subscribe()
    with pytest.raises(RuntimeError), transaction.atomic():
        services.device_rename(device=device, name="never")
        raise RuntimeError("rolled back")
    assert drain(channel) == []


def test_snapshot_apply_rejects_an_unknown_event():
    with pytest.raises(ValueError, match="unknown event type 'run'"):
        events.snapshot_apply({"type": "snapshot", "devices": []}, {"type": "run"})


def test_the_devices_page_gets_a_snapshot_then_each_change():
    device = DeviceFactory(name="pi")
    headers = session_headers()

    async def scenario() -> tuple[dict, dict, dict, dict]:
        page = WebsocketCommunicator(application, "/ws/devices/", headers=headers)
        connected, _ = await page.connect()
        assert connected
        snapshot = await page.receive_json_from(timeout=5)
        await database_sync_to_async(services.device_heartbeat)(device=device, status="busy")
        event = await page.receive_json_from(timeout=5)
        await page.send_json_to({"type": "snapshot"})
        again = await page.receive_json_from(timeout=5)
        await page.send_json_to({"type": "devices please"})
        error = await page.receive_json_from(timeout=5)
        await page.disconnect()
        return snapshot, event, again, error

    snapshot, event, again, error = async_to_sync(scenario)()
    assert snapshot["type"] == "snapshot" and snapshot["devices"][0]["uid"] == device.uid
    assert snapshot["devices"][0]["status"] == "online"
    assert event["type"] == "device" and event["device"]["status"] == "busy"
    assert again["devices"][0]["status"] == "busy"
    assert error["type"] == "error"


def test_the_devices_socket_refuses_a_page_without_a_session():
    async def scenario() -> tuple[bool, int]:
        page = WebsocketCommunicator(application, "/ws/devices/",
                                     headers=[(b"origin", b"http://testserver")])
        return await page.connect()

    assert async_to_sync(scenario)() == (False, 4401)


def test_an_agents_profiling_progress_and_failure_reach_the_devices_page():
    # Regression: profiling progress and failures were only logged, so the device's page
    # waited for a profile that would never come.
    from tests.webapp.gateway.agents import agent

    device = DeviceFactory(data_address="")
    headers = session_headers()

    async def scenario() -> list[dict]:
        page = WebsocketCommunicator(application, "/ws/devices/", headers=headers)
        assert (await page.connect())[0]
        await page.receive_json_from(timeout=5)  # the snapshot
        link = agent(device)
        assert (await link.connect())[0]
        for message in ({"type": "profile_progress", "model": "vgg5", "done": 2, "total": 5},
                         {"type": "profile_failed", "model": "vgg5",
                          "error": "out of memory"},
                         {"type": "ack", "command": "profile", "model": "lenet", "ok": False,
                          "error": "unknown model 'lenet'"},
                         {"type": "profile_result", "profile": {"model": "mlp"},
                          "model_spec": {"model": "mlp", "dataset": "digits",
                                         "batch_size": 16}}):
            await link.send_json_to(message)
        seen = [await page.receive_json_from(timeout=5) for _ in range(4)]
        await link.disconnect()
        await page.disconnect()
        return seen

    seen = async_to_sync(scenario)()
    assert [(e["type"], e["state"], e["model"]) for e in seen] == [
        ("profiling", "running", "vgg5"), ("profiling", "failed", "vgg5"),
        ("profiling", "failed", "lenet"), ("profiling", "failed", "mlp")]
    assert all(e["device"] == device.pk for e in seen)
    assert (seen[0]["done"], seen[0]["total"]) == (2, 5)
    assert seen[1]["error"] == "out of memory"
    assert seen[2]["error"] == "unknown model 'lenet'"
    assert seen[3]["error"].startswith("the server refused the profile: profile")
    # transient: the snapshot does not change
    snapshot = events.devices_snapshot(device_list())
    assert events.snapshot_apply(snapshot, seen[0]) == snapshot
