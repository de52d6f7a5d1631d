"""Frames on ws/agent/ that are no message at all (binary, not JSON, nested too deep) and a
hello with too large a hardware description: each is answered with the protocol's ``error``
and the connection stays open (it closed with 1011, and the device's runs went into
recovery)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from tests.webapp.factories import DATA_KEY, DeviceFactory
from webapp.asgi import application
from webapp.devices.models import Device

pytestmark = pytest.mark.django_db(transaction=True)


def agent(device: Device) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Device {device.uid}:{device.key}".encode())]
    return WebsocketCommunicator(application, "/ws/agent/", headers=headers)


async def replies_to(device: Device, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each frame's reply, then the reply to a ping sent after them all (the connection is
    still open and served), with the device as the server sees it meanwhile."""
    link = agent(device)
    assert (await link.connect())[0]
    replies = []
    for frame in frames:
        await link.send_input({"type": "websocket.receive", **frame})
        replies.append(await link.receive_json_from(timeout=5))
    await link.send_json_to({"type": "ping", "id": 7})
    replies.append(await link.receive_json_from(timeout=5))
    await link.disconnect()
    return replies


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(("frame", "detail"), [
    ({"text": "hello?"}, "is not JSON"),
    ({"text": ""}, "is not JSON"),
    ({"text": '{"type": "ping", "id": 1'}, "is not JSON"),
    ({"bytes": b'{"type": "ping", "id": 1}'}, "must be a JSON text frame, not a binary one"),
    ({"bytes": b"\x00\xff\x10"}, "must be a JSON text frame, not a binary one"),
    ({"text": nested(100_000)}, "nests arrays and objects more than 64 levels deep"),
    ({"text": nested(65)}, "nests arrays and objects more than 64 levels deep"),
    ({"text": '{"type": "hello", "hardware": ' + nested(500) + "}"},
     "nests arrays and objects more than 64 levels deep"),
])
def test_a_frame_that_is_no_message_is_answered_and_the_connection_stays(
        frame: dict[str, Any], detail: str) -> None:
    device = DeviceFactory(data_address="", status=Device.Status.OFFLINE)
    replies = async_to_sync(replies_to)(device, [frame, frame])
    for reply in replies[:2]:
        assert reply["type"] == "error"
        assert set(reply) == {"type", "detail", "field", "in_reply_to"}
        assert reply["field"] is None and reply["in_reply_to"] is None
        assert detail in reply["detail"]
        assert "Traceback" not in reply["detail"]
    assert replies[2]["type"] == "pong" and replies[2]["id"] == 7


def test_the_device_stays_online_through_bad_frames() -> None:
    device = DeviceFactory(data_address="", status=Device.Status.OFFLINE)

    async def scenario() -> tuple[list[dict[str, Any]], Device]:
        link = agent(device)
        assert (await link.connect())[0]
        replies = []
        await link.send_json_to({"type": "hello", "data_key": DATA_KEY,
                                 "data_address": "tcp://10.0.0.2:5601"})
        replies.append(await link.receive_json_from(timeout=5))
        for frame in ({"bytes": b"\x01"}, {"text": "]["}, {"text": nested(2000)}):
            await link.send_input({"type": "websocket.receive", **frame})
            replies.append(await link.receive_json_from(timeout=5))
        await link.send_json_to({"type": "heartbeat", "status": "busy"})
        await link.send_json_to({"type": "ping", "id": 1})
        replies.append(await link.receive_json_from(timeout=5))
        seen = await Device.objects.aget(pk=device.pk)
        await link.disconnect()
        return replies, seen

    replies, seen = async_to_sync(scenario)()
    assert [r["type"] for r in replies] == ["welcome", "error", "error", "error", "pong"]
    # still connected: online, busy, its data plane known (a closed connection forgets it)
    assert seen.status == Device.Status.BUSY and seen.data_address == "tcp://10.0.0.2:5601"


def test_deep_messages_within_the_bound_are_read_as_usual() -> None:
    device = DeviceFactory(data_address="", status=Device.Status.OFFLINE)
    # 64 levels: a message of the right shape but an unknown type, refused by its type
    deep = '{"type": "teleport", "x": ' + nested(63) + "}"
    [reply, pong] = async_to_sync(replies_to)(device, [{"text": deep}])
    assert reply["type"] == "error" and reply["field"] == "type"
    assert reply["in_reply_to"] == "teleport"
    assert pong["type"] == "pong"


def test_a_hello_with_a_huge_hardware_description_is_refused_naming_hardware() -> None:
    device = DeviceFactory(data_address="", status=Device.Status.OFFLINE, hardware={"cpus": 2})
    hello = {"type": "hello", "data_key": DATA_KEY, "data_address": "tcp://10.0.0.2:5601"}
    huge = {**hello, "hardware": {"blob": "x" * 900_000}}
    many = {**hello, "hardware": {f"k{i}": i for i in range(1000)}}
    deep: dict[str, Any] = {"cpus": 4}
    for _ in range(20):
        deep = {"inner": deep}
    replies = async_to_sync(replies_to)(device, [{"text": json.dumps(m)} for m in (
        huge, many, {**hello, "hardware": deep}, {**hello, "hardware": {"cpus": 4}})])
    for reply, reason in zip(replies[:3], ("at most 16384 bytes as JSON", "at most 64 entries",
                                           "8 levels deep"), strict=True):
        assert reply["type"] == "error" and reply["field"] == "hardware"
        assert reply["in_reply_to"] == "hello" and reason in reply["detail"]
    assert replies[3]["type"] == "welcome" and replies[4]["type"] == "pong"
    device.refresh_from_db()
    assert device.hardware == {"cpus": 4}
