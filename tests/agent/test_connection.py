"""The control connection and the command dispatch, without a server: a real AgentRuntime
whose session runs over an in-process channel pair to a test playing the server."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest

from agent.config import AgentConfig
from agent.connection import Channel, Session
from agent.handlers import CommandHandlers
from agent.runtime import AgentRuntime
from orchestrator.protocol import COMMANDS, PROTOCOL, Hello, ProbeCommand
from tests.agent.harness import FakeServer, channel_pair
from tests.agent.test_runtime import ENROLMENT, spec

CONFIG = AgentConfig(enrolment=ENROLMENT, heartbeat_s=0.05, flush_s=0.01, max_backoff_s=0.05)

KEY = 'Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID'  # a peer's CURVE public key (Z85)


def connect_through(servers: asyncio.Queue[FakeServer]
                    ) -> Callable[[AgentConfig], Any]:
    """A ``connect_to`` for Session.serve: each connection is a new pair, whose server end
    goes to ``servers``."""

    @asynccontextmanager
    async def connect(config: AgentConfig) -> AsyncIterator[Channel]:
        agent, server = channel_pair()
        await servers.put(FakeServer(server, device=config.enrolment.uid))
        try:
            yield agent
        finally:
            await agent.close()

    return connect


def run_session(scenario: Callable[[AgentRuntime, asyncio.Queue[FakeServer]], Any],
                config: AgentConfig = CONFIG) -> Any:
    """Serve ``runtime`` over in-process pairs while ``scenario`` plays the server."""
    runtime = AgentRuntime(config, stop=threading.Event())

    async def main() -> Any:
        servers: asyncio.Queue[FakeServer] = asyncio.Queue()
        serving = asyncio.create_task(runtime.serve(connect_to=connect_through(servers)))
        try:
            return await asyncio.wait_for(scenario(runtime, servers), timeout=60)
        finally:
            runtime.stop.set()
            await asyncio.wait_for(serving, timeout=10)

    try:
        return asyncio.run(main())
    finally:
        runtime.close()


def test_a_session_says_hello_syncs_its_clock_and_answers_commands() -> None:
    async def scenario(runtime: AgentRuntime, servers: asyncio.Queue[FakeServer]) -> Any:
        server = await servers.get()
        hello = await server.greet()
        link = await server.expect("link")
        heartbeat = await server.expect("heartbeat", status="online")
        await server.channel.send(ProbeCommand(id="p1", run=7).to_json())
        probe = await server.expect("ack", id="p1")
        await server.channel.send({"type": "command", "id": "t1", "command": "teleport"})
        teleport = await server.expect("ack", id="t1")
        await server.channel.send({"type": "command", "id": "d1", "command": "deploy",
                                   "run": 7, "spec": spec(), "peers": {}})
        deploy = await server.expect("ack", id="d1")
        await server.channel.send({"type": "error", "detail": "x", "field": None,
                                   "in_reply_to": "events"})  # logged, nothing else
        await server.channel.send({"type": "command", "id": "d2", "command": "deploy",
                                   "run": 7, "spec": spec(),
                                   "peers": {"edge-other": "tcp://127.0.0.1:9"},
                                   "keys": {"edge-other": KEY}})
        deployed = await server.expect("ack", id="d2")
        return hello, link, heartbeat, probe, teleport, deploy, deployed, runtime

    hello, link, heartbeat, probe, teleport, deploy, deployed, runtime = run_session(scenario)
    # the hello is the typed one, with this agent's data plane and protocol version
    assert Hello.from_json(hello).data_address == runtime.advertised_address
    assert hello["protocol"] == PROTOCOL == 2
    # the server's clock runs 100 s ahead of this one: the offset the pings measured
    assert runtime.connection.offset_s == pytest.approx(100.0, abs=0.5)
    assert link["latency_s"] >= 0 and heartbeat["load"]["loadavg_1m"] >= 0
    assert probe == {"type": "ack", "id": "p1", "command": "probe", "run": 7, "ok": True,
                     "holds": False}
    assert teleport["ok"] is False and "unknown command 'teleport'" in teleport["error"]
    assert deploy["ok"] is False and "no data-plane address for neighbour" in deploy["error"]
    # the ack names the stage (a device may hold several of a run: split learning)
    assert deployed == {"type": "ack", "id": "d2", "command": "deploy", "run": 7, "ok": True,
                        "generation": 0, "pipeline": 0, "stage": 0}


def test_what_was_posted_while_disconnected_is_sent_after_reconnecting() -> None:
    async def scenario(runtime: AgentRuntime, servers: asyncio.Queue[FakeServer]) -> Any:
        first = await servers.get()
        await first.greet()
        await first.expect("link")
        await first.channel.close()  # the server went away
        runtime.connection.post(replace(
            runtime.heartbeat(), status="busy"))  # posted while disconnected
        second = await servers.get()  # the agent reconnected, with backoff
        hello = await second.greet()
        return hello, await second.expect("heartbeat", status="busy")

    hello, kept = run_session(scenario)
    assert hello["type"] == "hello" and kept["status"] == "busy"


def test_a_session_the_server_refuses_ends_and_is_tried_again() -> None:
    async def scenario(runtime: AgentRuntime, servers: asyncio.Queue[FakeServer]) -> Any:
        first = await servers.get()
        await first.channel.receive()  # the hello
        await first.channel.send({"type": "error", "detail": "data_address: bad",
                                  "field": "data_address", "in_reply_to": "hello"})
        second = await servers.get()
        return await second.greet()

    assert run_session(scenario)["type"] == "hello"


def test_a_refused_hello_is_logged_as_an_error_naming_the_reason(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(runtime: AgentRuntime, servers: asyncio.Queue[FakeServer]) -> Any:
        first = await servers.get()
        await first.channel.receive()  # the hello
        await first.channel.send({"type": "error", "detail": "protocol: upgrade the server",
                                  "field": "protocol", "in_reply_to": "hello"})
        return await (await servers.get()).greet()  # and it tries again

    with caplog.at_level(logging.ERROR, logger="edgepipe.agent"):
        assert run_session(scenario)["type"] == "hello"
    assert any(r.levelno == logging.ERROR and "refused this agent's session: the server "
               "refused its hello: protocol: upgrade the server" in r.getMessage()
               for r in caplog.records), caplog.text


def test_every_command_has_one_handler() -> None:
    runtime = AgentRuntime(CONFIG, stop=threading.Event())
    try:
        handlers: CommandHandlers = runtime.handlers
        assert set(handlers.table) == set(COMMANDS.values())
        assert [c for c in COMMANDS if handlers.blocks({"command": c})] == ["deploy", "halt"]
    finally:
        runtime.close()


def test_a_session_over_a_fake_channel_needs_no_network() -> None:
    # the Session alone, driven by hand: its outbox keeps typed messages in order
    session = Session(CONFIG, stop=threading.Event())
    session.post(ProbeCommand(id="x", run=1))  # any message: the outbox does not look
    assert session.pending() == [{"type": "command", "id": "x", "command": "probe", "run": 1}]


def test_an_events_batch_unanswered_when_the_connection_closed_is_sent_again() -> None:
    # the web server killed while a batch was on its way: the batch was lost with the
    # connection, and its device's events with it; the agent keeps what it sent until the
    # server's ``stored``, and sends it again (same stream and number) on the next connection
    from orchestrator.protocol import Events

    async def scenario(runtime: AgentRuntime, servers: asyncio.Queue[FakeServer]) -> Any:
        first = await servers.get()
        await first.greet()
        await first.expect("link")
        runtime.connection.post(Events(run=7, timeline=({"kind": "forward"},)))
        runtime.connection.post(Events(run=7, timeline=({"kind": "backward"},)))
        one = await first.expect("events")
        two = await first.expect("events")
        await first.channel.send({"type": "stored", "run": 7, "timeline": 1, "faults": 0,
                                  "metrics": 0, "seq": one["seq"]})
        deadline = time.monotonic() + 30
        while runtime.connection.unanswered() != 1:  # the answer was read before the close
            assert time.monotonic() < deadline, runtime.connection.unanswered()
            await asyncio.sleep(0.01)
        await first.channel.close()  # the second batch's answer never came
        second = await servers.get()
        await second.greet()
        again = await second.expect("events")
        runtime.connection.post(Events(run=7, timeline=({"kind": "update"},)))
        three = await second.expect("events")
        return one, two, again, three

    one, two, again, three = run_session(scenario)
    assert again == two and again["seq"] == one["seq"] + 1
    assert three["stream"] == one["stream"] and three["seq"] == two["seq"] + 1
