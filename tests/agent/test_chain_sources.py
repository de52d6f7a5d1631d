"""A stage keeps a chain replica only from the device that replicates to it in the run's
deployment here (issue 28): the first device of the stage before, of the same generation,
with that stage's layers. Any other peer of the run (admitted: it may fetch weights) is
refused, and the data plane goes on. Real data planes over CURVE, as the server links them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from agent.transport import DataPlane
from agent.weights import blob_tensor, snapshot, state_refs, to_bytes
from agent.weightservice import WeightService
from agent.wire import encode
from agent.zoo import build_model
from orchestrator.protocol import HeldCopy, StageSpec
from tests.agent.planes import wait_for

DEVICES = (("a",), ("b",), ("c",))
LAYERS = {"a": (0, 1), "b": (2, 2), "c": (3, 3)}


class NoServer:
    def get(self, run: int, first: int, last: int, applied: int) -> bytes:
        raise AssertionError("no global replica is asked for")

    def put(self, run: int, first: int, last: int, applied: int, data: bytes) -> None:
        raise AssertionError("no global replica is sent")


def spec(device: str, **fields: Any) -> StageSpec:
    return StageSpec(run=1, device=device, stage=[d for (d,) in DEVICES].index(device),
                     layers=LAYERS[device], model="mlp", dataset="digits", batch_size=8,
                     schedule="1f1b", stage_devices=DEVICES,
                     stage_times_s=((1.0,), (1.0,), (1.0,)), microbatches=40, **fields)


class Agent:
    """A data plane and the weight service behind it, as agent.runtime composes them."""

    def __init__(self, uid: str, stop: threading.Event) -> None:
        self.rejected: list[str] = []
        self.plane = DataPlane(bind="tcp://127.0.0.1:0", identity=uid,
                               on_reject=self.rejected.append,
                               on_weights=lambda message: self.weights.on_weights(message))
        self.weights = WeightService(uid=uid, plane=self.plane,
                                     reply_to=lambda: self.plane.address, server=NoServer(),
                                     stop=stop)


@pytest.fixture
def agents() -> Iterator[dict[str, Agent]]:
    stop = threading.Event()
    made = {uid: Agent(uid, stop) for (uid,) in DEVICES}
    for uid, agent in made.items():  # every device of the run knows and admits the others
        for peer, other in made.items():
            if peer != uid:
                agent.plane.connect(peer, other.plane.address, other.plane.public_key)
    for uid, agent in made.items():
        agent.weights.deployed(spec(uid))
    yield made
    stop.set()
    for agent in made.values():
        agent.plane.close()



def weights(layers: tuple[int, int]) -> dict[str, torch.Tensor]:
    first, last = layers
    module = build_model("mlp", input_shape=(64,), num_classes=10, seed=3).stage(first, last)
    return snapshot(state_refs(module, first))


def replica(layers: tuple[int, int], *, applied: int = 8, generation: int = 0) -> list[bytes]:
    """A chain replica's frames, of whatever layers a sender likes."""
    first, last = layers
    data = to_bytes(weights(layers), run=1, first=first, last=last, applied=applied)
    return encode(run=1, kind="weights", microbatch=applied, version=generation,
                  tensor=blob_tensor(data), name=f"replica:{first}-{last}")


def test_a_chain_replica_is_kept_only_from_the_device_that_replicates_to_the_stage(
        agents: dict[str, Agent]) -> None:
    # Prepare: b holds stage 1 (layer 2); a, stage 0's device, replicates to it; c is a peer
    # of the run too (stage 2), admitted to b's inbox, but replicates to a
    a, b, c = agents["a"], agents["b"], agents["c"]
    # Execute: c sends b stage 0's layers as if it were a; a sends layers that are not its
    # stage's, and its own of another generation
    c.plane.send("b", replica((0, 1)))
    c.plane.send("b", replica((2, 2)))
    a.plane.send("b", replica((0, 0)))
    a.plane.send("b", replica((0, 1), generation=1))
    # Assert: each refused, saying why; b kept none of them and its data plane goes on
    assert wait_for(lambda: len(b.rejected) == 4), b.rejected
    refusals = sorted(b.rejected)
    assert sum("from c: run 1's replicas to stage 1 come from a" in r for r in refusals) == 2
    assert any("not the layers of stage 0 (stage 1 holds 2..2)" in r for r in refusals)
    assert any("of generation 1, the stage here is of generation 0" in r for r in refusals)
    assert b.weights.holdings(1) == ()
    # a's own chain replica, as its stage sends it, is kept
    a.weights.replicate(spec("a"), 8, weights(LAYERS["a"]), chain=True, central=False)
    assert wait_for(lambda: b.weights.holdings(1) != ())
    assert b.weights.holdings(1) == (HeldCopy(layers=(0, 1), applied=8, kind="replica"),)
    # and the plane still takes everything else
    c.plane.send("b", encode(run=1, kind="activation", microbatch=0, version=0,
                             tensor=torch.ones(3)))
    assert b.plane.receive(1, "activation", 0, timeout_s=10).sender == "c"


def test_the_first_stage_keeps_the_last_stage_s_replica_only(agents: dict[str, Agent]) -> None:
    a, b, c = agents["a"], agents["b"], agents["c"]
    b.plane.send("a", replica((3, 3)))  # b is no device that replicates to a
    c.plane.send("a", replica((2, 3)))  # c, but not only its layers
    assert wait_for(lambda: len(a.rejected) == 2), a.rejected
    assert a.weights.holdings(1) == ()
    c.weights.replicate(spec("c"), 8, weights(LAYERS["c"]), chain=True, central=False)
    assert wait_for(lambda: a.weights.holdings(1) != ())
    assert a.weights.holdings(1) == (HeldCopy(layers=(3, 3), applied=8, kind="replica"),)


def test_a_stage_not_deployed_here_keeps_no_replica(agents: dict[str, Agent]) -> None:
    a, b = agents["a"], agents["b"]
    b.weights.forget(1)  # the run stopped here
    a.weights.replicate(spec("a"), 8, weights(LAYERS["a"]), chain=True, central=False)
    assert wait_for(lambda: len(b.rejected) == 1)
    assert "no stage of run 1 is deployed here" in b.rejected[0]
    assert b.weights.holdings(1) == ()
