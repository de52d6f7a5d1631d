"""The agent's control connection: one session over one channel to the server at a time, and
reconnecting with exponential backoff and jitter until told to stop.

A session says hello, waits for the welcome, measures the clock's offset to the server's
NTP-style (the ping with the shortest round trip wins, so that every device's Gantt bars line
up), reports its link, then heartbeats, hands each command to the agent and sends its ack,
and sends what the agent posted in order, ten times a second. Messages wait in the outbox
while the agent is disconnected, so a short outage loses nothing. Every message is one of
orchestrator.protocol's typed ones.

The channel is injected (:class:`Channel`: send and receive JSON objects): a WebSocket to
the server here (:func:`websocket_channel`), an in-process pair in tests. What the session
needs of the agent is :class:`SessionAgent`; what the agent needs of the session (posting,
the server's clock) is :class:`Connection`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import secrets
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from typing import Any, Protocol, TypeVar

import websockets
from websockets.asyncio.client import ClientConnection, connect

from agent.config import AgentConfig, websocket_url
from orchestrator.protocol import (
    Ack,
    Command,
    ErrorReply,
    Events,
    Heartbeat,
    Hello,
    LinkReport,
    Message,
    Ping,
    Pong,
    ProtocolError,
    Stored,
    Welcome,
    parse_server_message,
)

log = logging.getLogger("edgepipe.agent")

M = TypeVar("M", bound=Message)

REPLY_TIMEOUT_S = 30.0
PINGS = 8


class ChannelClosed(Exception):
    """The channel to the server closed (or the server refused the session)."""


class SessionRefused(ChannelClosed):
    """The server answered the session's hello or a clock probe with an error (a protocol
    version it does not speak, say): logged as an error, and tried again with backoff."""


class Channel(Protocol):
    """One connection to the server, carrying JSON objects."""

    async def send(self, message: dict[str, Any]) -> None: ...

    async def receive(self) -> Any:
        """The next message (ChannelClosed once the channel is closed)."""

    async def close(self) -> None: ...


class Connection(Protocol):
    """What the agent's parts need of the control connection."""

    @property
    def offset_s(self) -> float:
        """The server's clock minus this machine's."""

    def server_time(self) -> float: ...

    def post(self, message: Message) -> None:
        """Send ``message`` to the server (now if connected, else once reconnected)."""


class SessionAgent(Protocol):
    """What a session needs of the agent."""

    def hello(self) -> Hello: ...

    def heartbeat(self) -> Heartbeat: ...

    def handle_command(self, raw: Any) -> Ack:
        """Carry out (or start) the command ``raw`` (its JSON); its ack."""

    def blocks(self, raw: Any) -> bool:
        """Whether the command ``raw`` takes long (it is carried out off the event loop)."""

    def flush(self) -> None:
        """Post what the agent's stages produced since the last flush."""

    def stopping(self) -> None:
        """The agent stops: end what it runs (before the last flush)."""


class WebSocketChannel:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    async def send(self, message: dict[str, Any]) -> None:
        try:
            await self.ws.send(json.dumps(message))
        except websockets.exceptions.ConnectionClosed as exc:
            raise ChannelClosed(str(exc)) from None

    async def receive(self) -> Any:
        try:
            return json.loads(await self.ws.recv())
        except websockets.exceptions.ConnectionClosed as exc:
            raise ChannelClosed(str(exc)) from None

    async def close(self) -> None:
        await self.ws.close()


@asynccontextmanager
async def websocket_channel(config: AgentConfig) -> AsyncIterator[Channel]:
    """The agent's authenticated WebSocket to its server."""
    async with connect(websocket_url(config.enrolment.server), additional_headers={
            "Authorization": config.enrolment.authorization},
            max_size=64 * 2**20, open_timeout=10) as ws:
        yield WebSocketChannel(ws)


Connect = Callable[[AgentConfig], AbstractAsyncContextManager[Channel]]


class Session:
    """The control connection (a :class:`Connection`): the outbox and the server's clock
    outlive each session's channel."""

    def __init__(self, config: AgentConfig, *, stop: threading.Event) -> None:
        self.config = config
        self.stop = stop
        self._offset_s = 0.0  # server clock - local clock
        self.rtt_s = 0.0  # shortest round trip to the server seen
        self._outbox: deque[Message] = deque()
        # events batches sent and not yet answered with ``stored``, in order: sent again on the
        # next connection when this one closes first (the server stores a batch once); a
        # batch the server refused is answered with an error instead, in the same order
        self._unanswered: deque[Events] = deque()
        self._stream = secrets.token_hex(8)  # this agent process's events stream
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self.connected = threading.Event()

    @property
    def offset_s(self) -> float:
        return self._offset_s

    def server_time(self) -> float:
        return time.time() + self._offset_s

    def post(self, message: Message) -> None:
        with self._lock:
            if isinstance(message, Events):
                message = replace(message, stream=self._stream, seq=next(self._seq))
            self._outbox.append(message)

    def unanswered(self) -> int:
        """Events batches sent on this connection that the server has not answered yet."""
        with self._lock:
            return len(self._unanswered)

    def pending(self) -> list[dict[str, Any]]:
        """What waits in the outbox, as it will be sent."""
        with self._lock:
            return [m.to_json() for m in self._outbox]

    async def serve(self, agent: SessionAgent, *,
                    connect_to: Connect = websocket_channel) -> None:
        """Connect, and reconnect with backoff, until ``stop`` is set."""
        backoff = 0.5
        server = self.config.enrolment.server
        while not self.stop.is_set():
            try:
                async with connect_to(self.config) as channel:
                    backoff = 0.5
                    await self.run(channel, agent)
            except (TimeoutError, OSError, ChannelClosed,
                    websockets.exceptions.WebSocketException) as exc:
                if isinstance(exc, SessionRefused):
                    log.error("%s refused this agent's session: %s", server, exc)
                elif isinstance(exc, websockets.exceptions.InvalidStatus):
                    log.error("the server refused this agent (%s): is it enrolled, or retired?",
                              exc.response.status_code)
                else:
                    log.warning("connection to %s lost: %s", server, exc)
            finally:
                self.connected.clear()
            if self.stop.is_set():
                break
            delay = min(self.config.max_backoff_s, backoff) * random.uniform(0.5, 1.5)
            backoff *= 2
            log.info("reconnecting in %.1f s", delay)
            await asyncio.get_running_loop().run_in_executor(None, self.stop.wait, delay)

    async def run(self, channel: Channel, agent: SessionAgent) -> None:
        """One session over ``channel``, until it closes or the agent stops."""
        await channel.send(agent.hello().to_json())
        early: list[Any] = []
        welcome = await self._await_reply(channel, Welcome, early, asked="hello")
        log.info("connected to %s as %s (%s)", self.config.enrolment.server, welcome.device,
                 welcome.name)
        await self._sync_clock(channel, early)
        self.post(LinkReport(latency_s=min(60.0, self.config.latency_s + self.rtt_s / 2),
                             bandwidth_bps=self.config.bandwidth_bps))
        with self._lock:  # what the last connection left unanswered goes first, in order
            self._outbox.extendleft(reversed(self._unanswered))
            self._unanswered.clear()
        self.connected.set()
        for raw in early:
            await self._dispatch(raw, agent)
        tasks = [asyncio.create_task(coro) for coro in (
            self._receive(channel, agent), self._heartbeat(agent), self._send(channel, agent),
            self._watch_stop(channel, agent))]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def _await_reply(self, channel: Channel, kind: type[M], early: list[Any], *,
                           asked: str) -> M:
        while True:
            raw = await asyncio.wait_for(channel.receive(), timeout=REPLY_TIMEOUT_S)
            what = raw.get("type") if isinstance(raw, dict) else None
            if what == kind.TYPE:
                return kind.from_json(raw)
            if what == ErrorReply.TYPE:
                raise SessionRefused(f"the server refused its {asked}: {raw.get('detail')}")
            early.append(raw)

    async def _sync_clock(self, channel: Channel, early: list[Any]) -> None:
        """NTP-style: offset = server time - midpoint of the round trip, from the ping with
        the shortest round trip (the least queueing)."""
        best: tuple[float, float] | None = None
        for i in range(PINGS):
            sent = time.time()
            await channel.send(Ping(id=i).to_json())
            pong = await self._await_reply(channel, Pong, early, asked="ping")
            received = time.time()
            rtt = received - sent
            offset = pong.server_time - (sent + received) / 2
            if best is None or rtt < best[0]:
                best = (rtt, offset)
        assert best is not None
        self.rtt_s, self._offset_s = best
        log.info("clock offset to the server %.2f ms (round trip %.2f ms)",
                 1e3 * self._offset_s, 1e3 * self.rtt_s)

    async def _dispatch(self, raw: Any, agent: SessionAgent) -> None:
        if isinstance(raw, dict) and raw.get("type") == Command.TYPE:
            if agent.blocks(raw):
                # building a stage loads a model, a data set and maybe weights from peers;
                # halting waits for the stage to stop: not on the event loop
                loop = asyncio.get_running_loop()
                self.post(await loop.run_in_executor(None, agent.handle_command, raw))
            else:
                self.post(agent.handle_command(raw))
            return
        try:
            message = parse_server_message(raw)
        except ProtocolError as exc:
            log.warning("ignored a malformed message from the server: %s", exc)
            return
        if isinstance(message, ErrorReply):
            log.warning("the server refused a %s: %s", message.in_reply_to, message.detail)
            if message.in_reply_to == Events.TYPE:
                self._answered(None)
        elif isinstance(message, Stored):
            if message.refused:
                log.warning("the server refused %d metric point(s) of run %s: %s %s",
                            len(message.refused), message.run,
                            message.refused[0].get("field"), message.refused[0].get("reason"))
            self._answered(message.seq)

    def _answered(self, seq: int | None) -> None:
        """An events batch was answered (``seq``: up to it; None: the oldest, refused): the
        server handles a connection's messages in order."""
        with self._lock:
            while self._unanswered and (seq is None or (self._unanswered[0].seq or 0) <= seq):
                self._unanswered.popleft()
                if seq is None:
                    break

    async def _receive(self, channel: Channel, agent: SessionAgent) -> None:
        while True:
            await self._dispatch(await channel.receive(), agent)

    async def _heartbeat(self, agent: SessionAgent) -> None:
        while True:
            self.post(agent.heartbeat())
            await asyncio.sleep(self.config.heartbeat_s)

    async def _send(self, channel: Channel, agent: SessionAgent) -> None:
        while True:
            agent.flush()
            while True:
                with self._lock:
                    if not self._outbox:
                        break
                    message = self._outbox[0]
                await channel.send(message.to_json())
                with self._lock:
                    self._outbox.popleft()
                    if isinstance(message, Events):
                        self._unanswered.append(message)
            await asyncio.sleep(self.config.flush_s)

    async def _watch_stop(self, channel: Channel, agent: SessionAgent) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.stop.wait)
        agent.stopping()
        agent.flush()
        await channel.close()
