"""ws/agent/: the one control connection of each agent. It authenticates with the device key
(``Authorization: Device <uid>:<key>``, as the REST API), joins the device's command group, and
hands every message to :func:`webapp.gateway.services.agent_message`, which reads it as its
typed form (orchestrator.protocol). Pings are answered here, without the database, so that
agents can measure their clock offset. A message refused gets ``error {detail, field,
in_reply_to}`` and the connection stays open; so does a frame that is no message at all (binary,
not JSON, or arrays and objects nested more than MAX_DEPTH levels deep)."""

from __future__ import annotations

import logging
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from orchestrator.protocol import ErrorReply, Message, Ping, Pong, ProtocolError
from orchestrator.protocol.fields import read_json_text
from webapp.common.exceptions import ApplicationError
from webapp.devices.commands import device_group
from webapp.devices.selectors import device_by_credentials
from webapp.gateway import services

CLOSE_UNAUTHENTICATED = 4401
CLOSE_POLICY = 4003  # told to close (a retired device) without a code of its own

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

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None,
                      **kwargs: Any) -> None:
        """A frame: read as JSON here (Channels' own reading raised on a binary frame, on text
        that is not JSON, and with RecursionError on one nested a thousand levels deep, which
        closed the connection with 1011 and sent the device's runs into recovery)."""
        try:
            if text_data is None:
                reason = "must be a JSON text frame, not a binary one"
                raise ProtocolError(f"a message {reason}", reason=reason)
            content = read_json_text(text_data)
        except ProtocolError as exc:
            await self.send_json(ErrorReply(detail=str(exc), field=exc.field).to_json())
            return
        await self.receive_json(content, **kwargs)

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

    async def agent_close(self, message: dict[str, Any]) -> None:
        """``agent.close`` on the device's group: the server closes this connection (its device
        was retired: webapp.devices.services.device_retire) with the code the message carries;
        the disconnect that follows is handled as any other (services.agent_disconnected)."""
        code = message.get("code")
        await self.close(code=code if isinstance(code, int) else CLOSE_POLICY,
                         reason=str(message.get("reason") or "")[:120] or None)
