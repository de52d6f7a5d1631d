"""Test doubles for the agent's control connection: an in-process channel pair that connects
a real session (agent.connection) to a test playing the server."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from agent.connection import ChannelClosed

_CLOSED = object()


class InProcessChannel:
    """One end of a pair: what one end sends, the other receives (through JSON, as on the
    wire)."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.peer: InProcessChannel | None = None
        self.closed = False

    async def send(self, message: dict[str, Any]) -> None:
        if self.closed or self.peer is None or self.peer.closed:
            raise ChannelClosed("the other end closed")
        await self.peer.inbox.put(json.loads(json.dumps(message)))

    async def receive(self) -> Any:
        raw = await self.inbox.get()
        if raw is _CLOSED:
            raise ChannelClosed("closed")
        return raw

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self.inbox.put(_CLOSED)
            if self.peer is not None:
                await self.peer.inbox.put(_CLOSED)


def channel_pair() -> tuple[InProcessChannel, InProcessChannel]:
    """(the agent's end, the server's end)."""
    agent, server = InProcessChannel(), InProcessChannel()
    agent.peer, server.peer = server, agent
    return agent, server


class FakeServer:
    """The server's end of a pair, answering a session's hello and pings as the gateway
    does, and collecting everything else the agent sends."""

    def __init__(self, channel: InProcessChannel, *, device: str) -> None:
        self.channel = channel
        self.device = device
        self.received: list[dict[str, Any]] = []

    async def greet(self) -> dict[str, Any]:
        """Take the hello, welcome it, answer the clock pings; the hello."""
        hello = await self.channel.receive()
        await self.channel.send({"type": "welcome", "device": self.device, "name": "edge"})
        for _ in range(8):
            ping = await self.channel.receive()
            await self.channel.send({"type": "pong", "id": ping["id"],
                                     "server_time": time.time() + 100.0})
        return dict(hello)

    async def expect(self, kind: str, *, timeout_s: float = 30.0, **fields: Any
                     ) -> dict[str, Any]:
        """The next message of type ``kind`` (with these fields), keeping the others."""
        deadline = time.monotonic() + timeout_s
        while True:
            for message in self.received:
                if message["type"] == kind and all(message.get(k) == v
                                                   for k, v in fields.items()):
                    self.received.remove(message)
                    return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {kind} {fields} among {self.received}")
            self.received.append(await asyncio.wait_for(self.channel.receive(), remaining))
