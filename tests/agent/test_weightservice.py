"""The weight service alone: restoring a stage from its own memory, a peer and the server,
chain replicas and global uploads, answering fetches; against an in-process data plane and a
fake server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from agent.executor import StageError
from agent.weights import (
    Entry,
    WeightStore,
    from_bytes,
    select,
    snapshot,
    state_refs,
    to_bytes,
)
from agent.weightservice import WeightService
from agent.wire import Message, decode
from agent.zoo import build_model
from orchestrator.protocol import HeldCopy, ProtocolError, RestorePart, StageSpec

DEVICES = (("a",), ("b",))


class Network:
    """In-process data planes: a send reaches the peer's weight service at once (as the
    receiver thread hands it), or the peer's mailbox for a fetch's answer."""

    def __init__(self) -> None:
        self.services: dict[str, WeightService] = {}
        self.mailboxes: dict[str, dict[tuple[Any, ...], Message]] = {}
        self.sent: list[tuple[str, str, str]] = []  # (from, to, name)

    def plane(self, uid: str) -> Plane:
        self.mailboxes[uid] = {}
        return Plane(self, uid)


class Plane:
    def __init__(self, network: Network, uid: str) -> None:
        self.network, self.uid = network, uid
        self.connected: dict[str, str] = {}

    def repoint(self, peer: str, address: str) -> None:
        self.connected[peer] = address

    def reopen(self, peer: str) -> None:
        pass

    def send(self, peer: str, frames: list[bytes]) -> None:
        assert peer in self.connected or peer in self.network.services, peer
        message = decode(frames, sender=self.uid)  # as the receiver's authenticator names it
        name = message.header.name or ""
        self.network.sent.append((self.uid, peer, name))
        if name.startswith("fetched:"):
            h = message.header
            self.network.mailboxes[peer][(h.run, h.kind, h.microbatch, h.name)] = message
        else:
            self.network.services[peer].on_weights(message)

    def receive(self, run: int, kind: str, microbatch: int, *, name: str | None = None,
                timeout_s: float | None = None) -> Message:
        box = self.network.mailboxes[self.uid]
        key = (run, kind, microbatch, name)
        if key not in box:
            raise TimeoutError(f"no {name}")
        return box.pop(key)


class FakeServer:
    def __init__(self) -> None:
        self.replicas: dict[tuple[int, int, int, int], bytes] = {}
        self.put_seen = threading.Event()

    def get(self, run: int, first: int, last: int, applied: int) -> bytes:
        """The asked layers out of a replica that covers them (the real one merges)."""
        for (r, f, e, v), data in self.replicas.items():
            if (r, v) == (run, applied) and f <= first <= last <= e:
                part = select(from_bytes(data, first=f, last=e), first, last)
                return to_bytes(part, run=run, first=first, last=last, applied=applied)
        raise StageError(f"the server has no layers {first}..{last} at {applied} updates")

    def put(self, run: int, first: int, last: int, applied: int, data: bytes) -> None:
        self.replicas[(run, first, last, applied)] = data
        self.put_seen.set()


def spec(device: str, stage: int, layers: tuple[int, int], **fields: Any) -> StageSpec:
    return StageSpec(run=1, device=device, stage=stage, layers=layers, model="mlp",
                     dataset="digits", batch_size=8, schedule="1f1b", stage_devices=DEVICES,
                     stage_times_s=((1.0,), (1.0,)), microbatches=40, **fields)


def stage_module(first: int, last: int, seed: int) -> torch.nn.Module:
    return build_model("mlp", input_shape=(64,), num_classes=10, seed=seed).stage(first, last)


@pytest.fixture
def network() -> Iterator[tuple[Network, FakeServer, threading.Event]]:
    net, server, stop = Network(), FakeServer(), threading.Event()
    for uid, port in (("a", 1), ("b", 2)):
        net.services[uid] = WeightService(uid=uid, plane=net.plane(uid),
                                          reply_to=lambda port=port: f"tcp://127.0.0.1:{port}",
                                          server=server, stop=stop, fetch_timeout_s=1.0)
    # the run deployed: a holds stage 0 (layers 0..1), b stage 1 (2..3); each replicates to
    # the other
    net.services["a"].deployed(spec("a", 0, (0, 1)))
    net.services["b"].deployed(spec("b", 1, (2, 3)))
    yield net, server, stop
    stop.set()


def weights_of(module: torch.nn.Module, first: int) -> dict[str, torch.Tensor]:
    return snapshot(state_refs(module, first))


def test_a_chain_replica_is_kept_and_a_fetch_answered_from_it(network: Any) -> None:
    # Prepare: stage 0 (device a) replicates its layers 0..1 at 8 updates to b
    net, _, _ = network
    a, b = net.services["a"], net.services["b"]
    trained = stage_module(0, 1, seed=1)
    # Execute
    a.replicate(spec("a", 0, (0, 1)), 8, weights_of(trained, 0), chain=True, central=False)
    # Assert: b holds it; a recovering a fetches it back from b
    assert b.holdings(1) == (HeldCopy(layers=(0, 1), applied=8, kind="replica"),)
    assert net.sent == [("a", "b", "replica:0-1")]
    fresh = stage_module(0, 1, seed=2)
    restored = a.restore(spec("a", 0, (0, 1), first_microbatch=8, generation=1), fresh,
                         [RestorePart(layers=(0, 1), applied=8, source="b")],
                         {"b": "tcp://127.0.0.1:2"})
    assert restored.bytes_moved > 0
    for x, y in zip(fresh.parameters(), trained.parameters(), strict=True):
        assert torch.equal(x, y)
    assert [name for _, _, name in net.sent[1:]] == ["fetch:1:0-1:a=tcp://127.0.0.1:1",
                                                     "fetched:1"]


def test_a_fetch_of_what_the_peer_does_not_hold_is_refused_by_name(network: Any) -> None:
    net, _, _ = network
    with pytest.raises(StageError, match=r"b holds no layers 0\.\.1 at 8 updates"):
        net.services["a"].restore(
            spec("a", 0, (0, 1), first_microbatch=8, generation=1), stage_module(0, 1, 2),
            [RestorePart(layers=(0, 1), applied=8, source="b")], {"b": "tcp://127.0.0.1:2"})


def test_a_restore_from_its_own_memory_and_the_server(network: Any) -> None:
    # Prepare: a holds layer 2 at 8 updates itself; the server has layer 3 (a global replica
    # b uploaded)
    net, server, _ = network
    a, b = net.services["a"], net.services["b"]
    trained = stage_module(2, 3, seed=1)
    tensors = weights_of(trained, 2)
    own = {k: v for k, v in tensors.items() if k.startswith("2.")}
    a.store(1).add(Entry(layers=(2, 2), applied=8, kind="own", tensors=own, pinned=True,
                         generation=0))
    b.replicate(spec("b", 1, (2, 3)), 8, tensors, chain=False, central=True)
    assert server.put_seen.wait(5)
    # Execute
    fresh = stage_module(2, 3, seed=2)
    restored = a.restore(spec("a", 0, (2, 3), first_microbatch=8, generation=1), fresh,
                         [RestorePart(layers=(2, 2), applied=8, source="self"),
                          RestorePart(layers=(3, 3), applied=8, source="central")], {})
    # Assert: everything came, only the server's part crossed the network
    for x, y in zip(fresh.parameters(), trained.parameters(), strict=True):
        assert torch.equal(x, y)
    assert 0 < restored.bytes_moved < len(to_bytes(tensors, run=1, first=2, last=3, applied=8))


@pytest.mark.parametrize(("part", "says"), [
    (RestorePart(layers=(0, 1), applied=7, source="self"), "applied 7 is not the resume point"),
    (RestorePart(layers=(0, 5), applied=8, source="self"), "layers 0..5 are not in the stage"),
    (RestorePart(layers=(0, 1), applied=8, source="self"), "this agent holds no layers 0..1"),
    (RestorePart(layers=(0, 1), applied=8, source="c"), "no data-plane address for c"),
    (RestorePart(layers=(0, 1), applied=8, source="central"), "the server has no layers"),
])
def test_a_restore_that_cannot_be_done_is_refused(network: Any, part: RestorePart,
                                                  says: str) -> None:
    net, _, _ = network
    with pytest.raises(StageError, match=says):
        net.services["a"].restore(spec("a", 0, (0, 1), first_microbatch=8, generation=1),
                                  stage_module(0, 1, 2), [part], {})


def test_nothing_to_restore_before_anything_was_trained(network: Any) -> None:
    net, _, _ = network
    restored = net.services["a"].restore(spec("a", 0, (0, 1), generation=1),
                                         stage_module(0, 1, 2), [], {})
    assert restored.tensors == {} and restored.bytes_moved == 0


def test_a_malformed_weights_message_is_refused_by_name(network: Any) -> None:
    from agent.weights import blob_tensor
    from agent.wire import encode

    net, _, _ = network
    for name in ("pickle:0", "fetch:1:0-1:a=http://x:1", "fetched:3"):
        frames = encode(run=1, kind="weights", microbatch=0, version=0,
                        tensor=blob_tensor(b""), name=name)
        with pytest.raises(ProtocolError):
            net.services["b"].on_weights(decode(frames))
    assert net.services["b"].holdings(1) == ()


def test_a_fetch_is_answered_only_to_the_peer_that_sent_it(network: Any) -> None:
    # a peer that names another device as the requester (with its own address to reply to)
    # re-pointed that device's link and received its weights; the data plane's authenticator
    # says who sent a message, and a fetch must come from the device it names
    from agent.weights import blob_tensor
    from agent.wire import encode

    net, _, _ = network
    a, b = net.services["a"], net.services["b"]
    a.replicate(spec("a", 0, (0, 1)), 8, weights_of(stage_module(0, 1, 1), 0), chain=True,
                central=False)
    sent_before = list(net.sent)
    frames = encode(run=1, kind="weights", microbatch=8, version=0, tensor=blob_tensor(b""),
                    name="fetch:5:0-1:a=tcp://10.6.6.6:6666")
    with pytest.raises(ProtocolError, match="a fetch naming 'a' came from mallory"):
        b.on_weights(decode(frames, sender="mallory"))
    assert net.sent == sent_before and "a" not in b.plane.connected  # type: ignore[attr-defined]


def test_uploads_go_oldest_first(network: Any) -> None:
    net, server, _ = network
    order: list[int] = []
    put = server.put
    server.put = lambda run, first, last, applied, data: (order.append(applied),
                                                          put(run, first, last, applied, data))
    tensors = weights_of(stage_module(0, 1, 1), 0)
    for applied in (8, 16, 24):
        net.services["a"].replicate(spec("a", 0, (0, 1)), applied, tensors, chain=False,
                                    central=True)
    deadline = time.monotonic() + 5
    while len(order) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert order == [8, 16, 24]
    assert isinstance(net.services["a"].store(1), WeightStore)


def test_a_new_generation_drops_what_older_ones_had_still_to_upload(network: Any) -> None:
    # a stage far ahead of the others had global replicas queued behind a slow server when the
    # run halted; uploaded after the recovery, they were the newest of their layers (training
    # the recovery abandoned) and the server dropped the replica it restored from for them
    net, server, _ = network
    putting, release, order = threading.Event(), threading.Event(), []
    put = server.put

    def slow_put(run: int, first: int, last: int, applied: int, data: bytes) -> None:
        putting.set()
        release.wait(10)
        order.append(applied)
        put(run, first, last, applied, data)

    server.put = slow_put
    a = net.services["a"]
    tensors = weights_of(stage_module(0, 1, 1), 0)
    for applied in (8, 16, 24):
        a.replicate(spec("a", 0, (0, 1)), applied, tensors, chain=False, central=True)
    assert putting.wait(5)  # 8 on its way, 16 and 24 waiting
    a.commit(1, 1)  # generation 1 resumes at 12
    release.set()
    resumed = spec("a", 0, (0, 1), generation=1, first_microbatch=12)
    assert a.upload(resumed, 12, tensors, wait_s=10) is True
    assert order == [8, 12]
    assert sorted(applied for _, _, _, applied in server.replicas) == [8, 12]
