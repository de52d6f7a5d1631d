"""This agent's inbox: the messages its PULL socket received, kept until a stage takes them.

The socket is read by whichever thread waits (leader/follower): a stage waiting for a message
that has not come reads the socket itself, so a message wakes the thread that needs it
straight from ZeroMQ's I/O thread. A hand-off through a receiving thread cost a thread wake-up
on every message: a 16 KB message's round trip between two agents on this machine took
565-608 us that way, 428-472 us read by the waiting stage (bare ZeroMQ with CURVE: 176-197;
bench/pingpong.py, docs/benchmarks.md).

The background thread (:meth:`serve`) reads only once no stage has read for ``GRACE_S``:
between two runs, or on a device whose stages all compute. Handing the socket to it after
every wait and taking it back at the next cost two more wake-ups per message and gave the gain
back. A message that comes while its stage computes is therefore read (and stamped as
arrived) when a stage next waits, at most a pass later than it came; one that comes while a
stage waits is stamped on arrival. Probes and weights (the "side" messages, which may send and
must not run in a stage's thread) are always handled by the background thread, woken for
them. A stage that comes to wait while the background thread reads wakes it through a pipe,
and it steps aside.

Messages are kept by (run, kind, micro-batch, name), at most ``max_pending`` of them and
``max_pending_bytes``: beyond, new ones are refused. A frame that is not a message is refused
by ``decoded`` and reading goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import cast

import zmq

from agent.wire import MAX_FRAMES, Message

log = logging.getLogger("edgepipe.agent.inbox")

READ_POLL_S = 0.1  # how often a reader looks up from the socket (stop, cancellation, deadline)
GRACE_S = 0.02  # the background thread reads once no stage has read for this long
# as plain ints: pyzmq's flag enums cost an enum operation at each call (0.7 us a socket
# option read); agent.transport uses them too
NOBLOCK, EVENTS, POLLIN = int(zmq.NOBLOCK), int(zmq.EVENTS), int(zmq.POLLIN)

Key = tuple[int, str, int, str | None]


class Inbox:
    """The messages received on ``socket``, by (run, kind, micro-batch, name)."""

    def __init__(self, socket: zmq.Socket[bytes], *,
                 decoded: Callable[[list[zmq.Frame]], Message | None],
                 is_side: Callable[[Message], bool], on_side: Callable[[Message], None],
                 reject: Callable[[str], None], max_pending: int,
                 max_pending_bytes: int) -> None:
        """``decoded``: the message of a frame list (None: refused, and said so);
        ``is_side``: a message the background thread handles (``on_side``) instead of
        keeping it; ``reject``: says why a message was dropped."""
        self.socket = socket
        self.decoded = decoded
        self.is_side = is_side
        self.on_side = on_side
        self.reject = reject
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        # by (run, kind, micro-batch, name): a late message of a run that ended (a halted
        # generation's in-flight activation, arriving after the discard) must never be taken
        # for the next run's; it was, and a stage got another model's activation
        self._messages: dict[Key, Message] = {}
        self._bytes = 0
        self._side: list[Message] = []  # side messages read, for the background thread
        # reentrant: a stage's ``cancelled`` runs under it and may ask holds() (a group
        # all-reduce's members)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # for the stages that wait
        self._serve = threading.Condition(self._lock)  # for the background thread
        self._last_read = 0.0  # when a stage last stopped reading (monotonic)
        self._reader: int | None = None  # the thread that reads the socket now
        self._background: int | None = None  # serve()'s thread
        self._wanted = 0  # stages waiting for a message (the background thread steps aside)
        self._woken = False  # the background thread was asked to step aside
        self._stopping = False
        # messages read by a waiting stage and by the background thread, and how often a
        # stage had to wake the background thread to take the socket (log lines, tests)
        self.read_by_stage = self.read_by_background = self.wakes = 0
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        # used only by the reader, one thread at a time, as the socket is
        self._poller = zmq.Poller()
        self._poller.register(socket, zmq.POLLIN)
        self._poller.register(self._wake_read, zmq.POLLIN)

    # ---- reading (by one thread at a time: the reader)

    def _read(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the socket, then take every message it holds."""
        events = dict(self._poller.poll(max(0, int(timeout_s * 1000))))
        if self._wake_read in events:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._wake_read, 64):
                    pass
        if self.socket not in events:
            return
        # take every message waiting, then poll again (a poll per message cost as much as
        # decoding a small one); the socket's EVENTS says when none is left (ending on
        # zmq.Again raised and built an exception each time)
        while True:
            frames = self._message()
            if frames is None:
                return
            try:
                self._take(frames)
            except Exception as exc:
                log.exception("a received message failed")
                self.reject(f"{type(exc).__name__}: {exc}")
            if not cast(int, self.socket.getsockopt(EVENTS)) & POLLIN:
                return

    def _message(self) -> list[zmq.Frame] | None:
        """The next message's frames, at most MAX_FRAMES + 1 of them (the rest of a longer
        one is read and dropped, so it is refused as one of too many frames without holding
        them); None when none is waiting. Frame by frame: pyzmq's recv_multipart asked the
        socket for RCVMORE again after each frame and cost twice as much."""
        socket = self.socket
        try:
            frame = socket.recv(NOBLOCK, copy=False)
        except zmq.Again:
            return None
        frames = [frame]
        while frame.more:  # the parts of a message arrive together
            frame = socket.recv(NOBLOCK, copy=False)
            if len(frames) <= MAX_FRAMES:
                frames.append(frame)
        return frames

    def _take(self, frames: list[zmq.Frame]) -> None:
        if self._reader == self._background:
            self.read_by_background += 1
        else:
            self.read_by_stage += 1
        message = self.decoded(frames)
        if message is None:
            return
        header = message.header
        with self._lock:
            if self.is_side(message):
                if len(self._side) < self.max_pending:
                    self._side.append(message)
                    self._serve.notify()
                    return
                full = f"{self.max_pending} side messages"
            else:
                key = (header.run, header.kind, header.microbatch, header.name)
                held = self._messages.get(key)
                size = message.nbytes - (0 if held is None else held.nbytes)
                if held is None and len(self._messages) >= self.max_pending:
                    full = f"{self.max_pending} messages"
                elif self._bytes + size > self.max_pending_bytes:
                    full = f"{self.max_pending_bytes} bytes"
                else:
                    self._messages[key] = message
                    self._bytes += size
                    self._changed.notify_all()
                    return
        self.reject(f"{header.kind} {header.microbatch} of run {header.run} from "
                    f"{message.sender}: the inbox holds {full} already")

    def _wake(self) -> None:
        """Ask the background thread to step aside (under ``_changed``)."""
        if not self._woken:
            self._woken = True
            self.wakes += 1
            # a full pipe holds wake-ups not read yet: one more is not needed
            with contextlib.suppress(BlockingIOError):
                os.write(self._wake_write, b"w")

    # ---- the background thread

    def serve(self) -> None:
        """The background thread's loop, until :meth:`stop`: read while no stage has read for
        GRACE_S, and handle the side messages read."""
        me = self._background = threading.get_ident()
        while True:
            with self._lock:
                while True:
                    if self._stopping:
                        return
                    idle_s = time.monotonic() - self._last_read
                    reading = (not self._wanted and self._reader is None
                               and idle_s >= GRACE_S)
                    if reading or self._side:
                        break
                    # while a stage reads, look again each GRACE_S (not each READ_POLL_S: a
                    # message that came after the stages stopped waited that long unread)
                    self._serve.wait(GRACE_S if self._wanted
                                     else max(GRACE_S - idle_s, 0.001))
                side, self._side = self._side, []
                if reading:
                    self._reader, self._woken = me, False
            for message in side:
                self.on_side(message)
            if reading:
                try:
                    while True:
                        self._read(READ_POLL_S)
                        with self._lock:
                            if self._wanted or self._stopping or self._side:
                                break
                finally:
                    with self._lock:
                        self._reader = None
                        self._changed.notify_all()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop reading: the background thread ends, and a stage reading the socket stops
        within READ_POLL_S (it waits on without reading); returns once no thread reads it."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            self._stopping = True
            self._woken = False
            self._wake()
            self._changed.notify_all()
            self._serve.notify()
            while self._reader is not None and time.monotonic() < deadline:
                self._changed.wait(READ_POLL_S)

    def close(self) -> None:
        log.info("inbox closed: %d messages read by a waiting stage, %d by the background "
                 "thread; the background thread was asked to step aside %d times",
                 self.read_by_stage, self.read_by_background, self.wakes)
        os.close(self._wake_read)
        os.close(self._wake_write)

    # ---- taking

    def take(self, key: Key, *, timeout_s: float | None = None,
             cancelled: Callable[[], bool] | None = None) -> Message:
        """Wait for the message ``key`` and take it, reading the socket while no other thread
        does; raises TimeoutError after ``timeout_s`` or when ``cancelled()`` turns true."""
        _, kind, microbatch, _ = key
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        # the lock is held throughout, let go only while this thread reads the socket or
        # waits: a with-block of the Condition at each step (a Python call each, five a
        # message) cost more than the steps
        lock = self._lock
        with lock:
            if key in self._messages:
                return self._pop(key)
            self._wanted += 1
            try:
                while True:
                    if key in self._messages:
                        return self._pop(key)
                    if cancelled is not None and cancelled():
                        raise TimeoutError(f"cancelled while waiting for {kind} {microbatch}")
                    remaining = (READ_POLL_S if deadline is None
                                 else min(READ_POLL_S, deadline - time.monotonic()))
                    if remaining <= 0:
                        raise TimeoutError(f"no {kind} for micro-batch {microbatch} within "
                                           f"{timeout_s} s")
                    if self._reader is None and not self._stopping:
                        self._reader = threading.get_ident()
                        lock.release()
                        try:
                            self._read(remaining)
                        finally:
                            lock.acquire()
                            self._reader = None
                            self._last_read = time.monotonic()
                            if self._wanted > 1:  # another stage waits: it reads next
                                self._changed.notify_all()
                        continue
                    if self._reader is not None and self._reader == self._background:
                        self._wake()
                    self._changed.wait(remaining)
            finally:
                self._wanted -= 1

    def _pop(self, key: Key) -> Message:
        message = self._messages.pop(key)
        self._bytes -= message.nbytes
        return message

    def holds(self, key: Key) -> bool:
        with self._changed:
            return key in self._messages

    def discard(self, run: int) -> int:
        """Drop every message of ``run``; returns how many."""
        with self._changed:
            stale = [k for k in self._messages if k[0] == run]
            for key in stale:
                self._pop(key)
        return len(stale)

    def pending(self) -> int:
        with self._changed:
            return len(self._messages)
