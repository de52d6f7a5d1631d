"""ws/agent/: the one control connection of each agent. It authenticates with the device key
(``Authorization: Device <uid>:<key>``, as the REST API), joins the device's command group, and
hands every message to :func:`webapp.gateway.services.agent_message`, which reads it as its
typed form (orchestrator.protocol). Pings are answered here, without the database, so that
agents can measure their clock offset. A message refused gets ``error {detail, field,
in_reply_to}`` and the connection stays open."""

from __future__ import annotations

import logging
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from orchestrator.protocol import ErrorReply, Message, Ping, Pong, ProtocolError
from webapp.common.exceptions import ApplicationError
from webapp.devices.commands import device_group
from webapp.devices.selectors import device_by_credentials
from webapp.gateway import services

CLOSE_UNAUTHENTICATED = 4401

log = logging.getLogger(__name__)


def _kind(kind: Any) -> str | None:
    """The type a message said it was, as an error's ``in_reply_to``."""
    return kind[:200] if isinstance(kind, str) and kind else None


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
        kind = content.get("type") if isinstance(content, dict) else None
        reply: Message | None
        try:
            if kind == Ping.TYPE:
                reply = Pong(id=Ping.from_json(content).id, server_time=time.time())
            else:
                reply = await database_sync_to_async(services.agent_message)(
                    device_id=self.device_id, message=content)
        except ProtocolError as exc:  # a malformed ping
            reply = ErrorReply(detail=str(exc), field=exc.field, in_reply_to=_kind(kind))
        except ApplicationError as exc:
            errors = getattr(exc, "errors", ())
            reply = ErrorReply(detail=str(exc), field=errors[0].field if errors else None,
                               in_reply_to=_kind(kind))
        except Exception:
            # a bug on this side must not cut the device off (it would lose what it sent)
            log.exception("handling %s from device %s failed", kind, self.uid)
            reply = ErrorReply(detail=f"the server failed to handle {kind!r}",
                               in_reply_to=_kind(kind))
        if reply is not None:
            await self.send_json(reply.to_json())

    async def agent_command(self, message: dict[str, Any]) -> None:
        await self.send_json(message["command"])
