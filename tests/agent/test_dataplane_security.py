"""What a network peer can do to an agent's data plane: nothing unless the server named it (CURVE
keys), nothing that stops the receiver (any frame is refused with a reason), and no more of the
agent's memory than the inbox's bounds."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent.config import ConfigError
from agent.security import DataKeys, load_or_create_keys
from agent.transport import DataPlane
from agent.wire import Message, TransportError, decode, encode
from tests.agent.planes import curve_socket, link, wait_for

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
HEADER_FIELDS = st.fixed_dictionaries(
    {}, optional={"run": JSON | st.integers(), "kind": JSON | st.sampled_from(
        ["activation", "gradient", "weights", "probe", "grads"]),
        "microbatch": JSON | st.integers(), "version": JSON | st.integers(),
        "dtype": JSON | st.sampled_from(["float32", "int64", "uint8", "bool"]),
        "shape": JSON | st.lists(st.integers(min_value=-2, max_value=2**64), max_size=9),
        "name": JSON, "sent_at": JSON, "labels": JSON | st.integers(), "extra": JSON})



@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(header=HEADER_FIELDS | JSON, frames=st.lists(st.binary(max_size=64), max_size=3),
       raw=st.none() | st.binary(max_size=64))
@example(header={"run": 1, "kind": "activation", "microbatch": 0, "version": 0,
                 "dtype": "float32", "shape": [0, 2**63]}, frames=[b""], raw=None)
@example(header={"run": 1, "kind": "activation", "microbatch": 0, "version": 0,
                 "dtype": ["float32"], "shape": [1]}, frames=[b"\0" * 4], raw=None)
@example(header={}, frames=[b""], raw=b"[" * 2000 + b"]" * 2000)
def test_any_frames_decode_to_a_message_or_a_transport_error(
        header: object, frames: list[bytes], raw: bytes | None) -> None:
    first = raw if raw is not None else json.dumps(header).encode()
    try:
        message = decode([first, *frames], max_bytes=1024)
    except TransportError:
        return
    assert isinstance(message, Message) and message.nbytes <= 1024


def test_the_receiver_refuses_every_bad_frame_and_goes_on() -> None:
    # a shape of [0, 2**63] (TypeError), a header nested 2,000 deep (RecursionError), and
    # frames no message has: each killed the receive thread while the agent looked online
    rejected: list[str] = []
    b = DataPlane(bind="tcp://127.0.0.1:0", on_reject=rejected.append)
    keys = DataKeys.generate()
    b.connect("peer", "tcp://127.0.0.1:9", keys.public)
    sock = curve_socket(keys, b)
    bad = [
        [json.dumps({"run": 1, "kind": "activation", "microbatch": 0, "version": 0,
                     "dtype": "float32", "shape": [0, 2**63]}).encode(), b""],
        [b"[" * 2000 + b"]" * 2000, b""],
        [json.dumps({"run": 1, "kind": "activation", "microbatch": 0, "version": 0,
                     "dtype": {"a": 1}, "shape": [1]}).encode(), b"\0" * 4],
        [b"\xff\xfe", b""], [b"{}"], [b"{}", b"", b"", b""],
        # the inbox keeps four frames of a message and reads the rest away, unheld
        [b"{}"] + [b"x" * 1000] * 5000,
    ]
    try:
        for frames in bad:
            sock.send_multipart(frames)
        assert wait_for(lambda: len(rejected) == len(bad)), rejected
        assert all("from peer" in r for r in rejected) and b.pending() == 0
        assert "got more than 3" in rejected[-1]
        sock.send_multipart(encode(run=1, kind="gradient", microbatch=4, version=0,
                                   tensor=torch.ones(3)))
        got = b.receive(1, "gradient", 4, timeout_s=10)
        assert got.sender == "peer" and got.tensor.sum().item() == 3
    finally:
        sock.close()
        b.close()


def test_only_peers_the_server_named_get_through() -> None:
    b = DataPlane(bind="tcp://127.0.0.1:0", identity="b")
    named = DataPlane(bind="tcp://127.0.0.1:0", identity="a")
    stranger = DataPlane(bind="tcp://127.0.0.1:0", identity="a")
    try:
        b.connect("a", named.address, named.public_key)
        for plane in (named, stranger):
            plane.connect("b", b.address, b.public_key)
        stranger.send("b", encode(run=1, kind="gradient", microbatch=0, version=0,
                                  tensor=torch.zeros(2)))
        assert wait_for(lambda: b.authenticator.refused >= 1)
        named.send("b", encode(run=1, kind="gradient", microbatch=1, version=0,
                               tensor=torch.ones(2)))
        assert b.receive(1, "gradient", 1, timeout_s=10).sender == "a"
        with pytest.raises(TimeoutError):  # the stranger's never arrived
            b.receive(1, "gradient", 0, timeout_s=0.3)
    finally:
        for plane in (b, named, stranger):
            plane.close()


def test_an_impostor_at_a_peers_address_cannot_read_what_is_sent_there() -> None:
    # the sender encrypts to the key the server gave for the peer: a host that holds the
    # address but not the peer's secret key completes no handshake and receives nothing
    real = DataKeys.generate()
    impostor = DataPlane(bind="tcp://127.0.0.1:0", identity="b")
    a = DataPlane(bind="tcp://127.0.0.1:0", identity="a")
    try:
        impostor.connect("a", a.address, a.public_key)
        a.connect("b", impostor.address, real.public)
        a.send("b", encode(run=1, kind="activation", microbatch=0, version=0,
                           tensor=torch.ones(4)))
        with pytest.raises(TimeoutError):
            impostor.receive(1, "activation", 0, timeout_s=1.0)
        assert impostor.pending() == 0
    finally:
        a.close()
        impostor.close()


def test_the_inbox_is_bounded() -> None:
    # messages nobody takes (unknown runs, micro-batches) were kept forever: 85 MB in 12 s
    rejected: list[str] = []
    b = DataPlane(bind="tcp://127.0.0.1:0", max_pending=5, max_pending_bytes=10_000,
                  on_reject=rejected.append)
    a = DataPlane(bind="tcp://127.0.0.1:0")
    try:
        link(a, b)
        for m in range(8):
            a.send("b", encode(run=99, kind="activation", microbatch=m, version=0,
                               tensor=torch.zeros(10)))
        assert wait_for(lambda: len(rejected) == 3), rejected
        assert b.pending() == 5 and "holds 5 messages already" in rejected[0]
        b.receive(99, "activation", 0, timeout_s=5)  # taking one makes room again
        a.send("b", encode(run=99, kind="activation", microbatch=100, version=0,
                           tensor=torch.zeros(3000)))  # 12 kB: over the byte bound
        assert wait_for(lambda: len(rejected) == 4) and "10000 bytes" in rejected[-1]
        a.send("b", encode(run=99, kind="activation", microbatch=200, version=0,
                           tensor=torch.zeros(10)))
        assert b.receive(99, "activation", 200, timeout_s=10).tensor.numel() == 10
        assert b.discard(99) == 4 and b.pending() == 0
    finally:
        a.close()
        b.close()


def test_the_key_pair_is_kept_private_and_reused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    first = load_or_create_keys(tmp_path / "agent.data-keys")
    again = load_or_create_keys(tmp_path / "agent.data-keys")
    assert first == again and len(first.public) == 40
    secret = tmp_path / "agent.data-keys" / "data.key_secret"
    assert secret.stat().st_mode & 0o077 == 0
    secret.chmod(0o644)
    with pytest.raises(ConfigError, match=r"data\.key_secret: holds the data plane's secret key"):
        load_or_create_keys(tmp_path / "agent.data-keys")


def test_a_link_is_measured_when_the_peer_learns_this_agents_key_after_the_first_ping() -> None:
    # the measure command reached one agent before the other: its first ping was refused by
    # the peer's authenticator, ZeroMQ did not try the handshake again, and the link was never
    # measured (two web processes: the commands come through different processes)
    import threading

    a = DataPlane(bind="tcp://127.0.0.1:0", identity="a")
    b = DataPlane(bind="tcp://127.0.0.1:0", identity="b")
    measured: list[tuple[float, float]] = []
    try:
        a.connect("b", b.address, b.public_key)
        worker = threading.Thread(target=lambda: measured.append(
            a.measure_link("b", pings=2, bulk_bytes=10_000, bulk_trips=1, timeout_s=20)))
        worker.start()
        assert wait_for(lambda: b.authenticator.refused >= 1)
        b.connect("a", a.address, a.public_key)  # the server's command reaches b now
        worker.join(timeout=30)
        assert len(measured) == 1 and measured[0][0] > 0
    finally:
        a.close()
        b.close()


def test_a_send_after_the_peer_refused_the_handshake_reaches_it_once_it_admits_this_agent(
) -> None:
    # the peer refused this agent's first handshake (the server's command naming this agent
    # had not reached it yet): ZeroMQ closed the connection for good and a send on the same
    # socket blocked forever, holding the plane's send lock: the ping answers waited behind
    # it, and the agent's links were never measured (two web processes, the commands came
    # through different processes)
    import threading

    a = DataPlane(bind="tcp://127.0.0.1:0", identity="a")
    b = DataPlane(bind="tcp://127.0.0.1:0", identity="b")
    try:
        a.connect("b", b.address, b.public_key)
        a.send("b", encode(run=1, kind="activation", microbatch=0, version=0,
                           tensor=torch.ones(2)))
        assert wait_for(lambda: b.authenticator.refused >= 1)
        b.connect("a", a.address, a.public_key)  # the server's command reaches b now
        sender = threading.Thread(target=lambda: a.send("b", encode(
            run=1, kind="activation", microbatch=1, version=0, tensor=torch.ones(2))),
            daemon=True)
        sender.start()
        sender.join(timeout=20)
        assert not sender.is_alive()
        assert b.receive(1, "activation", 1, timeout_s=20).tensor.tolist() == [1.0, 1.0]
    finally:
        a.close()
        b.close()
