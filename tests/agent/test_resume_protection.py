"""A generation that resumes from copies has its weights at the resume point kept before it says
it is ready (issue 28): in its own memory, and on the server when the run keeps global replicas.
The commit that follows makes every survivor drop its older copies; a device lost before the
new layout's first replicas took the only copy of its layers with it, and the run started
again from its seed. The commands are those the server sends."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from agent.config import AgentConfig
from agent.runtime import AgentRuntime
from agent.weights import snapshot, state_refs, to_bytes
from agent.zoo import build_model
from orchestrator.protocol import HeldCopy
from tests.agent.test_runtime import ENROLMENT, command, spec


class Server:
    """The server's store of global replicas: it holds the run's layers 0..3 at 8 updates."""

    def __init__(self) -> None:
        self.puts: list[tuple[int, int, int, int]] = []

    def get(self, run: int, first: int, last: int, applied: int) -> bytes:
        module = build_model("mlp", input_shape=(64,), num_classes=10, seed=5).stage(first,
                                                                                   last)
        return to_bytes(snapshot(state_refs(module, first)), run=run, first=first, last=last,
                        applied=applied)

    def put(self, run: int, first: int, last: int, applied: int, data: bytes) -> None:
        self.puts.append((run, first, last, applied))


@pytest.fixture
def server() -> Server:
    return Server()


@pytest.fixture
def runtime(server: Server) -> Iterator[AgentRuntime]:
    agent = AgentRuntime(AgentConfig(enrolment=ENROLMENT), stop=threading.Event(),
                         replica_server=server)
    yield agent
    agent.close()


def resume(runtime: AgentRuntime, **fields: Any) -> None:
    """Deploy run 7's generation 1, resuming at 8 updates from the server's replica."""
    alone = spec(stage_devices=[[ENROLMENT.uid]], stage_times_s=[[1.0]], layers=[0, 3],
                 microbatches=40, generation=1, first_microbatch=8, **fields)
    ack = runtime.handle_command(command(
        "deploy", run=7, spec=alone, peers={},
        restore=[{"layers": [0, 3], "applied": 8, "source": "central"}]))
    assert ack.ok, ack


def test_a_resumed_generation_is_on_the_server_before_it_says_ready(
        runtime: AgentRuntime, server: Server) -> None:
    resume(runtime, global_every=16, chain_every=8)
    assert server.puts == [(7, 0, 3, 8)]  # before the ack
    assert runtime.weights.holdings(7) == (HeldCopy(layers=(0, 3), applied=8, kind="own"),)


def test_without_global_replicas_it_keeps_its_own_copy(runtime: AgentRuntime,
                                                       server: Server) -> None:
    resume(runtime, chain_every=8)
    assert server.puts == []
    assert runtime.weights.holdings(7) == (HeldCopy(layers=(0, 3), applied=8, kind="own"),)
