"""The browser's live connections: a run page gets a snapshot on connect, then the run group's
events (webapp.runs.events); the Devices page likewise with the devices group
(webapp.devices.events). Logged-in users only."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from webapp.devices.events import DEVICES_GROUP, devices_snapshot
from webapp.devices.selectors import device_list
from webapp.runs.events import Event, run_group, run_snapshot
from webapp.runs.selectors import run_list

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404


@database_sync_to_async
def _snapshot(run_id: int) -> Event | None:
    run = run_list().filter(pk=run_id).first()
    return None if run is None else run_snapshot(run)


@database_sync_to_async
def _devices_snapshot() -> Event:
    return devices_snapshot(device_list())


def _is_snapshot_request(content: Any) -> bool:
    return isinstance(content, dict) and content.get("type") == "snapshot"


UNKNOWN_MESSAGE = {"type": "error", "detail": 'unknown message; send {"type": "snapshot"}'}


class RunConsumer(AsyncJsonWebsocketConsumer):
    """ws/runs/<id>/: sends {"type": "snapshot", ...} on connect and on request
    ({"type": "snapshot"}), then {"type": "run" | "plan", ...} events as they happen."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        # the group first, then the snapshot: an event between the two reaches the page as
        # a delta after the snapshot (maybe one it holds already: the page keeps rows once);
        # read the other way round, it reached neither
        await self.channel_layer.group_add(run_group(self.run_id), self.channel_name)
        snapshot = await _snapshot(self.run_id)
        if snapshot is None:
            await self.channel_layer.group_discard(run_group(self.run_id), self.channel_name)
            await self.close(code=CLOSE_NOT_FOUND)
            return
        await self.accept()
        await self.send_json(snapshot)

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(run_group(self.run_id), self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if _is_snapshot_request(content):
            snapshot = await _snapshot(self.run_id)
            await self.send_json(snapshot or {"type": "error", "detail": "the run was deleted"})
            return
        await self.send_json(UNKNOWN_MESSAGE)

    async def dispatch(self, message: dict[str, Any]) -> None:
        """As Channels' own, but a run's event goes to the page at once: Channels hops to its
        database thread before every message (``aclose_old_connections``), and on SQLite that
        one thread also stores every agent's events, so each delta waited behind the stores
        (bench/live.py: at 8,000 events/s the channel stage's p95 was 0.4 s). Forwarding an
        event needs no database; the snapshots' reads close old connections themselves."""
        if message.get("type") == "run.event":
            await self.run_event(message)
            return
        await super().dispatch(message)

    async def run_event(self, message: dict[str, Any]) -> None:
        await self.send_json(message["event"])


class DevicesConsumer(AsyncJsonWebsocketConsumer):
    """ws/devices/: sends {"type": "snapshot", "devices": [...]} on connect and on request
    ({"type": "snapshot"}), then {"type": "device", "device": {...}} as devices change."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await self.channel_layer.group_add(DEVICES_GROUP, self.channel_name)
        await self.accept()
        await self.send_json(await _devices_snapshot())

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(DEVICES_GROUP, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if _is_snapshot_request(content):
            await self.send_json(await _devices_snapshot())
            return
        await self.send_json(UNKNOWN_MESSAGE)

    async def devices_event(self, message: dict[str, Any]) -> None:
        await self.send_json(message["event"])
