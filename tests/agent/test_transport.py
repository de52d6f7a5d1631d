"""The data plane: the wire format refuses anything that does not match, and the ZeroMQ plane
delivers and shapes."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from agent.security import DataKeys
from agent.transport import DataPlane, SendRecord, Shaping
from agent.wire import (
    DTYPES,
    KINDS,
    Header,
    Message,
    TransportError,
    decode,
    encode,
    encode_message,
    parse_header,
)
from tests.agent.planes import curve_socket, link, linked_planes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                   torch.uint8, torch.bool])
def test_round_trip(dtype: torch.dtype) -> None:
    tensor = (torch.randn(3, 4, 5) * 10).to(dtype)
    frames = encode(run=7, kind="activation", microbatch=42, version=5, tensor=tensor)
    message = decode(frames)
    assert message.header.run == 7 and message.header.microbatch == 42
    assert message.header.version == 5 and message.header.shape == (3, 4, 5)
    assert torch.equal(message.tensor, tensor)


def test_an_activation_carries_its_labels() -> None:
    labels = torch.tensor([3, 1, 4, 1], dtype=torch.int64)
    head, frames = encode_message(run=7, kind="activation", microbatch=2, version=0,
                                  tensor=torch.ones(4, 3), labels=labels)
    assert head.labels == 4 and len(frames) == 3
    message = decode(frames)
    assert message.labels is not None and torch.equal(message.labels, labels)
    assert message.header == head and message.nbytes == 4 * 3 * 4 + 4 * 8
    assert decode(encode(run=7, kind="activation", microbatch=2, version=0,
                         tensor=torch.ones(1))).labels is None
    with pytest.raises(TransportError, match="labels ride with activations"):
        encode_message(run=7, kind="gradient", microbatch=2, version=0, tensor=torch.ones(1),
                       labels=labels)


# the fields as the executor and the weight service fill them, and values no sender writes
# (bool, NaN, an int sent_at, a name to escape) that must still come out as json.dumps has them
ANY_INT = st.integers(min_value=-2, max_value=2**64) | st.booleans()
HEADERS = st.builds(
    Header, run=ANY_INT, kind=st.sampled_from([*KINDS, "other"]), microbatch=ANY_INT,
    version=ANY_INT, dtype=st.sampled_from([*DTYPES, "object"]),
    shape=st.lists(ANY_INT, max_size=4).map(tuple),
    name=st.none() | st.text(max_size=12),
    sent_at=st.none() | st.floats() | st.integers(min_value=0, max_value=2**40),
    labels=st.none() | ANY_INT)


@given(HEADERS)
def test_a_header_is_written_as_json_dumps_writes_it(head: Header) -> None:
    # Header.to_bytes writes the JSON itself, for speed; its bytes are json.dumps's, and a
    # header the format allows reads back as itself
    assert head.to_bytes() == json.dumps(head.to_json()).encode()
    try:
        back = parse_header(head.to_bytes())
    except TransportError:
        return
    assert back == head


def test_large_and_small_tensors_cross_the_plane_intact() -> None:
    # frames under pyzmq's copy threshold are copied into the message, larger ones are sent
    # without a copy (agent.transport._send_frames): both arrive as they were sent
    with linked_planes() as (a, b):
        sizes = [1, 4096, 300_000]
        for m, size in enumerate(sizes):
            tensor = torch.randn(size)
            header, frames = encode_message(run=1, kind="activation", microbatch=m,
                                            version=0, tensor=tensor,
                                            labels=torch.arange(size % 7))
            a.send("b", frames, header=header)
            got = b.receive(1, "activation", m, timeout_s=10)
            assert torch.equal(got.tensor, tensor) and got.labels is not None
            assert torch.equal(got.labels, torch.arange(size % 7))


def _io_threads() -> dict[str, int]:
    """This process's ZeroMQ I/O threads: {thread id: scheduling policy} (Linux's /proc)."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            if (task / "comm").read_text().strip().startswith("ZMQbg/IO"):
                # the policy is stat's 41st field; the name before it may hold spaces
                fields = (task / "stat").read_text().rpartition(")")[2].split()
                out[task.name] = int(fields[38])
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_BATCH is Linux's")
def test_the_planes_io_thread_is_scheduled_as_a_batch_thread() -> None:
    """A stage that queues a message wakes ZeroMQ's I/O thread; as an ordinary thread it took
    the stage's core at once on a busy machine (agent.transport.IO_SCHED_POLICY). The data
    plane's context starts its I/O thread as SCHED_BATCH, and still carries messages."""
    before = _io_threads()
    with linked_planes() as (a, b):
        a.send("b", encode(run=1, kind="activation", microbatch=0, version=0,
                           tensor=torch.ones(3)))
        assert torch.equal(b.receive(1, "activation", 0, timeout_s=10).tensor, torch.ones(3))
        started = {tid: policy for tid, policy in _io_threads().items() if tid not in before}
        assert len(started) == 2  # one a plane
        assert set(started.values()) == {os.SCHED_BATCH}


def header(**overrides: object) -> bytes:
    base: dict[str, object] = {"run": 1, "kind": "activation", "microbatch": 0, "version": 0,
                               "dtype": "float32", "shape": [2, 2]}
    base.update(overrides)
    return json.dumps({k: v for k, v in base.items() if v is not None}).encode()


PAYLOAD = torch.zeros(2, 2).numpy().tobytes()


@pytest.mark.parametrize(("frames", "reason"), [
    ([header(), PAYLOAD[:-1]], "payload has 15 bytes but the header's shape [2, 2] of float32 "
                               "needs 16"),
    ([header(shape=[4, 4]), PAYLOAD], "needs 64"),
    ([header(dtype="object"), PAYLOAD], "dtype 'object' is not one of"),
    ([header(kind="pickle"), PAYLOAD], "unknown message kind 'pickle'"),
    # labels ride with activations: a message of their own is no longer a kind
    ([header(kind="labels", dtype="int64", shape=[2]), PAYLOAD], "unknown message kind"),
    ([header(run=-1), PAYLOAD], "'run' must be an integer >= 0"),
    ([header(microbatch=None), PAYLOAD], "header lacks ['microbatch']"),
    ([header(evil=1), PAYLOAD], "unknown fields ['evil']"),
    ([header(shape=[-1]), PAYLOAD], "shape must be a list"),
    ([b"\x80\x03cos\nsystem\n", PAYLOAD], "header is not JSON"),
    ([b"[1, 2]", PAYLOAD], "header must be a JSON object"),
    ([header()], "expected 2 frames"),
    ([header(), PAYLOAD, b"", b""], "got more than 3"),
    ([header(), PAYLOAD, b"\0" * 8], "a labels frame comes with a header's labels count"),
    ([header(labels=2), PAYLOAD], "a labels frame comes with a header's labels count"),
    ([header(labels=2), PAYLOAD, b"\0" * 15], "labels frame has 15 bytes but 2 int64"),
    ([header(labels=-1), PAYLOAD, b""], "'labels' must be an integer >= 0"),
    ([header(kind="gradient", labels=1), PAYLOAD, b"\0" * 8], "labels ride with activations"),
    ([header(labels=10**9), PAYLOAD, b""], "exceeds the limit"),
    ([header(sent_at="soon"), PAYLOAD], "sent_at must be a finite number"),
])
def test_malformed_messages_are_rejected(frames: list[bytes], reason: str) -> None:
    with pytest.raises(TransportError) as caught:
        decode(frames)
    assert reason in str(caught.value)


def test_oversized_messages_are_rejected_before_allocation() -> None:
    frames = [header(shape=[1024, 1024, 1024]), b"x"]
    with pytest.raises(TransportError, match="exceeds the limit of 1000000"):
        decode(frames, max_bytes=1_000_000)
    with pytest.raises(TransportError, match="header of 5000 bytes"):
        parse_header(b" " * 5000)


def test_plane_delivers_and_keeps_bad_messages_out() -> None:
    rejected: list[str] = []
    with linked_planes(on_reject=rejected.append) as (a, b):
        tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        a.send("b", encode(run=1, kind="gradient", microbatch=3, version=2, tensor=tensor))
        got = b.receive(1, "gradient", 3, timeout_s=5)
        assert torch.equal(got.tensor, tensor)
        # a raw peer sending garbage: rejected, logged, nothing lands in the inbox
        raw_keys = DataKeys.generate()
        b.connect("raw", "tcp://127.0.0.1:9", raw_keys.public)
        raw = curve_socket(raw_keys, b)
        raw.send_multipart([header(), PAYLOAD[:3]])
        raw.send_multipart([b"junk"])
        deadline = time.monotonic() + 5
        while len(rejected) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        raw.close()
        assert len(rejected) == 2 and b.rejected == 2 and b.pending() == 0
        with pytest.raises(TimeoutError, match="no activation for micro-batch 0"):
            b.receive(1, "activation", 0, timeout_s=0.2)
        with pytest.raises(TransportError, match="no address for peer 'zz'"):
            a.send("zz", encode(run=1, kind="probe", microbatch=0, version=0,
                                tensor=torch.zeros(1)))


def test_a_peer_that_comes_back_on_another_address_is_sent_to_there() -> None:
    # a restarted agent binds a new port: its neighbours must not go on sending to the old one
    a = DataPlane(bind="tcp://127.0.0.1:0")
    old = DataPlane(bind="tcp://127.0.0.1:0")
    try:
        link(a, old)
        a.send("b", encode(run=1, kind="gradient", microbatch=0, version=0,
                           tensor=torch.ones(2)))
        assert old.receive(1, "gradient", 0, timeout_s=5).tensor.sum().item() == 2
    finally:
        old.close()
    new = DataPlane(bind="tcp://127.0.0.1:0")
    try:
        link(a, new)
        a.send("b", encode(run=1, kind="gradient", microbatch=1, version=0,
                           tensor=torch.ones(3)))
        assert new.receive(1, "gradient", 1, timeout_s=5).tensor.sum().item() == 3
    finally:
        a.close()
        new.close()


def test_a_late_message_of_another_run_is_never_taken_for_this_runs() -> None:
    # a halted generation's activation that arrives after its run's discard stays in the
    # inbox; the next run, on the same generation tag and micro-batch, must not receive it
    # (a stage got another model's [32, 128] activation for its convolution)
    with linked_planes() as (a, b):
        stale, fresh = torch.zeros(32, 128), torch.ones(32, 16, 4, 4)
        a.send("b", encode(run=6, kind="activation", microbatch=86, version=0, tensor=stale,
                           name="g0"))
        assert a.flush(timeout_s=5)
        deadline = time.monotonic() + 5
        while b.pending() < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        a.send("b", encode(run=7, kind="activation", microbatch=86, version=0, tensor=fresh,
                           name="g0"))
        got = b.receive(7, "activation", 86, name="g0", timeout_s=5)
        assert torch.equal(got.tensor, fresh) and got.header.run == 7
        assert b.discard(6) == 1 and b.pending() == 0


def test_shaping_emulates_a_slow_link() -> None:
    sends = []
    shaping = Shaping(bandwidth_bps=1_000_000, latency_s=0.05)
    with linked_planes({"shaping": shaping, "on_send": sends.append}) as (a, b):
        tensor = torch.zeros(50_000, dtype=torch.uint8)  # 50 kB at 1 MB/s = 50 ms + 50 ms
        started = time.monotonic()
        for m in range(3):
            a.send("b", encode(run=1, kind="activation", microbatch=m, version=0, tensor=tensor))
        for m in range(3):
            b.receive(1, "activation", m, timeout_s=5)
        elapsed = time.monotonic() - started
        # three transfers holding the line 50 ms each, the last arriving 50 ms after it left
        assert 0.19 <= elapsed <= 1.5
        assert a.flush(timeout_s=5)
        assert [s.nbytes for s in sends] == [50_000] * 3
        assert all(s.end - s.start >= 0.095 for s in sends)
        assert [round(s.start - sends[0].start, 2) for s in sends] == [0.0, 0.05, 0.1]


def test_latency_delays_messages_without_holding_the_line() -> None:
    # the latency is a propagation delay: back-to-back messages are in flight together, as on
    # a real network and in the time models (each held the line for the latency, and 20 small
    # messages of a PipeLearn iteration took 20 latencies where the time model counts one)
    with linked_planes({"shaping": Shaping(bandwidth_bps=100_000_000, latency_s=0.2)}
                       ) as (a, b):
        tensor = torch.zeros(10, dtype=torch.uint8)
        started = time.monotonic()
        for m in range(20):
            a.send("b", encode(run=1, kind="activation", microbatch=m, version=0, tensor=tensor))
        first = None
        for m in range(20):
            b.receive(1, "activation", m, timeout_s=10)
            first = first or time.monotonic() - started
        elapsed = time.monotonic() - started
        assert first is not None and first >= 0.19  # each still arrives after the latency
        assert elapsed < 2.0  # not 20 x 0.2 s


def test_a_peer_that_answers_late_is_still_measured() -> None:
    # a peer on a slow link answers a ping only after its own sends (1.5 s here): the first
    # ping's wait of 1 s misses it, the next waits twice as long (it waited 1 s each time, and
    # the link was never measured)
    late = DataPlane(bind="tcp://127.0.0.1:0", identity="late",
                     shaping=Shaping(bandwidth_bps=100_000_000, latency_s=1.5))
    prober = DataPlane(bind="tcp://127.0.0.1:0", identity="prober")
    try:
        prober.connect("late", late.address, late.public_key)
        late.connect("prober", prober.address, prober.public_key)
        _bandwidth, latency = prober.measure_link("late", pings=1, bulk_bytes=1_000,
                                                  bulk_trips=1, timeout_s=12)
        assert latency > 0.5  # half the 1.5 s round trip, give or take
    finally:
        late.close()
        prober.close()


def test_links_are_measured_over_the_data_plane() -> None:
    slow = DataPlane(bind="tcp://127.0.0.1:0", identity="slow",
                     shaping=Shaping(bandwidth_bps=4_000_000, latency_s=0.02))
    fast = DataPlane(bind="tcp://127.0.0.1:0", identity="fast")
    try:
        slow.connect("fast", fast.address, fast.public_key)
        fast.connect("slow", slow.address, slow.public_key)
        bandwidth, latency = slow.measure_link("fast", bulk_bytes=1_000_000)
        # the shaped 4 MB/s line dominates the loopback; its 20 ms delay the ping only, so the
        # symmetric estimate (half the round trip) is about 10 ms
        assert 2_500_000 < bandwidth < 5_000_000
        assert 0.008 < latency < 0.04
        back_bandwidth, _back_latency = fast.measure_link("slow", bulk_bytes=1_000_000)
        assert back_bandwidth > 4 * bandwidth  # only the pong is shaped on the way back
        # a ping from a peer it does not know is refused, not answered
        stranger = DataPlane(bind="tcp://127.0.0.1:0", identity="stranger")
        stranger.connect("fast", fast.address, fast.public_key)
        with pytest.raises(TimeoutError):
            stranger.measure_link("fast", pings=1, timeout_s=0.5)
        stranger.close()
        assert fast.authenticator.refused >= 1 and fast.rejected == 0
    finally:
        slow.close()
        fast.close()


def test_a_bulk_round_trip_slowed_by_a_stall_does_not_set_the_bandwidth() -> None:
    a = DataPlane(bind="tcp://127.0.0.1:0", identity="a")
    b = DataPlane(bind="tcp://127.0.0.1:0", identity="b")
    answer = b._answer_ping
    answered: list[int] = []

    def stalled(sender: str, message: Message) -> None:
        answered.append(message.header.microbatch)
        if len(answered) == 9:  # the first bulk trip, after 8 pings (as a busy core would)
            time.sleep(0.25)
        answer(sender, message)

    b._answer_ping = stalled  # type: ignore[method-assign]
    try:
        a.connect("b", b.address, b.public_key)
        b.connect("a", a.address, a.public_key)
        bandwidth, _ = a.measure_link("b", pings=8, bulk_bytes=1_000_000)
        assert len(answered) == 8 + 4  # four bulk trips on a fast link
        assert bandwidth > 50e6  # loopback: the stalled trip alone read under 4 MB/s
        answered.clear()
        alone, _ = a.measure_link("b", pings=8, bulk_bytes=1_000_000, bulk_trips=1)
        assert alone < 4.5e6  # what a single trip made of the stall
    finally:
        a.close()
        b.close()


def test_a_send_with_its_header_reports_that_header_and_delivers() -> None:
    sent: list[SendRecord] = []
    with linked_planes({"on_send": sent.append}) as (a, b):
        tensor = torch.ones(2, 3)
        header, frames = encode_message(run=4, kind="activation", microbatch=9, version=1,
                                        tensor=tensor, name="g0", sent_at=12.5)
        assert parse_header(frames[0]) == header  # the header it wrote is the one it reports
        a.send("b", frames, header=header)
        got = b.receive(4, "activation", 9, name="g0", timeout_s=5)
        assert torch.equal(got.tensor, tensor) and got.header == header
        assert [r.header for r in sent] == [header] and sent[0].nbytes == 24


def test_the_message_cost_is_measured_over_a_real_data_plane() -> None:
    from agent.profiler import measure_message_cost

    cost = measure_message_cost(messages=20, pause_s=0.001)
    # encoding and handing over a 4 KB tensor, and taking one from the inbox: microseconds
    # to a millisecond on any machine, never nothing
    assert 1e-6 < cost < 0.01
