"""The inbox: a stage that waits reads the socket itself, the background thread reads only
once no stage has for a while and always handles probes and weights, and neither loses a
message when the socket changes hands."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import torch
import zmq

from agent import inbox as inbox_module
from agent.inbox import Inbox
from agent.wire import Message, TransportError, decode, encode


@dataclass
class Harness:
    """An Inbox on a real PULL socket, fed by a PUSH socket, recording which thread read
    each message and which thread handled each side message."""

    context: zmq.Context[zmq.Socket[bytes]]
    push: zmq.Socket[bytes]
    inbox: Inbox
    readers: dict[tuple[str, int], int] = field(default_factory=dict)
    side: list[tuple[int, int]] = field(default_factory=list)  # (micro-batch, thread)
    rejected: list[str] = field(default_factory=list)

    def send(self, kind: str, microbatch: int, *, name: str | None = None,
             payload: bytes | None = None) -> None:
        frames = encode(run=1, kind=kind, microbatch=microbatch, version=0,
                        tensor=torch.ones(4), name=name)
        self.push.send_multipart(frames if payload is None else [frames[0], payload])


@pytest.fixture
def harness() -> Iterator[Harness]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.bind("inproc://inbox")
    push = context.socket(zmq.PUSH)
    push.connect("inproc://inbox")
    box: Harness

    def decoded(frames: list[zmq.Frame]) -> Message | None:
        try:
            message = decode([f.buffer for f in frames], arrived_at=time.time())
        except TransportError as exc:
            box.rejected.append(str(exc))
            return None
        box.readers[(message.header.kind, message.header.microbatch)] = threading.get_ident()
        return message

    def on_side(message: Message) -> None:
        box.side.append((message.header.microbatch, threading.get_ident()))

    inbox = Inbox(pull, decoded=decoded, is_side=lambda m: m.header.kind == "probe",
                  on_side=on_side, reject=lambda reason: box.rejected.append(reason),
                  max_pending=8, max_pending_bytes=1 << 20)
    box = Harness(context, push, inbox)
    server = threading.Thread(target=inbox.serve, daemon=True)
    server.start()
    yield box
    inbox.stop()
    server.join(timeout=5)
    assert not server.is_alive()
    push.close(linger=0)
    pull.close(linger=0)
    inbox.close()
    context.term()


def waiting_stage(harness: Harness, microbatch: int) -> tuple[threading.Thread, list[Message]]:
    """A stage thread waiting for activation ``microbatch``, once it reads the socket; what
    it takes goes into the list."""
    got: list[Message] = []
    stage = threading.Thread(target=lambda: got.append(
        harness.inbox.take((1, "activation", microbatch, None), timeout_s=10)), daemon=True)
    stage.start()
    wait_until(lambda: harness.inbox._reader == stage.ident)
    return stage, got


def wait_until(condition: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def test_a_waiting_stage_reads_its_message_itself(harness: Harness) -> None:
    stage, got = waiting_stage(harness, 3)
    harness.send("activation", 3)
    stage.join(timeout=10)
    assert got and got[0].header.microbatch == 3
    assert harness.readers[("activation", 3)] == stage.ident


def test_the_background_thread_reads_once_no_stage_has(harness: Harness) -> None:
    """A message no stage waits for is read (and stamped) by the background thread, once
    GRACE_S has passed since a stage last read; the stage then finds it kept."""
    harness.send("gradient", 5)
    wait_until(lambda: ("gradient", 5) in harness.readers)
    assert harness.readers[("gradient", 5)] == harness.inbox._background
    assert harness.inbox.holds((1, "gradient", 5, None))
    sent = time.time()
    message = harness.inbox.take((1, "gradient", 5, None), timeout_s=1)
    assert message.arrived_at <= sent and harness.inbox.pending() == 0


def test_a_stage_takes_the_socket_from_the_background_thread(harness: Harness) -> None:
    wait_until(lambda: harness.inbox._reader == harness.inbox._background)
    stage, got = waiting_stage(harness, 0)
    harness.send("activation", 0)
    stage.join(timeout=10)
    assert got and harness.readers[("activation", 0)] == stage.ident


def test_probes_go_to_the_background_thread_even_when_a_stage_reads(harness: Harness) -> None:
    stage, got = waiting_stage(harness, 1)
    harness.send("probe", 7)
    wait_until(lambda: harness.side)
    assert harness.side == [(7, harness.inbox._background)]
    assert harness.readers[("probe", 7)] == stage.ident  # read by the stage, handled aside
    harness.send("activation", 1)
    stage.join(timeout=10)
    assert got and not harness.inbox.holds((1, "probe", 7, None))


def test_two_waiting_stages_each_get_their_message(harness: Harness) -> None:
    got: dict[int, Message] = {}

    def stage(microbatch: int) -> None:
        got[microbatch] = harness.inbox.take((1, "activation", microbatch, None), timeout_s=10)

    stages = [threading.Thread(target=stage, args=(m,)) for m in (0, 1)]
    for thread in stages:
        thread.start()
    wait_until(lambda: harness.inbox._wanted == 2)
    harness.send("activation", 1)  # the second stage's first: the first may hold the socket
    harness.send("activation", 0)
    for thread in stages:
        thread.join(timeout=10)
    assert sorted(got) == [0, 1] and harness.inbox._wanted == 0


def test_a_bad_frame_is_refused_and_reading_goes_on(harness: Harness) -> None:
    stage, got = waiting_stage(harness, 2)
    harness.send("activation", 2, payload=b"too short")
    harness.send("activation", 2)
    stage.join(timeout=10)
    assert got and harness.rejected and "payload" in harness.rejected[0]


def test_a_full_inbox_refuses_new_messages(harness: Harness) -> None:
    for m in range(9):
        harness.send("gradient", m)
    wait_until(lambda: harness.rejected)
    assert harness.inbox.pending() == 8 and "holds 8 messages" in harness.rejected[0]


def test_a_wait_times_out_and_can_be_cancelled(harness: Harness) -> None:
    with pytest.raises(TimeoutError, match=r"within 0\.2 s"):
        harness.inbox.take((1, "activation", 9, None), timeout_s=0.2)
    with pytest.raises(TimeoutError, match="cancelled"):
        harness.inbox.take((1, "activation", 9, None), cancelled=lambda: True)
    assert harness.inbox._wanted == 0 and harness.inbox._reader != threading.get_ident()


def test_stop_takes_the_socket_back_from_a_waiting_stage(harness: Harness) -> None:
    """After stop no thread reads the socket (so it can be closed), and a stage still waiting
    waits on until it is cancelled."""
    cancel = threading.Event()
    errors: list[BaseException] = []

    def stage() -> None:
        try:
            harness.inbox.take((1, "activation", 4, None), cancelled=cancel.is_set)
        except TimeoutError as exc:
            errors.append(exc)

    thread = threading.Thread(target=stage)
    thread.start()
    wait_until(lambda: harness.inbox._reader == thread.ident)
    harness.inbox.stop()
    assert harness.inbox._reader is None
    cancel.set()
    thread.join(timeout=10)
    assert errors and not thread.is_alive()


def test_the_background_thread_waits_its_grace(monkeypatch: pytest.MonkeyPatch,
                                               harness: Harness) -> None:
    """Right after a stage read, the background thread leaves the socket alone (handing it
    back and forth after every wait cost two wake-ups a message), and reads again once the
    grace has passed."""
    monkeypatch.setattr(inbox_module, "GRACE_S", 2.0)
    stage, got = waiting_stage(harness, 6)
    harness.send("activation", 6)
    stage.join(timeout=10)
    read_at = time.monotonic()
    assert got and harness.inbox._reader is None  # within the grace: nobody reads
    wait_until(lambda: harness.inbox._reader == harness.inbox._background)
    assert time.monotonic() - read_at >= 1.5


def test_a_cancel_check_may_ask_the_inbox(harness: Harness) -> None:
    """A stage's ``cancelled`` runs with the inbox locked and may ask holds() (a group
    all-reduce asks whether its members' messages came): with a plain lock every stage of
    test_exclusion hung there."""
    done: list[Message] = []
    stage = threading.Thread(target=lambda: done.append(harness.inbox.take(
        (1, "activation", 3, None), timeout_s=10,
        cancelled=lambda: harness.inbox.holds((1, "gradient", 3, None)))), daemon=True)
    stage.start()
    harness.send("activation", 3)
    stage.join(timeout=10)
    assert done and done[0].header.microbatch == 3


def test_the_background_thread_reads_soon_after_the_stages_stop(
        monkeypatch: pytest.MonkeyPatch, harness: Harness) -> None:
    """Once no stage waits, a message is read within about GRACE_S: the background thread
    looked again only each READ_POLL_S while a stage read, so one that came right after the
    stages stopped sat unread (and unstamped) that long."""
    monkeypatch.setattr(inbox_module, "READ_POLL_S", 30.0)
    monkeypatch.setattr(inbox_module, "GRACE_S", 0.05)
    stage, got = waiting_stage(harness, 2)
    harness.send("activation", 2)
    stage.join(timeout=10)
    assert got
    harness.send("gradient", 2)  # nobody waits for it
    wait_until(lambda: ("gradient", 2) in harness.readers, timeout_s=15)
    assert harness.readers[("gradient", 2)] == harness.inbox._background
