"""The data plane between agents: this agent's inbox and its authenticated links to its peers.

:class:`DataPlane` owns one PULL socket (this agent's inbox, agent.inbox: read by the stage
that waits for a message, else by a receiving thread) and PUSH sockets to its peers, used
under a lock (ZeroMQ sockets are not thread-safe). Messages follow
agent.wire's format. Both ends are CURVE-secured (agent.security): the inbox admits only the
peers the server names, by their public keys, for as long as it names them (a connection whose
key is no longer admitted has its messages dropped), and a message to a peer is encrypted to
the key the server gave for it. A send hands the message to ZeroMQ's I/O thread in the
caller's thread, so computing never waits for a transfer; received messages are kept by (run,
kind, micro-batch, name), at most ``max_pending`` of them and ``max_pending_bytes``: beyond,
new ones are dropped with a log line. A frame that is not a message is refused and reading
goes on.
Emulation for heterogeneous testbeds on one machine: ``bandwidth_bps`` and ``latency_s``
shape what this agent sends, on a sender thread that holds each message back: a message holds
the single outgoing line for bytes / bandwidth, one after the other, and arrives ``latency_s``
after it left the line (a propagation delay, as on a real network and in the PipeLearn and
split-learning time models: back-to-back messages are in flight together, not each holding
the line for the latency; the chain simulator charges the latency as link time, FTPipeHD's
term, docs/architecture.md).

Links are measured over the data plane itself: :meth:`DataPlane.measure_link` sends ``probe``
pings (named ``ping:<sender>``) that the peer's receiver answers at once with a one-byte
``pong:<peer>``; the shortest round trip of small pings gives the latency, the fastest of a few
round trips of a large one the bandwidth, so shaping and the real network both show.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import cast

import torch
import zmq

from agent.inbox import EVENTS, NOBLOCK, POLLIN, Inbox
from agent.security import DataKeys, PeerAuthenticator
from agent.wire import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_HEADER_BYTES,
    Header,
    Message,
    TransportError,
    decode,
    encode,
    parse_header,
)

log = logging.getLogger("edgepipe.agent.transport")

DEFAULT_MAX_PENDING = 4096  # received messages waiting for their stage
DEFAULT_MAX_PENDING_BYTES = 1024 * 1024 * 1024
# a peer that refused this agent's handshake (it did not admit this agent's key yet): ZeroMQ
# ends that connection for good, so the socket is opened anew for the next send
HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
SEND_POLL_MS = 100  # a send that cannot go yet looks again this often for a refusal
# ZeroMQ's I/O thread (which encrypts, writes and reads every message) is scheduled as a batch
# thread where Linux has the policy: a stage that queues a message wakes it, and as an
# ordinary thread it took the stage's core at once on a busy machine (wake-up preemption),
# and switched the stage out about once every two messages. A batch thread is not given a
# core ahead of the thread running there; it has its full share of the CPU otherwise. The
# cost: a message queued while every core is busy waits longer to go (docs/architecture.md).
# Elsewhere (SCHED_BATCH is Linux's) ZeroMQ's default. docs/benchmarks.md: up to a tenth less
# CPU a micro-batch.
IO_SCHED_POLICY: int | None = getattr(os, "SCHED_BATCH", None)

@dataclass(frozen=True)
class Shaping:
    """What this agent's outgoing line emulates (None: as fast as the machine goes)."""

    bandwidth_bps: float | None = None  # bytes per second
    latency_s: float = 0.0

    def wire_s(self, nbytes: int) -> float:
        """How long ``nbytes`` hold the line."""
        return nbytes / self.bandwidth_bps if self.bandwidth_bps else 0.0


@dataclass
class SendRecord:
    """One finished send, for the timeline."""

    peer: str
    header: Header
    nbytes: int
    start: float
    end: float


@dataclass
class _Outgoing:
    peer: str
    frames: list[bytes]
    header: Header
    done: threading.Event | None = None  # set once sent, for a caller that waits for it
    start: float = 0.0  # on a shaped line: when the line took it
    deliver: float = 0.0  # and when it arrives


@dataclass(frozen=True)
class _PeerSocket:
    """A PUSH socket to a peer at ``where`` (address, public key), and the monitor socket on
    which ZeroMQ says that the peer refused its handshake."""

    where: tuple[str, bytes]
    socket: zmq.Socket[bytes]
    monitor: zmq.Socket[bytes]

    def refused(self) -> bool:
        """Has the peer refused a handshake since the socket opened? (Events are read off.)"""
        refused = False
        # the monitor's EVENTS, not a poll: a poll per send cost a Poller and a system call
        while cast(int, self.monitor.get(EVENTS)) & POLLIN:
            self.monitor.recv_multipart()
            refused = True
        return refused

    def close(self, *, linger: bool = False) -> None:
        """Close it; ``linger``: what it still queues has the socket's LINGER to go, else it
        is dropped."""
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=None if linger else 0)


# as plain ints: pyzmq's flag enums cost an enum operation at each call
_MORE = NOBLOCK | int(zmq.SNDMORE)


def _send_frames(socket: zmq.Socket[bytes], frames: list[bytes]) -> None:
    """Send ``frames`` as one message without blocking (zmq.Again: not now). Frame by frame,
    as pyzmq's send_multipart does without its per-frame checks and flag enums; ZeroMQ takes
    a message's later frames once it took the first. pyzmq copies frames under the socket's
    copy threshold and sends larger ones without a copy."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        socket.send(frame, _MORE if i < last else NOBLOCK, copy=False)


def _key(key: bytes | str) -> bytes:
    return key.encode("ascii") if isinstance(key, str) else key


class DataPlane:
    """This agent's inbox and its connections to peers."""

    def __init__(self, *, bind: str, identity: str = "", clock: Callable[[], float] = time.time,
                 keys: DataKeys | None = None, shaping: Shaping | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 max_pending: int = DEFAULT_MAX_PENDING,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 on_send: Callable[[SendRecord], None] | None = None,
                 on_reject: Callable[[str], None] | None = None,
                 on_weights: Callable[[Message], None] | None = None) -> None:
        """``keys``: this agent's CURVE key pair (a new one when None: a plane of a test or a
        profiler, which only its own peers are told of)."""
        self.identity = identity
        self.clock = clock
        self.keys = keys or DataKeys.generate()
        self.shaping = shaping or Shaping()
        self._probe_tokens = iter(range(1, 2**62))
        self.max_message_bytes = max_message_bytes
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.on_send = on_send
        self.on_reject = on_reject
        self.on_weights = on_weights
        self.context = zmq.Context()
        if IO_SCHED_POLICY is not None:
            self.context.set(zmq.THREAD_SCHED_POLICY, IO_SCHED_POLICY)
        self.authenticator = PeerAuthenticator(self.context)
        self.authenticator.begin()
        self.inbox_socket = self.context.socket(zmq.PULL)
        self.inbox_socket.curve_secretkey = self.keys.secret
        self.inbox_socket.curve_publickey = self.keys.public
        self.inbox_socket.curve_server = True
        self.inbox_socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes + MAX_HEADER_BYTES)
        self.inbox_socket.setsockopt(zmq.LINGER, 0)
        if bind.endswith(":0"):
            port = self.inbox_socket.bind_to_random_port(bind[: bind.rindex(":")])
            self.address = f"{bind[: bind.rindex(':')]}:{port}"
        else:
            self.inbox_socket.bind(bind)
            self.address = bind
        self._peers: dict[str, tuple[str, bytes]] = {}  # peer -> (address, public key)
        self.shaped = self.shaping.bandwidth_bps is not None or self.shaping.latency_s > 0
        # the sockets to peers, used by one thread at a time (zmq sockets are not thread-safe)
        self._sending = threading.Lock()
        # peer -> ((address, public key), socket, its monitor of handshake failures)
        self._sockets: dict[str, _PeerSocket] = {}
        self._free_at = 0.0  # when the shaped line is next free (under _line)
        self._line = threading.Lock()
        # messages to send; an Event is a flush marker, None stops the sender
        self._outgoing: queue.Queue[_Outgoing | threading.Event | None] = queue.Queue()
        self.rejected = 0
        self.inbox = Inbox(self.inbox_socket, decoded=self._decoded, is_side=self._is_side,
                           on_side=self._on_side, reject=self._reject,
                           max_pending=max_pending, max_pending_bytes=max_pending_bytes)
        self._stop = threading.Event()
        self._receiver = threading.Thread(target=self.inbox.serve, name="dataplane-recv",
                                          daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name="dataplane-send",
                                        daemon=True)
        self._receiver.start()
        self._sender.start()

    # ---- peers and sending

    @property
    def public_key(self) -> bytes:
        return self.keys.public

    def connect(self, peer: str, address: str, key: bytes | str, *, admit: bool = True) -> None:
        """Send to ``peer`` at ``address`` from now on, encrypted to its public ``key`` (Z85)
        (the next send opens the socket); ``admit``: and admit its messages until this plane
        closes (a test's peers, the agent itself). An agent admits its peers by grant
        instead (:meth:`admit`), for as long as the server says."""
        key = _key(key)
        if admit:
            self.authenticator.trust(peer, key)
        self._peers[peer] = (address, key)

    def admit(self, holder: Hashable, peers: Mapping[str, bytes | str]) -> None:
        """Admit the messages of ``peers`` (uid -> public key, Z85) for ``holder`` (a run
        deployed here, a link measurement), instead of what ``holder`` admitted before."""
        self.authenticator.grant(holder, {uid: _key(key) for uid, key in peers.items()})

    def revoke(self, holder: Hashable, *, after_s: float = 0.0) -> None:
        """Stop admitting the peers only ``holder`` admitted (now, or ``after_s`` from now
        unless it is admitted again meanwhile): their new connections fail the handshake, and
        what their connections made before still bring is dropped."""
        self.authenticator.revoke(holder, after_s=after_s)

    def reopen(self, peer: str) -> None:
        """Close the socket to ``peer`` (what it still queues is dropped): the next send opens
        a new connection, with a new handshake."""
        with self._sending:
            known = self._sockets.pop(peer, None)
            if known is not None:
                known.close()

    def repoint(self, peer: str, address: str) -> None:
        """Send to the known ``peer`` at ``address`` from now on, still encrypted to the key the
        server gave for it (a peer that restarted binds a new port); TransportError for a peer
        this plane was not told of."""
        known = self._peers.get(peer)
        if known is None:
            raise TransportError(f"{peer!r} is not a peer of this agent")
        self._peers[peer] = (address, known[1])

    def peer_address(self, peer: str) -> str | None:
        known = self._peers.get(peer)
        return None if known is None else known[0]

    def send(self, peer: str, frames: list[bytes], *, wait: bool = False,
             header: Header | None = None) -> None:
        """Send ``frames`` to ``peer``. On an unshaped line the caller sends them itself;
        a shaped one hands them to the sender thread, which holds each back as long as the
        emulated line would (``wait``: return once sent). ``header``: what ``frames[0]``
        says (:func:`encode_message`'s), else it is read from the frame."""
        if peer not in self._peers:
            raise TransportError(f"no address for peer {peer!r}")
        item = _Outgoing(peer=peer, frames=frames,
                         header=parse_header(frames[0]) if header is None else header,
                         done=threading.Event() if wait else None)
        if not self.shaped:
            # a hand-off to the sender thread cost a thread switch on every hop (up to the
            # interpreter's switch interval while this thread went on computing), added to
            # every activation's time from send to arrival
            with self._sending:
                self._deliver(item)
            return
        nbytes = sum(len(f) for f in frames[1:])
        with self._line:
            # the line takes it as soon as it is free; it arrives the latency after it left
            # the line, so deliveries keep the order of sends
            item.start = max(self.clock(), self._free_at)
            self._free_at = item.start + self.shaping.wire_s(nbytes)
            item.deliver = self._free_at + self.shaping.latency_s
            self._outgoing.put(item)
        if item.done is not None:
            item.done.wait()

    def _socket(self, peer: str) -> _PeerSocket:
        """The socket to ``peer``'s current address (under ``_sending``)."""
        where = self._peers[peer]
        known = self._sockets.get(peer)
        if known is not None and known.where != where:
            # the peer came back elsewhere (a restarted agent binds a new port, with its key):
            # what is still queued for the old address is for a process that is gone
            known.close()
            known = None
        if known is not None and known.refused():
            log.warning("%s refused this agent's handshake: connecting again", peer)
            known.close()
            known = None
        if known is None:
            sock = self.context.socket(zmq.PUSH)
            sock.curve_secretkey = self.keys.secret
            sock.curve_publickey = self.keys.public
            sock.curve_serverkey = where[1]
            sock.setsockopt(zmq.LINGER, 2000)
            monitor = sock.get_monitor_socket(HANDSHAKE_FAILED)
            sock.connect(where[0])
            known = self._sockets[peer] = _PeerSocket(where, sock, monitor)
        return known

    def _send_now(self, peer: str, frames: list[bytes]) -> None:
        """Send ``frames`` to ``peer`` (under ``_sending``). A refused handshake ends the
        socket's connection for good, and a send on it waited forever (with the send lock
        held, so every other send waited too): a send that cannot go yet looks for a refusal
        and then goes on a new socket."""
        while True:
            known = self._socket(peer)
            try:
                _send_frames(known.socket, frames)
                return
            except zmq.Again:
                if self._stop.is_set():
                    raise TransportError(f"the data plane closed before a send to {peer}"
                                         ) from None
            poller = zmq.Poller()
            poller.register(known.socket, zmq.POLLOUT)
            poller.register(known.monitor, zmq.POLLIN)
            poller.poll(SEND_POLL_MS)

    def _deliver(self, item: _Outgoing) -> None:
        """Send one message at its delivery time (now on an unshaped line; under
        ``_sending``)."""
        nbytes = sum(len(f) for f in item.frames[1:])
        start = item.start if self.shaped else self.clock()
        pause = item.deliver - self.clock()
        if pause > 0:
            time.sleep(pause)
        self._send_now(item.peer, item.frames)
        end = self.clock()
        if self.on_send is not None:
            self.on_send(SendRecord(peer=item.peer, header=item.header, nbytes=nbytes,
                                    start=start, end=end))
        if item.done is not None:
            item.done.set()

    def _send_loop(self) -> None:
        while True:
            item = self._outgoing.get()
            if item is None:
                break
            if isinstance(item, threading.Event):
                item.set()
                continue
            with self._sending:
                self._deliver(item)

    # ---- receiving

    def _reject(self, reason: str) -> None:
        self.rejected += 1
        log.warning("rejected a message: %s", reason)
        if self.on_reject is not None:
            self.on_reject(reason)

    def _decoded(self, frames: list[zmq.Frame]) -> Message | None:
        """The message ``frames`` carry, from an admitted peer (None: rejected)."""
        user_id = str(frames[0].get("User-Id")) if frames else ""
        sender = self.authenticator.sender(user_id)
        if sender is None:  # admitted once, but no grant names its key any more
            self._reject(f"from {user_id}, a key this agent no longer admits")
            return None
        try:
            return decode([f.buffer for f in frames], max_bytes=self.max_message_bytes,
                          arrived_at=self.clock(), sender=sender)
        except TransportError as exc:
            self._reject(f"from {sender or 'an unknown peer'}: {exc}")
            return None

    def _is_side(self, message: Message) -> bool:
        """A probe to answer, or weights for the agent's weight store (a replica to keep or a
        fetch to answer), not for a stage."""
        name = message.header.name or ""
        return ((message.header.kind == "probe" and name.startswith("ping:"))
                or (message.header.kind == "weights" and self.on_weights is not None
                    and not name.startswith("fetched:")))

    def _on_side(self, message: Message) -> None:
        """(The receiving thread.) Answer a probe, or hand weights to the weight store."""
        name = message.header.name or ""
        try:
            if message.header.kind == "probe":
                self._answer_ping(name[5:], message)
            elif self.on_weights is not None:
                self.on_weights(message)
        except (TransportError, ValueError) as exc:
            self._reject(f"{message.header.kind} {name!r} from {message.sender}: {exc}")
        except Exception as exc:
            log.exception("a received message failed")
            self._reject(f"{type(exc).__name__}: {exc}")

    def _answer_ping(self, sender: str, message: Message) -> None:
        header = message.header
        if sender != message.sender or sender not in self._peers:
            self._reject(f"a probe naming {sender!r} from {message.sender or 'an unknown peer'}")
            return
        self.send(sender, encode(run=header.run, kind="probe", microbatch=header.microbatch,
                                 version=0, tensor=torch.zeros(1, dtype=torch.uint8),
                                 name=f"pong:{self.identity}"))

    def measure_link(self, peer: str, *, pings: int = 8, bulk_bytes: int = 2_000_000,
                     bulk_trips: int = 4, bulk_budget_s: float = 1.0,
                     timeout_s: float = 15.0) -> tuple[float, float]:
        """(bandwidth in bytes/s, latency in s) of the link to ``peer``, measured now: the
        shortest of ``pings`` small round trips and the fastest of up to ``bulk_trips`` bulk ones
        (fewer once they have taken ``bulk_budget_s``, as on a slow link). On a machine whose
        processors are shared, one bulk trip can read many times slower than the link is; a
        trip slowed by its sender or receiver waiting for a core only ever reads slow, so the
        fastest is the link's."""

        def round_trip(size: int, wait_s: float = timeout_s) -> float:
            token = next(self._probe_tokens)
            started = time.perf_counter()
            self.send(peer, encode(run=0, kind="probe", microbatch=token, version=0,
                                   tensor=torch.zeros(size, dtype=torch.uint8),
                                   name=f"ping:{self.identity}"))
            self.receive(0, "probe", token, name=f"pong:{peer}", timeout_s=wait_s)
            return time.perf_counter() - started

        # the peer answers only once it knows this agent: the first ping may come too early,
        # before the server's measure command told the peer this agent's key, and then its
        # authenticator refused the connection, which ZeroMQ does not try again: the socket
        # is opened anew for each retry. Each retry waits twice as long as the last, up to
        # what is left: a peer on a slow link answers late while its own bulk trips hold
        # its link, and a fixed short wait could miss it every time
        deadline = time.monotonic() + timeout_s
        wait_s = min(1.0, timeout_s)
        while True:
            try:
                first = round_trip(1, wait_s=wait_s)
                break
            except TimeoutError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                wait_s = min(2 * wait_s, left)
                self.reopen(peer)
        shortest = min([first, *(round_trip(1) for _ in range(pings - 1))])
        bulk = [round_trip(bulk_bytes)]
        while len(bulk) < bulk_trips and sum(bulk) < bulk_budget_s:
            bulk.append(round_trip(bulk_bytes))
        return bulk_bytes / max(min(bulk) - shortest, 1e-6), shortest / 2

    def receive(self, run: int, kind: str, microbatch: int, *, name: str | None = None,
                timeout_s: float | None = None,
                cancelled: Callable[[], bool] | None = None) -> Message:
        """Wait for the message ``(run, kind, microbatch, name)``; raises TimeoutError after
        ``timeout_s`` or when ``cancelled()`` turns true."""
        return self.inbox.take((run, kind, microbatch, name), timeout_s=timeout_s,
                               cancelled=cancelled)

    def holds(self, run: int, kind: str, microbatch: int, *, name: str | None = None) -> bool:
        """Has the message ``(run, kind, microbatch, name)`` arrived (and not been taken)?"""
        return self.inbox.holds((run, kind, microbatch, name))

    def discard(self, run: int) -> int:
        """Drop every received message of ``run`` (a halted generation's in-flight batches);
        returns how many."""
        return self.inbox.discard(run)

    def pending(self) -> int:
        return self.inbox.pending()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything queued so far has been sent (False on timeout)."""
        marker = threading.Event()
        self._outgoing.put(marker)
        return marker.wait(timeout_s)

    def close(self) -> None:
        self._stop.set()
        self._outgoing.put(None)
        self._sender.join(timeout=5)
        self.inbox.stop()
        self._receiver.join(timeout=5)
        with self._sending:
            for known in self._sockets.values():
                known.close(linger=True)
        self.inbox_socket.close()
        self.inbox.close()
        self.authenticator.stop()
        self.context.term()
