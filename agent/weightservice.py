"""This agent's weight service: what it keeps of each run's weights (agent.weights.WeightStore,
per run across generations), and moving them (docs/architecture.md, "Fault tolerance").

- restoring a recovering stage from the parts the server lists: its own memory, a peer over
  the data plane (a ``fetch`` answered by ``fetched``), or the server over REST;
- replication points: the stage's checkpoint to the next stage's device (a chain replica)
  and/or to the server (a global replica, uploaded oldest first by one thread);
- answering peers: keeping the chain replicas they send, answering their fetches. A chain
  replica is kept only from the device that replicates to this one in the run's deployment
  here (:meth:`WeightService.deployed`): the first device of the stage before, of the same
  generation, with the layers that stage holds; any other run peer's is refused.

The names of the weight messages are orchestrator.protocol's typed ones. The data plane and
the server are injected (:class:`Plane`, :class:`ReplicaServer`), so tests can replace them.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx
import torch

from agent.config import Enrolment
from agent.executor import StageError
from agent.weights import (
    Entry,
    Tensors,
    WeightError,
    WeightStore,
    blob_tensor,
    from_bytes,
    load_layer_state,
    to_bytes,
)
from agent.wire import Message as DataMessage
from agent.wire import encode
from orchestrator.protocol import (
    ChainReplica,
    FetchReply,
    HeldCopy,
    ProtocolError,
    RestorePart,
    StageSpec,
    WeightFetch,
    parse_weight_name,
)

log = logging.getLogger("edgepipe.agent")

FETCH_TIMEOUT_S = 20.0  # a recovering stage waits this long for weights from a peer or the server
# a fetch unanswered this long is asked again on a new connection: the holder may have refused
# the first one's handshake, not knowing this device yet (a device back after a loss, asking
# a holder whose deployment naming it is still on its way), and ZeroMQ does not retry it
FETCH_RETRY_S = 5.0
CENTRAL = "central"
SELF = "self"


class Plane(Protocol):
    """What the weight service uses of the data plane (agent.transport.DataPlane)."""

    def repoint(self, peer: str, address: str) -> None: ...

    def reopen(self, peer: str) -> None: ...

    def send(self, peer: str, frames: list[bytes]) -> None: ...

    def receive(self, run: int, kind: str, microbatch: int, *, name: str | None = None,
                timeout_s: float | None = None) -> DataMessage: ...


class ReplicaServer(Protocol):
    """The server's store of global replicas."""

    def get(self, run: int, first: int, last: int, applied: int) -> bytes:
        """Layers first..last at ``applied``; StageError when the server has none."""

    def put(self, run: int, first: int, last: int, applied: int, data: bytes) -> None:
        """Keep a global replica; OSError or ValueError when it did not take it."""


class HttpReplicaServer:
    """The server's ``/api/agent/runs/<run>/replicas/`` over REST; the uploads go over one
    connection (instead of one per replica, which a fast pipeline made a few a second)."""

    def __init__(self, enrolment: Enrolment, *, timeout_s: float = FETCH_TIMEOUT_S) -> None:
        self.enrolment = enrolment
        self.timeout_s = timeout_s
        self._client: httpx.Client | None = None

    def _url(self, run: int) -> str:
        return f"{self.enrolment.server}/api/agent/runs/{run}/replicas/"

    def get(self, run: int, first: int, last: int, applied: int) -> bytes:
        try:
            response = httpx.get(self._url(run), timeout=self.timeout_s,
                                 params={"first": first, "last": last, "applied": applied},
                                 headers={"Authorization": self.enrolment.authorization})
        except httpx.HTTPError as exc:
            raise StageError(f"could not fetch layers {first}..{last} from the server: "
                             f"{exc}") from None
        if response.status_code != 200:
            raise StageError(f"the server has no layers {first}..{last} at {applied} updates "
                             f"({response.status_code}: {response.text[:200]})")
        return response.content

    def put(self, run: int, first: int, last: int, applied: int, data: bytes) -> None:
        if self._client is None:  # on the uploader's thread only
            self._client = httpx.Client(timeout=60, headers={
                "Authorization": self.enrolment.authorization,
                "Content-Type": "application/octet-stream"})
        try:
            response = self._client.put(self._url(run), content=data, params={
                "first": first, "last": last, "applied": applied})
        except httpx.HTTPError as exc:
            raise OSError(str(exc)) from None
        if response.status_code >= 300:
            raise ValueError(f"{response.status_code} {response.text[:200]}")


@dataclass(frozen=True)
class Restored:
    """What a restore loaded (the optimizer's momentum buffers among it) and the bytes it
    moved over the network."""

    tensors: Tensors
    bytes_moved: int


class WeightService:
    def __init__(self, *, uid: str, plane: Plane, reply_to: Callable[[], str],
                 server: ReplicaServer, stop: threading.Event,
                 fetch_timeout_s: float = FETCH_TIMEOUT_S) -> None:
        """``reply_to``: this agent's data-plane address, where peers answer its fetches."""
        self.uid = uid
        self.plane = plane
        self.reply_to = reply_to
        self.server = server
        self.stop = stop
        self.fetch_timeout_s = fetch_timeout_s
        self._lock = threading.Lock()
        self._stores: dict[int, WeightStore] = {}
        self._tokens = itertools.count(1)
        # the stage of pipeline 0 of each run here (the one that keeps weights), as deployed
        self._stages: dict[int, StageSpec] = {}
        # global replicas waiting for the uploader, oldest first; every one is sent (a
        # recovery may need any of the two newest of each stage)
        self._uploads: deque[_Upload] = deque()
        self._uploads_waiting = threading.Condition()
        self._uploader: threading.Thread | None = None
        self._uploading: _Upload | None = None  # the one on its way now

    # ---- what is kept

    def store(self, run: int) -> WeightStore:
        """The run's store (a new one for a run not seen yet)."""
        with self._lock:
            return self._stores.setdefault(run, WeightStore())

    def forget(self, run: int) -> None:
        """The run ended here: drop what it kept."""
        with self._lock:
            self._stores.pop(run, None)
            self._stages.pop(run, None)

    def deployed(self, spec: StageSpec) -> None:
        """The run's stage here is now ``spec`` (of its pipeline 0, whose weights are kept):
        chain replicas come from the device that replicates to it, as ``spec`` says."""
        with self._lock:
            self._stages[spec.run] = spec

    def holdings(self, run: int) -> tuple[HeldCopy, ...]:
        with self._lock:
            store = self._stores.get(run)
        if store is None:
            return ()
        return tuple(HeldCopy.from_json(h) for h in store.holdings())

    def commit(self, run: int, generation: int) -> None:
        """Every device of the new generation is ready: nobody fetches the older ones' weights
        any more, and what they had still to upload goes unsent (past the resume point it is
        training the recovery abandoned; the server would keep it as the newest of its layers
        and drop older replicas for it)."""
        self.store(run).commit(generation)
        kept: deque[_Upload] = deque()
        stale: list[_Upload] = []
        with self._uploads_waiting:
            for item in self._uploads:
                (stale if item.run == run and item.generation != generation else kept
                 ).append(item)
            self._uploads = kept
        for item in stale:
            if item.done is not None:
                item.done.set()

    # ---- restoring

    def restore(self, spec: StageSpec, module: torch.nn.Module, parts: Sequence[RestorePart],
                peers: Mapping[str, str]) -> Restored:
        """Load every part the server listed (own memory, a peer, the server) into the new
        stage; StageError when a part is missing or does not fit (the deployment is then
        refused)."""
        if not parts and spec.first_microbatch == 0:
            # a run that lost a device while starting: nothing was trained, so the stage keeps
            # the weights it was built with from the run's seed, as every first deployment does
            log.info("run %s generation %s: layers %s..%s from the run's seed (nothing trained)",
                     spec.run, spec.generation, spec.layers[0], spec.layers[1])
            return Restored({}, 0)
        tensors: Tensors = {}
        moved = 0
        applied = spec.first_microbatch
        for i, part in enumerate(parts):
            first, last = part.layers
            if part.applied != applied:
                raise StageError(f"restore[{i}] is malformed: applied {part.applied} is not "
                                 f"the resume point {applied}")
            if not spec.layers[0] <= first <= last <= spec.layers[1]:
                raise StageError(f"restore[{i}]: layers {first}..{last} are not in the stage")
            if part.source == SELF:
                got = self.store(spec.run).part(first, last, applied)
                if got is None:
                    raise StageError(f"this agent holds no layers {first}..{last} at "
                                     f"{applied} updates")
            else:
                if part.source == CENTRAL:
                    data, where = self.server.get(spec.run, first, last, applied), "the server"
                else:
                    if part.source not in peers:
                        raise StageError(f"restore[{i}]: no data-plane address for "
                                         f"{part.source}")
                    data = self.fetch(spec.run, part.source, (first, last), applied)
                    where = part.source
                try:
                    got = from_bytes(data, first=first, last=last)
                except WeightError as exc:
                    raise StageError(f"weights from {where}: {exc}") from None
                moved += len(data)
            tensors.update(got)
        try:
            load_layer_state(module, spec.layers[0], tensors)
        except WeightError as exc:
            raise StageError(f"restoring layers {spec.layers[0]}..{spec.layers[1]}: {exc}") \
                from None
        log.info("run %s generation %s: restored layers %s..%s at %s updates (%d bytes moved)",
                 spec.run, spec.generation, spec.layers[0], spec.layers[1], applied, moved)
        return Restored(tensors, moved)

    def fetch(self, run: int, peer: str, layers: tuple[int, int], applied: int) -> bytes:
        """Ask ``peer`` (a peer the data plane knows: the deployment connected it) for layers
        at ``applied`` over the data plane; its safetensors bytes."""
        request = WeightFetch(next(self._tokens), layers, self.uid, self.reply_to())
        frames = encode(run=run, kind="weights", microbatch=applied, version=0,
                        tensor=blob_tensor(b""), name=request.to_name())
        first, last = layers
        deadline = time.monotonic() + self.fetch_timeout_s
        self.plane.send(peer, frames)
        retried = False
        while True:
            remaining = deadline - time.monotonic()
            wait = remaining if retried else min(FETCH_RETRY_S, remaining)
            try:
                reply = self.plane.receive(run, "weights", applied,
                                           name=request.reply().to_name(),
                                           timeout_s=max(0.0, wait))
                break
            except TimeoutError:
                if retried or remaining <= FETCH_RETRY_S:
                    raise StageError(f"{peer} did not send layers {first}..{last} within "
                                     f"{self.fetch_timeout_s:.0f} s") from None
            # once, the same request on a new handshake (an answer to the first is as good)
            self.plane.reopen(peer)
            self.plane.send(peer, frames)
            retried = True
        if reply.tensor.numel() == 0:
            raise StageError(f"{peer} holds no layers {first}..{last} at {applied} updates")
        return reply.tensor.numpy().tobytes()

    # ---- replicating

    def replicate(self, spec: StageSpec, applied: int, tensors: Tensors, *, chain: bool,
                  central: bool) -> None:
        """A replication point: the stage's weights to the next stage's device (the last
        stage's to the first), and/or to the server, without holding up the stage."""
        first, last = spec.layers
        data = to_bytes(tensors, run=spec.run, first=first, last=last, applied=applied)
        if chain and spec.num_stages > 1:
            successor = spec.stage_devices[(spec.stage + 1) % spec.num_stages][0]
            self.plane.send(successor, encode(
                run=spec.run, kind="weights", microbatch=applied, version=spec.generation,
                tensor=blob_tensor(data), name=ChainReplica(spec.layers).to_name()))
        if central:
            self._upload(_Upload(spec.run, spec.generation, first, last, applied, data))

    def upload(self, spec: StageSpec, applied: int, tensors: Tensors, *,
               wait_s: float) -> bool:
        """A global replica of the stage's weights at ``applied``, sent after those queued
        before it; whether the server took it within ``wait_s``."""
        first, last = spec.layers
        item = _Upload(spec.run, spec.generation, first, last, applied,
                       to_bytes(tensors, run=spec.run, first=first, last=last, applied=applied),
                       done=threading.Event())
        self._upload(item)
        return item.done is not None and item.done.wait(wait_s) and item.taken

    def _upload(self, item: _Upload) -> None:
        with self._uploads_waiting:
            self._uploads.append(item)
            self._uploads_waiting.notify()
            if self._uploader is None:
                self._uploader = threading.Thread(target=self._upload_loop,
                                                  name="replica-upload", daemon=True)
                self._uploader.start()

    def _upload_loop(self) -> None:
        """Send the global replicas to the server, oldest first."""
        while not self.stop.is_set():
            with self._uploads_waiting:
                if not self._uploads:
                    self._uploads_waiting.wait(0.5)
                    continue
                item = self._uploading = self._uploads.popleft()
            try:
                self.server.put(item.run, item.first, item.last, item.applied, item.data)
                item.taken = True
            except (OSError, ValueError) as exc:
                log.warning("the server did not take the replica of layers %s..%s: %s",
                            item.first, item.last, exc)
            finally:
                with self._uploads_waiting:
                    self._uploading = None
                    self._uploads_waiting.notify_all()
            if item.done is not None:
                item.done.set()

    def uploads_sent(self, run: int, *, wait_s: float) -> bool:
        """Wait until no replica of ``run`` is queued or on its way (a stage that ends sends
        its last one before it says it is done: a finished run takes none); whether that
        happened within ``wait_s``."""
        def pending() -> bool:
            return (any(item.run == run for item in self._uploads)
                    or (self._uploading is not None and self._uploading.run == run))

        with self._uploads_waiting:
            return self._uploads_waiting.wait_for(lambda: not pending(), timeout=wait_s)

    # ---- answering peers

    def on_weights(self, message: DataMessage) -> None:
        """On the data plane's receiver thread: keep a chain replica, or answer a fetch.
        A malformed one raises ProtocolError (a ValueError: the data plane rejects it)."""
        name = parse_weight_name(message.header.name)
        run, applied = message.header.run, message.header.microbatch
        if isinstance(name, ChainReplica):
            self._check_chain(message, name)
            first, last = name.layers
            tensors = from_bytes(message.tensor.numpy().tobytes(), first=first, last=last)
            self.store(run).add(Entry(layers=name.layers, applied=applied, kind="replica",
                                      tensors=tensors, pinned=True,
                                      generation=message.header.version))
        elif isinstance(name, WeightFetch):
            if name.requester != message.sender:
                raise ProtocolError(f"a fetch naming {name.requester!r} came from "
                                    f"{message.sender or 'an unknown peer'}", field="name")
            # its address now (a restarted agent binds anew), its key as the server gave it:
            # only the requester can read the answer
            self.plane.repoint(name.requester, name.reply_to)
            first, last = name.layers
            with self._lock:
                store = self._stores.get(run)
            part = None if store is None else store.part(first, last, applied)
            data = b"" if part is None else to_bytes(part, run=run, first=first, last=last,
                                                     applied=applied)
            self.plane.send(name.requester, encode(
                run=run, kind="weights", microbatch=applied, version=0,
                tensor=blob_tensor(data), name=name.reply().to_name()))
        else:
            assert isinstance(name, FetchReply)
            raise ProtocolError(f"an answer to fetch {name.token} that nobody waits for",
                                field="name")

    def _check_chain(self, message: DataMessage, name: ChainReplica) -> None:
        """ProtocolError unless the chain replica comes from the device that replicates to
        this one in the run's deployment here: the first device of the stage before (the last
        stage's, for the first stage), of the deployment's generation, with that stage's
        layers (those that end where this stage's begin; for the first stage, the last
        stage's, past every other stage's). Any other peer of the run could have made this
        agent keep (and later restore a recovering stage from) whatever weights it liked."""
        header, sender = message.header, message.sender or "an unknown peer"
        first, last = name.layers
        what = f"a chain replica of layers {first}..{last} from {sender}"
        with self._lock:
            spec = self._stages.get(header.run)
        if spec is None:
            raise ProtocolError(f"{what}: no stage of run {header.run} is deployed here",
                                field="name")
        if spec.num_stages < 2 or spec.replicas[0] != spec.device:
            raise ProtocolError(f"{what}: nobody replicates to this device's stage "
                                f"{spec.stage} of run {spec.run}", field="name")
        source = spec.stage_devices[spec.stage - 1][0]  # stage -1: the last
        if message.sender != source:
            raise ProtocolError(f"{what}: run {spec.run}'s replicas to stage {spec.stage} "
                                f"come from {source}", field="name")
        if header.version != spec.generation:
            raise ProtocolError(f"{what}: of generation {header.version}, the stage here is "
                                f"of generation {spec.generation}", field="version")
        ahead = (last == spec.layers[0] - 1 if spec.stage
                 else first >= spec.layers[1] + spec.num_stages - 1)
        if not ahead:
            raise ProtocolError(f"{what}: not the layers of stage "
                                f"{(spec.stage - 1) % spec.num_stages} (stage {spec.stage} "
                                f"holds {spec.layers[0]}..{spec.layers[1]})", field="name")


@dataclass(eq=False)
class _Upload:
    """A global replica on its way to the server; ``done`` (when someone waits for it) is set
    once the server answered, ``taken`` if it kept it."""

    run: int
    generation: int
    first: int
    last: int
    applied: int
    data: bytes
    done: threading.Event | None = None
    taken: bool = False
