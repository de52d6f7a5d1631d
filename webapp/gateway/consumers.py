"""ws/agent/: the one control connection of each agent. It authenticates with the device key
(``Authorization: Device <uid>:<key>``, as the REST API), joins the device's command group, and
hands every message to :func:`webapp.gateway.services.agent_message`, which reads it as its
typed form (orchestrator.protocol). Pings are answered here, without the database, so that
agents can measure their clock offset. A message refused gets ``error {detail, field,
in_reply_to}`` and the connection stays open; so does a frame that is no message at all (binary,
not JSON, or arrays and objects nested more than MAX_DEPTH levels deep).

Messages are answered in the order they came. What hundreds of agents cost is kept down here
(bench/load.py measures it): a heartbeat that changes nothing is written at most every
services.HEARTBEAT_WRITE_S; events batches that queue up while earlier ones are stored are
stored together (services.agent_events); the database work runs on threads of the gateway's
own on PostgreSQL, and no message waits for Channels' database thread unless it needs it."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar, cast

from channels.consumer import get_handler_name
from channels.db import DatabaseSyncToAsync, database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.core.cache import caches
from django.db import connection

from orchestrator.protocol import (
    ErrorReply,
    Events,
    Heartbeat,
    Message,
    Ping,
    Pong,
    ProtocolError,
)
from orchestrator.protocol.fields import read_json_text
from webapp.common.exceptions import ApplicationError
from webapp.devices.commands import device_group, pending_commands_take
from webapp.devices.selectors import device_by_credentials
from webapp.gateway import services

CLOSE_UNAUTHENTICATED = 4401
CLOSE_POLICY = 4003  # told to close (a retired device) without a code of its own
# threads of the gateway's own for its database work, on a server database (PostgreSQL)
DATABASE_THREADS = 2

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


@functools.cache
def _database_executor() -> ThreadPoolExecutor | None:
    """Where the gateway's database work runs. On PostgreSQL, threads of its own: Channels runs
    every consumer's database work on one thread per process, where each agent message waited
    for every other agent's round trips to the database and Redis, and each run page's event
    for all of them (bench/load.py). An agent's own messages are still handled one at a
    time, in order; several agents' at once, as several web processes already do. On SQLite
    (the embedded setup and the tests) that one thread, as before: it takes one writer at a
    time anyway."""
    if connection.vendor == "sqlite":
        return None
    return ThreadPoolExecutor(max_workers=DATABASE_THREADS, thread_name_prefix="gateway-db")


def gateway_database(func: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """``func`` made awaitable on the gateway's database threads (``database_sync_to_async``,
    which closes old connections before and after it)."""
    executor = _database_executor()
    if executor is None:
        return cast(Callable[P, Awaitable[R]], database_sync_to_async(func))
    return cast(Callable[P, Awaitable[R]],
                DatabaseSyncToAsync(func, thread_sensitive=False, executor=executor))


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
    events_inbox: list[Any]  # events batches received, waiting to be stored
    events_task: asyncio.Future[None] | None = None  # storing them (_store_events)
    heartbeat_written: tuple[str, float] | None = None  # the last heartbeat written, and when
    outbox_task: asyncio.Future[None] | None = None  # sending other processes' commands

    async def connect(self) -> None:
        credentials = _credentials(self.scope)
        device = None
        if credentials is not None:
            device = await gateway_database(device_by_credentials)(
                uid=credentials[0], key=credentials[1])
        if device is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.device_id, self.uid = device.pk, device.uid
        self.events_inbox = []
        # the cache (Redis when deployed) made here, once: Django keeps one per context, and
        # each database call runs in a copy of this one, which made a cache, and opened a
        # connection to Redis, for every events batch (run_events_store's mark of its idle
        # breakdown)
        caches["default"]
        await self.channel_layer.group_add(device_group(self.uid), self.channel_name)
        await self.accept()
        await gateway_database(services.agent_connected)(device_id=self.device_id,
                                                          channel=self.channel_name)
        if settings.COMMANDS_OUTBOX:
            self.outbox_task = asyncio.ensure_future(self._send_pending_commands())

    async def disconnect(self, code: int) -> None:
        if getattr(self, "device_id", None) is None:
            return
        if self.outbox_task is not None:
            self.outbox_task.cancel()
        await self._events_handled()  # what it sent before closing, first
        await self.channel_layer.group_discard(device_group(self.uid), self.channel_name)
        await gateway_database(services.agent_disconnected)(device_id=self.device_id,
                                                             channel=self.channel_name)

    async def dispatch(self, message: dict[str, Any]) -> None:
        """As Channels' own, without the hop to the database thread it makes before every
        message (``aclose_old_connections``): a ping, a heartbeat already written or a command
        to forward needs no database, and where this consumer needs one, gateway_database
        closes old connections itself. With hundreds of agents,
        those hops queued every message (and every run page's event) behind the database
        work of all the others (bench/load.py)."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

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
            await self._events_handled()
            await self.send_json(ErrorReply(detail=str(exc), field=exc.field).to_json())
            return
        await self.receive_json(content, **kwargs)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """One message, answered in the order the agent sent it. Events batches queue (see
        :meth:`_store_events`); any other message waits until those before it are answered."""
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == Events.TYPE:
            self.events_inbox.append(content)
            if self.events_task is None:
                self.events_task = asyncio.ensure_future(self._store_events())
            return
        beat = self._heartbeat(content) if kind == Heartbeat.TYPE else None
        if beat is not None and not services.heartbeat_write_due(
                status=beat.status, written=self.heartbeat_written, now=time.monotonic()):
            return  # the device's row says this already, recently enough
        await self._events_handled()
        answer: Any
        try:
            if kind == Ping.TYPE:
                answer = Pong(id=Ping.from_json(content).id, server_time=time.time())
            else:
                answer = await gateway_database(services.agent_message)(
                    device_id=self.device_id, message=beat or content)
                if beat is not None:
                    self.heartbeat_written = (beat.status, time.monotonic())
        except Exception as exc:
            answer = exc
        await self._answer(answer, kind)

    async def _answer(self, answer: Message | Exception | None, kind: Any) -> None:
        """Send the reply to a message of type ``kind``, or the error that refused it."""
        if isinstance(answer, ProtocolError):  # a malformed ping
            answer = ErrorReply(detail=str(answer), field=answer.field, in_reply_to=_kind(kind))
        elif isinstance(answer, ApplicationError):
            errors = getattr(answer, "errors", ())
            answer = ErrorReply(detail=str(answer), field=errors[0].field if errors else None,
                                in_reply_to=_kind(kind))
        elif isinstance(answer, Exception):
            # a bug on this side must not cut the device off (it would lose what it sent)
            log.error("handling %s from device %s failed", kind, self.uid, exc_info=answer)
            answer = ErrorReply(detail=f"the server failed to handle {kind!r}",
                                in_reply_to=_kind(kind))
        if answer is not None:
            await self.send_json(answer.to_json())

    async def _store_events(self) -> None:
        """Store the queued events batches and answer each, in order. Batches that arrive
        while others are stored wait, and are stored together next time round
        (services.agent_events): an agent falling behind catches up in fewer, larger stores
        rather than one store per 0.1 s batch behind all the others (bench/load.py)."""
        try:
            while self.events_inbox:
                batches, self.events_inbox = self.events_inbox, []
                try:
                    answers = await gateway_database(services.agent_events)(
                        device_id=self.device_id, messages=batches)
                except Exception as exc:
                    answers = [exc] * len(batches)
                for answer in answers:
                    await self._answer(answer, Events.TYPE)
        except Exception:  # answering failed (the connection is gone): they are sent again
            log.exception("answering events of device %s failed", self.uid)
        finally:
            self.events_task = None

    async def _events_handled(self) -> None:
        """Wait until every events batch received so far is answered."""
        while self.events_task is not None:
            await asyncio.shield(self.events_task)

    @staticmethod
    def _heartbeat(content: Any) -> Heartbeat | None:
        """The heartbeat, or None when it is malformed (agent_message names the field)."""
        try:
            return Heartbeat.from_json(content)
        except ProtocolError:
            return None

    async def _send_pending_commands(self) -> None:
        """Send on the commands another process stored for this device (the embedded setup's
        worker: webapp.devices.commands), looking every COMMANDS_OUTBOX_POLL_S."""
        while True:
            await asyncio.sleep(settings.COMMANDS_OUTBOX_POLL_S)
            try:
                for command in await gateway_database(pending_commands_take)(uid=self.uid):
                    await self.send_json(command)
            except Exception:  # the next look tries again; the connection's end cancels it
                log.exception("sending stored commands to device %s failed", self.uid)

    async def agent_command(self, message: dict[str, Any]) -> None:
        await self.send_json(message["command"])

    async def agent_close(self, message: dict[str, Any]) -> None:
        """``agent.close`` on the device's group: the server closes this connection (its device
        was retired: webapp.devices.services.device_retire) with the code the message carries;
        the disconnect that follows is handled as any other (services.agent_disconnected)."""
        code = message.get("code")
        await self.close(code=code if isinstance(code, int) else CLOSE_POLICY,
                         reason=str(message.get("reason") or "")[:120] or None)
