"""ws/agent/: the one control connection of each agent. It authenticates with the device key
(``Authorization: Device <uid>:<key>``, as the REST API), joins the device's command group, and
hands every message to :func:`webapp.gateway.services.agent_message`. Pings are answered here,
without the database, so that agents can measure their clock offset."""

from __future__ import annotations

import logging
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from webapp.common.exceptions import ApplicationError
from webapp.devices.commands import device_group
from webapp.devices.selectors import device_by_credentials
from webapp.gateway import services

CLOSE_UNAUTHENTICATED = 4401

log = logging.getLogger(__name__)


def _credentials(scope: dict[str, Any]) -> tuple[str, str] | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            scheme, _, credentials = value.decode("latin-1").partition(" ")
            uid, sep, key = credentials.strip().partition(":")
            if scheme.lower() == "device" and sep and uid and key:
                return uid, key
    return None


class AgentConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        credentials = _credentials(self.scope)
        device = None
        if credentials is not None:
            device = await database_sync_to_async(device_by_credentials)(
                uid=credentials[0], key=credentials[1])
        if device is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.device_id, self.uid = device.pk, device.uid
        await self.channel_layer.group_add(device_group(self.uid), self.channel_name)
        await self.accept()
        await database_sync_to_async(services.agent_connected)(device_id=self.device_id,
                                                               channel=self.channel_name)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "device_id", None) is None:
            return
        await self.channel_layer.group_discard(device_group(self.uid), self.channel_name)
        await database_sync_to_async(services.agent_disconnected)(device_id=self.device_id,
                                                                  channel=self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong", "id": content.get("id"),
                                  "server_time": time.time()})
            return
        try:
            reply = await database_sync_to_async(services.agent_message)(
                device_id=self.device_id, message=content)
        except ApplicationError as exc:
            errors = getattr(exc, "errors", ())
            reply = {"type": "error", "detail": str(exc),
                     "field": errors[0].field if errors else None,
                     "in_reply_to": content.get("type") if isinstance(content, dict) else None}
        except Exception:
            # a bug on this side must not cut the device off (it would lose what it sent)
            kind = content.get("type") if isinstance(content, dict) else None
            log.exception("handling %s from device %s failed", kind, self.uid)
            reply = {"type": "error", "detail": f"the server failed to handle {kind!r}",
                     "field": None, "in_reply_to": kind}
        if reply is not None:
            await self.send_json(reply)

    async def agent_command(self, message: dict[str, Any]) -> None:
        await self.send_json(message["command"])
