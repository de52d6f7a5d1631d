"""The data plane between agents: tensors as ZeroMQ multipart messages [JSON header, raw bytes]
(an activation may carry its micro-batch's labels as a third frame).

Nothing received is unpickled. A header must be a JSON object with exactly the known fields
(``run``, ``kind``, ``microbatch``, ``version``, ``dtype``, ``shape``; optionally ``name`` for a
weight tensor, ``sent_at``, the server's epoch time when the sender started sending, and
``labels``, the number of int64 labels in the third frame), its dtype must be one of a fixed
set, and the payload must be exactly shape x itemsize bytes (the labels' frame 8 bytes a
label) and no larger than the configured limit; anything else is rejected with a reason and
changes nothing.

:class:`DataPlane` owns one PULL socket (this agent's inbox) on a receiver thread and PUSH
sockets to its peers, used under a lock (ZeroMQ sockets are not thread-safe). A send hands the
message to ZeroMQ's I/O thread in the caller's thread, so computing never waits for a transfer;
received messages are kept by (run, kind, micro-batch, name). Emulation for heterogeneous
testbeds on one machine: ``bandwidth_bps`` and ``latency_s`` shape what this agent sends (each
message takes bytes / bandwidth + latency on a single outgoing line, as the cost model's
transfers do), on a sender thread that holds each message back that long.

Links are measured over the data plane itself: :meth:`DataPlane.measure_link` sends ``probe``
pings (named ``ping:<sender>``) that the peer's receiver answers at once with a one-byte
``pong:<peer>``; the shortest round trip of small pings gives the latency, the fastest of a few
round trips of a large one the bandwidth, so shaping and the real network both show.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import zmq

log = logging.getLogger("edgepipe.agent.transport")

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in DTYPES.items()}
_ITEMSIZE = {name: torch.empty((), dtype=dtype).element_size() for name, dtype in DTYPES.items()}
KINDS = ("activation", "gradient", "weights", "probe", "grads")
MAX_HEADER_BYTES = 4096
DEFAULT_MAX_MESSAGE_BYTES = 512 * 1024 * 1024


class TransportError(ValueError):
    """A message that does not follow the data-plane format."""


@dataclass(frozen=True)
class Header:
    run: int
    kind: str
    microbatch: int
    version: int
    dtype: str
    shape: tuple[int, ...]
    name: str | None = None
    sent_at: float | None = None
    labels: int | None = None  # int64 labels in a third frame (an activation's micro-batch's)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run": self.run, "kind": self.kind, "microbatch": self.microbatch,
                               "version": self.version, "dtype": self.dtype,
                               "shape": list(self.shape)}
        if self.name is not None:
            out["name"] = self.name
        if self.sent_at is not None:
            out["sent_at"] = self.sent_at
        if self.labels is not None:
            out["labels"] = self.labels
        return out


@dataclass(frozen=True)
class Message:
    header: Header
    tensor: torch.Tensor
    arrived_at: float = 0.0
    labels: torch.Tensor | None = None  # the micro-batch's labels an activation carries

    @property
    def nbytes(self) -> int:
        extra = 0 if self.labels is None else self.labels.numel() * 8
        return self.tensor.numel() * self.tensor.element_size() + extra


def encode(*, run: int, kind: str, microbatch: int, version: int, tensor: torch.Tensor,
           name: str | None = None, sent_at: float | None = None) -> list[bytes]:
    """[header, payload] for a tensor (copied to contiguous CPU memory)."""
    return encode_message(run=run, kind=kind, microbatch=microbatch, version=version,
                          tensor=tensor, name=name, sent_at=sent_at)[1]


def encode_message(*, run: int, kind: str, microbatch: int, version: int, tensor: torch.Tensor,
                   name: str | None = None, sent_at: float | None = None,
                   labels: torch.Tensor | None = None) -> tuple[Header, list[bytes]]:
    """:func:`encode`, with the header it wrote (what :meth:`DataPlane.send` takes to skip
    reading it back). ``labels``: an activation's micro-batch's labels, carried along as a
    third frame of int64 (the last stage needs them; they ride with the activations instead
    of travelling as a message of their own)."""
    if kind not in KINDS:
        raise TransportError(f"unknown message kind {kind!r}")
    t = tensor.detach().to("cpu").contiguous()
    if t.dtype not in _NAMES:
        raise TransportError(f"dtype {t.dtype} cannot be sent")
    carried = None
    if labels is not None:
        if kind != "activation":
            raise TransportError(f"labels ride with activations, not with {kind}")
        carried = labels.detach().to("cpu", torch.int64).reshape(-1).contiguous()
    header = Header(run=run, kind=kind, microbatch=microbatch, version=version,
                    dtype=_NAMES[t.dtype], shape=tuple(t.shape), name=name, sent_at=sent_at,
                    labels=None if carried is None else int(carried.numel()))
    payload = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    frames = [json.dumps(header.to_json()).encode(), payload]
    if carried is not None:
        frames.append(carried.numpy().tobytes())
    return header, frames


def _int(obj: dict[str, Any], key: str, minimum: int = 0) -> int:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TransportError(f"header field {key!r} must be an integer >= {minimum}, "
                             f"got {value!r}")
    return value


def parse_header(raw: bytes) -> Header:
    if len(raw) > MAX_HEADER_BYTES:
        raise TransportError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TransportError(f"header is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise TransportError("header must be a JSON object")
    required = {"run", "kind", "microbatch", "version", "dtype", "shape"}
    missing = required - obj.keys()
    if missing:
        raise TransportError(f"header lacks {sorted(missing)}")
    unknown = obj.keys() - required - {"name", "sent_at", "labels"}
    if unknown:
        raise TransportError(f"header has unknown fields {sorted(unknown)}")
    if obj["kind"] not in KINDS:
        raise TransportError(f"unknown message kind {obj['kind']!r}")
    if obj["dtype"] not in DTYPES:
        raise TransportError(f"dtype {obj['dtype']!r} is not one of {', '.join(DTYPES)}")
    shape = obj["shape"]
    if not isinstance(shape, list) or len(shape) > 8 or any(
            isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in shape):
        raise TransportError(f"shape must be a list of at most 8 non-negative integers, "
                             f"got {shape!r}")
    name = obj.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > 256):
        raise TransportError("name must be a string of at most 256 characters")
    sent_at = obj.get("sent_at")
    if sent_at is not None and (isinstance(sent_at, bool) or not isinstance(sent_at, (int, float))
                                or not math.isfinite(sent_at)):
        raise TransportError(f"sent_at must be a finite number, got {sent_at!r}")
    labels = None
    if "labels" in obj:
        if obj["kind"] != "activation":
            raise TransportError(f"labels ride with activations, not with {obj['kind']}")
        labels = _int(obj, "labels")
    return Header(run=_int(obj, "run"), kind=obj["kind"], microbatch=_int(obj, "microbatch"),
                  version=_int(obj, "version"), dtype=obj["dtype"], shape=tuple(shape),
                  name=name, sent_at=None if sent_at is None else float(sent_at),
                  labels=labels)


def decode(frames: Sequence[bytes], *, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
           arrived_at: float = 0.0) -> Message:
    """Validate and decode [header, payload] (and an activation's labels' frame); raises
    TransportError on any mismatch."""
    if len(frames) not in (2, 3):
        raise TransportError(f"expected 2 frames [header, payload] (3 with labels), got "
                             f"{len(frames)}")
    header = parse_header(bytes(frames[0]))
    if (header.labels is not None) != (len(frames) == 3):
        raise TransportError("a labels frame comes with a header's labels count, and only "
                             "with it")
    payload = frames[1]
    dtype = DTYPES[header.dtype]
    count = math.prod(header.shape)
    expected = count * _ITEMSIZE[header.dtype]
    labels_bytes = 8 * (header.labels or 0)
    if expected + labels_bytes > max_bytes:
        raise TransportError(f"message of {expected + labels_bytes} bytes exceeds the limit "
                             f"of {max_bytes}")
    if len(payload) != expected:
        raise TransportError(f"payload has {len(payload)} bytes but the header's shape "
                             f"{list(header.shape)} of {header.dtype} needs {expected}")
    if count == 0:
        tensor = torch.empty(header.shape, dtype=dtype)
    else:
        tensor = torch.frombuffer(bytearray(payload), dtype=dtype).reshape(header.shape)
    labels = None
    if header.labels is not None:
        if len(frames[2]) != labels_bytes:
            raise TransportError(f"labels frame has {len(frames[2])} bytes but {header.labels} "
                                 f"int64 labels need {labels_bytes}")
        labels = (torch.frombuffer(bytearray(frames[2]), dtype=torch.int64) if header.labels
                  else torch.empty(0, dtype=torch.int64))
    return Message(header=header, tensor=tensor, arrived_at=arrived_at, labels=labels)


@dataclass(frozen=True)
class Shaping:
    """What this agent's outgoing line emulates (None: as fast as the machine goes)."""

    bandwidth_bps: float | None = None  # bytes per second
    latency_s: float = 0.0

    def delay_s(self, nbytes: int) -> float:
        wire = nbytes / self.bandwidth_bps if self.bandwidth_bps else 0.0
        return wire + self.latency_s


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


class DataPlane:
    """This agent's inbox and its connections to peers."""

    def __init__(self, *, bind: str, identity: str = "", clock: Callable[[], float] = time.time,
                 shaping: Shaping | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 on_send: Callable[[SendRecord], None] | None = None,
                 on_reject: Callable[[str], None] | None = None,
                 on_weights: Callable[[Message], None] | None = None) -> None:
        self.identity = identity
        self.clock = clock
        self.shaping = shaping or Shaping()
        self._probe_tokens = iter(range(1, 2**62))
        self.max_message_bytes = max_message_bytes
        self.on_send = on_send
        self.on_reject = on_reject
        self.on_weights = on_weights
        self.context = zmq.Context()
        self.inbox_socket = self.context.socket(zmq.PULL)
        self.inbox_socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes + MAX_HEADER_BYTES)
        self.inbox_socket.setsockopt(zmq.LINGER, 0)
        if bind.endswith(":0"):
            port = self.inbox_socket.bind_to_random_port(bind[: bind.rindex(":")])
            self.address = f"{bind[: bind.rindex(':')]}:{port}"
        else:
            self.inbox_socket.bind(bind)
            self.address = bind
        self._peers: dict[str, str] = {}
        self.shaped = self.shaping.bandwidth_bps is not None or self.shaping.latency_s > 0
        # the sockets to peers, used by one thread at a time (zmq sockets are not thread-safe)
        self._sending = threading.Lock()
        self._sockets: dict[str, tuple[str, zmq.Socket[bytes]]] = {}  # peer -> (address, socket)
        self._free_at = 0.0  # when the shaped line is next free
        # messages to send; an Event is a flush marker, None stops the sender
        self._outgoing: queue.Queue[_Outgoing | threading.Event | None] = queue.Queue()
        # by (run, kind, micro-batch, name): a late message of a run that ended (a halted
        # generation's in-flight activation, arriving after the discard) must never be taken
        # for the next run's; it was, and a stage got another model's activation
        self._inbox: dict[tuple[int, str, int, str | None], Message] = {}
        self._inbox_changed = threading.Condition()
        self._stop = threading.Event()
        self.rejected = 0
        self._receiver = threading.Thread(target=self._receive_loop, name="dataplane-recv",
                                          daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name="dataplane-send",
                                        daemon=True)
        self._receiver.start()
        self._sender.start()

    # ---- peers and sending

    def connect(self, peer: str, address: str) -> None:
        """Send to ``peer`` at ``address`` from now on (the next send opens the socket)."""
        self._peers[peer] = address

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
            # interpreter's switch interval while this thread went on computing): a 32 KB
            # activation took 1.6 ms from send to arrival while a pipeline trained
            with self._sending:
                self._deliver(item)
            return
        self._outgoing.put(item)
        if item.done is not None:
            item.done.wait()

    def _socket(self, peer: str) -> zmq.Socket[bytes]:
        """The socket to ``peer``'s current address (under ``_sending``)."""
        address = self._peers[peer]
        known = self._sockets.get(peer)
        if known is not None and known[0] != address:
            # the peer came back elsewhere (a restarted agent binds a new port): what is
            # still queued for the old address is for a process that is gone
            known[1].close(linger=0)
            known = None
        if known is None:
            sock = self.context.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 2000)
            sock.connect(address)
            known = self._sockets[peer] = (address, sock)
        return known[1]

    def _deliver(self, item: _Outgoing) -> None:
        """Send one message now, after the shaped line's delay (under ``_sending``)."""
        sock = self._socket(item.peer)
        nbytes = sum(len(f) for f in item.frames[1:])
        start = max(self.clock(), self._free_at)
        deliver = start + self.shaping.delay_s(nbytes)
        pause = deliver - self.clock()
        if pause > 0:
            time.sleep(pause)
        sock.send_multipart(item.frames, copy=False)
        self._free_at = deliver
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

    def _receive_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.inbox_socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            # take every message waiting, then poll again (a poll per message cost as much
            # as decoding a small one)
            while not self._stop.is_set():
                try:
                    frames = self.inbox_socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._take(frames)

    def _take(self, frames: list[bytes]) -> None:
        """Decode one message and hand it on (a probe answered, weights to the weight
        store, anything else to the inbox); a bad one is rejected, and the loop goes on."""
        try:
            message = decode(frames, max_bytes=self.max_message_bytes,
                             arrived_at=self.clock())
        except TransportError as exc:
            self.rejected += 1
            log.warning("rejected a message: %s", exc)
            if self.on_reject is not None:
                self.on_reject(str(exc))
            return
        name = message.header.name or ""
        if message.header.kind == "probe" and name.startswith("ping:"):
            self._answer_ping(name[5:], message.header)
            return
        if (message.header.kind == "weights" and self.on_weights is not None
                and not name.startswith("fetched:")):
            try:  # a replica to keep or a fetch to answer: the agent's weight store's
                self.on_weights(message)
            except (TransportError, ValueError) as exc:
                self.rejected += 1
                log.warning("rejected weights %r: %s", name, exc)
                if self.on_reject is not None:
                    self.on_reject(f"weights {name!r}: {exc}")
            return
        key = (message.header.run, message.header.kind, message.header.microbatch,
               message.header.name)
        with self._inbox_changed:
            self._inbox[key] = message
            self._inbox_changed.notify_all()

    def _answer_ping(self, sender: str, header: Header) -> None:
        if sender not in self._peers:
            self.rejected += 1
            log.warning("rejected a probe from unknown peer %r", sender)
            return
        self.send(sender, encode(run=header.run, kind="probe", microbatch=header.microbatch,
                                 version=0, tensor=torch.zeros(1, dtype=torch.uint8),
                                 name=f"pong:{self.identity}"))

    def measure_link(self, peer: str, *, pings: int = 8, bulk_bytes: int = 2_000_000,
                     bulk_trips: int = 4, bulk_budget_s: float = 1.0,
                     timeout_s: float = 15.0) -> tuple[float, float]:
        """(bandwidth in bytes/s, latency in s) of the link to ``peer``, measured now: the
        shortest of ``pings`` small round trips and the fastest of up to ``bulk_trips`` bulk ones
        (fewer once they have taken ``bulk_budget_s``, as on a slow link). A single bulk trip
        read anything from 25 to 618 MB/s for the same loopback while three other agents measured
        theirs and the machine's two cores were shared; a trip slowed by its sender or receiver
        waiting for a core only ever reads slow, so the fastest is the link's."""

        def round_trip(size: int, wait_s: float = timeout_s) -> float:
            token = next(self._probe_tokens)
            started = time.perf_counter()
            self.send(peer, encode(run=0, kind="probe", microbatch=token, version=0,
                                   tensor=torch.zeros(size, dtype=torch.uint8),
                                   name=f"ping:{self.identity}"))
            self.receive(0, "probe", token, name=f"pong:{peer}", timeout_s=wait_s)
            return time.perf_counter() - started

        # the peer answers only once it knows this agent: the first ping may come too early
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                first = round_trip(1, wait_s=min(1.0, timeout_s))
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
        shortest = min(first, *(round_trip(1) for _ in range(pings - 1)))
        bulk = [round_trip(bulk_bytes)]
        while len(bulk) < bulk_trips and sum(bulk) < bulk_budget_s:
            bulk.append(round_trip(bulk_bytes))
        return bulk_bytes / max(min(bulk) - shortest, 1e-6), shortest / 2

    def receive(self, run: int, kind: str, microbatch: int, *, name: str | None = None,
                timeout_s: float | None = None,
                cancelled: Callable[[], bool] | None = None) -> Message:
        """Wait for the message ``(run, kind, microbatch, name)``; raises TimeoutError after
        ``timeout_s`` or when ``cancelled()`` turns true."""
        key = (run, kind, microbatch, name)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._inbox_changed:
            while key not in self._inbox:
                if cancelled is not None and cancelled():
                    raise TimeoutError(f"cancelled while waiting for {kind} {microbatch}")
                remaining = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
                if remaining <= 0:
                    raise TimeoutError(f"no {kind} for micro-batch {microbatch} within "
                                       f"{timeout_s} s")
                self._inbox_changed.wait(remaining)
            return self._inbox.pop(key)

    def discard(self, run: int) -> int:
        """Drop every received message of ``run`` (a halted generation's in-flight batches);
        returns how many."""
        with self._inbox_changed:
            stale = [k for k in self._inbox if k[0] == run]
            for key in stale:
                del self._inbox[key]
        return len(stale)

    def pending(self) -> int:
        with self._inbox_changed:
            return len(self._inbox)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything queued so far has been sent (False on timeout)."""
        marker = threading.Event()
        self._outgoing.put(marker)
        return marker.wait(timeout_s)

    def close(self) -> None:
        self._stop.set()
        self._outgoing.put(None)
        self._sender.join(timeout=5)
        self._receiver.join(timeout=5)
        with self._sending:
            for _, sock in self._sockets.values():
                sock.close()
        self.inbox_socket.close()
        self.context.term()
