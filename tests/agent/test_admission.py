"""Who may reach an agent's inbox follows what the server says now (issue 28): the peers of the
runs the agent is deployed in and of a link measurement under way. A device a redeployment
leaves out, or the peers of a run that ended here, get nothing through: a new connection fails
the CURVE handshake, and what a connection opened before still brings is dropped. Real data
planes, real CURVE sockets; the commands are those the server sends."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import zmq

import agent.launch
from agent.config import AgentConfig
from agent.runtime import AgentRuntime
from agent.security import DataKeys
from agent.wire import encode
from tests.agent.planes import curve_socket, wait_for
from tests.agent.test_runtime import ENROLMENT, command, held, posted, spec

X, Y = "edge-x", "edge-y"


@pytest.fixture
def runtime() -> Iterator[AgentRuntime]:
    agent = AgentRuntime(AgentConfig(enrolment=ENROLMENT), stop=threading.Event())
    yield agent
    agent.close()


@pytest.fixture
def keys() -> dict[str, DataKeys]:
    return {X: DataKeys.generate(), Y: DataKeys.generate()}


Sockets = Callable[[DataKeys, AgentRuntime], zmq.Socket[bytes]]


@pytest.fixture
def sockets() -> Iterator[Sockets]:
    """Bare CURVE sockets to an agent's inbox (tests.agent.planes.curve_socket), closed after
    the test."""
    made: list[zmq.Socket[bytes]] = []

    def make(keys: DataKeys, runtime: AgentRuntime) -> zmq.Socket[bytes]:
        made.append(curve_socket(keys, runtime.plane))
        return made[-1]

    yield make
    for sock in made:
        sock.close()


def deploy(runtime: AgentRuntime, keys: dict[str, DataKeys], peers: list[str],
           **fields: Any) -> None:
    """Deploy run 7's only stage here, the run's other devices ``peers`` (the server names
    every device of the run)."""
    alone = spec(stage_devices=[[ENROLMENT.uid]], stage_times_s=[[1.0]], layers=[0, 3],
                 **fields)
    ack = runtime.handle_command(command(
        "deploy", run=7, spec=alone, peers={p: "tcp://127.0.0.1:9" for p in peers},
        keys={p: keys[p].public_text for p in peers},
        **({"restore": []} if fields.get("generation") else {})))
    assert ack.ok, ack



def gets_through(runtime: AgentRuntime, sock: zmq.Socket[bytes], microbatch: int,
                 sender: str) -> bool:
    """Whether a message sent on ``sock`` reaches the inbox as ``sender``'s, or the plane
    refuses it (the handshake, or the message: it says so)."""
    plane = runtime.plane
    refused, rejected = plane.authenticator.refused, plane.rejected
    frames = encode(run=7, kind="activation", microbatch=microbatch, version=0,
                    tensor=torch.ones(2))
    deadline = time.monotonic() + 10
    while True:
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
            break
        except zmq.Again:
            # no connection to send on: its reconnect was refused, and ZeroMQ does not try
            # again after a refused handshake (a blocking send here hung a CI run)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
    while time.monotonic() < deadline:
        try:
            got = plane.receive(7, "activation", microbatch, timeout_s=0.05)
        except TimeoutError:
            if plane.authenticator.refused > refused or plane.rejected > rejected:
                break
            continue
        assert got.sender == sender
        return True
    else:
        raise AssertionError(f"message {microbatch} neither arrived nor was refused")
    with pytest.raises(TimeoutError):
        plane.receive(7, "activation", microbatch, timeout_s=0.2)
    return False


def test_a_peer_a_redeployment_leaves_out_gets_nothing_through(
        runtime: AgentRuntime, keys: dict[str, DataKeys], sockets: Sockets) -> None:
    # Prepare: generation 0 names X and Y; both reach the inbox
    deploy(runtime, keys, [X, Y])
    early_x, early_y = sockets(keys[X], runtime), sockets(keys[Y], runtime)
    assert gets_through(runtime, early_x, 0, X)
    assert gets_through(runtime, early_y, 1, Y)
    # Execute: X is lost; the recovery halts the run and deploys generation 1 without it
    assert runtime.handle_command(command("halt", run=7, generation=1)).ok
    deploy(runtime, keys, [Y], generation=1)
    # Assert: X's connection, old or new, brings nothing; Y's still does
    assert not gets_through(runtime, early_x, 2, X)
    assert not gets_through(runtime, sockets(keys[X], runtime), 3, X)
    assert gets_through(runtime, early_y, 4, Y)
    # the run stopped: Y goes too
    assert runtime.handle_command(command("stop", run=7)).ok
    assert not gets_through(runtime, early_y, 5, Y)
    assert not gets_through(runtime, sockets(keys[Y], runtime), 6, Y)


def test_the_peers_of_a_run_that_ended_here_get_nothing_through(
        runtime: AgentRuntime, keys: dict[str, DataKeys], sockets: Sockets,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the server sends no stop when a run finishes: its peers go a grace period after the
    # run's stages here ended (a recovery of the rest of the pipeline may fetch from them)
    monkeypatch.setattr(agent.launch, "RUN_END_GRACE_S", 0.5)
    deploy(runtime, keys, [X], microbatches=8)
    early = sockets(keys[X], runtime)
    assert gets_through(runtime, early, 0, X)
    assert runtime.handle_command(command("start", run=7, started_at=time.time())).ok
    thread = held(runtime, 7).thread
    assert thread is not None
    thread.join(timeout=60)
    assert 7 not in runtime.deployments
    assert wait_for(lambda: not runtime.plane.authenticator.knows(keys[X].public))
    assert not gets_through(runtime, early, 1, X)
    assert not gets_through(runtime, sockets(keys[X], runtime), 2, X)


def test_a_measurements_peers_are_admitted_for_the_measurement_only(
        runtime: AgentRuntime, keys: dict[str, DataKeys], sockets: Sockets,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.handlers

    monkeypatch.setattr(agent.handlers, "MEASURE_GRACE_S", 0.2)
    measuring, measured = threading.Event(), threading.Event()

    def measure_link(peer: str) -> tuple[float, float]:  # a stand-in for the link
        measuring.set()
        measured.wait(30)
        return 1e6, 0.001

    monkeypatch.setattr(runtime.plane, "measure_link", measure_link)
    early = sockets(keys[X], runtime)
    assert runtime.handle_command(command(
        "measure", peers={X: "tcp://127.0.0.1:9"}, keys={X: keys[X].public_text})).ok
    assert measuring.wait(30)
    assert gets_through(runtime, early, 0, X)  # while they measure
    measured.set()
    assert wait_for(lambda: not runtime.plane.authenticator.knows(keys[X].public))
    assert not gets_through(runtime, early, 1, X)
    assert not gets_through(runtime, sockets(keys[X], runtime), 2, X)


def test_a_link_that_timed_out_is_measured_again_after_the_others(
        runtime: AgentRuntime, keys: dict[str, DataKeys], monkeypatch: pytest.MonkeyPatch) -> None:
    # X answers only late (its measure command came after the others'): its first try times
    # out, the second, after Y, is measured; the report names both (it named Y only, and the
    # server waited for X's link forever)
    tried: list[str] = []

    def measure_link(peer: str) -> tuple[float, float]:
        tried.append(peer)
        if tried.count(peer) == 1 and peer == X:
            raise TimeoutError(f"no pong from {peer}")
        return 1e6, 0.001

    monkeypatch.setattr(runtime.plane, "measure_link", measure_link)
    assert runtime.handle_command(command(
        "measure", peers={X: "tcp://127.0.0.1:9", Y: "tcp://127.0.0.1:9"},
        keys={X: keys[X].public_text, Y: keys[Y].public_text})).ok
    assert wait_for(lambda: posted(runtime, "links"))
    [report] = posted(runtime, "links")
    assert tried == [X, Y, X]
    assert sorted(link["peer"] for link in report["links"]) == [X, Y]


def test_a_fetch_is_asked_again_once_the_holder_admits_the_requester(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a device back after a loss joins the next generation and fetches weights from a holder
    # that no longer admits it (the redeployment without it revoked it), before the holder's
    # own deployment naming it again came: the holder refused the handshake, which ZeroMQ
    # does not try again; the fetch asks once more on a new connection
    import agent.weightservice
    from agent.weights import Entry
    from tests.agent.test_chain_sources import Agent, weights

    monkeypatch.setattr(agent.weightservice, "FETCH_RETRY_S", 0.5)
    stop = threading.Event()
    holder, back = Agent("h", stop), Agent("x", stop)
    try:
        holder.weights.store(1).add(Entry(layers=(0, 1), applied=8, kind="own",
                                          tensors=weights((0, 1)), pinned=True))
        back.plane.connect("h", holder.plane.address, holder.plane.public_key)

        def holder_deployed() -> None:  # its deployment naming x arrives after x's fetch
            assert wait_for(lambda: holder.plane.authenticator.refused >= 1)
            holder.plane.admit(("run", 1), {"x": back.plane.public_key})
            holder.plane.connect("x", back.plane.address, back.plane.public_key, admit=False)

        deployed = threading.Thread(target=holder_deployed)
        deployed.start()
        data = back.weights.fetch(1, "h", (0, 1), 8)
        deployed.join(timeout=10)
        assert len(data) > 0 and holder.plane.authenticator.refused >= 1
    finally:
        stop.set()
        holder.plane.close()
        back.plane.close()
