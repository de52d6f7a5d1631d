"""The agent's life: one authenticated WebSocket to the server, commands in, events out.

On connecting the agent says hello (its data plane's address and its hardware), measures its
clock's offset to the server's NTP-style (the ping with the shortest round trip wins, so that
every device's Gantt bars line up), then heartbeats, obeys commands and sends what its stages
produce in batches ten times a second. It reconnects with exponential backoff and jitter and
stops cleanly on SIGTERM; messages wait in an outbox while it is disconnected, so a short
outage loses nothing.

Commands (docs/architecture.md, "Agent control protocol"), one handler each:

- ``profile``: profile a zoo model layer by layer (progress messages, then the profile);
- ``deploy``: build this device's stage of a run and connect to its neighbours;
- ``start``: run the deployed stage from the common start time;
- ``pause`` / ``resume`` / ``stop``: of a run's stage;
- ``measure``: measure the links to the given peers over the data plane (bandwidth and
  latency), reported in one ``links`` message, so that planning sees real links;
- ``halt``: stop a run's stage for a recovery, keeping its weights; the ack lists what this
  agent holds (checkpoints and replicas, docs/architecture.md, "Fault tolerance"), and a
  ``deploy`` of the next generation says what to restore from where;
- ``probe``: does this agent still hold the run's stage (dead, restarted or healthy);
- ``emulate``: change the emulated ``--slowdown`` mid-run (a device heating up);
- ``exit``: fault injection: the process exits at once, as a crash would.

Every command is acknowledged; one the agent cannot carry out (a stage for another device, a
model it does not know, a run it holds no stage of) is refused with the reason and changes
nothing. Long work (building a stage, profiling, training) runs on threads so that heartbeats
go on.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import logging
import math
import os
import platform
import random
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import torch
import websockets
from websockets.asyncio.client import ClientConnection, connect

from agent.config import AgentConfig, websocket_url
from agent.data import DataError, Dataset, load_dataset
from agent.executor import Clock, Metric, StageError, StageExecutor, StageStopped
from agent.profiler import measure_message_cost, measure_overhead, profile_model, warm_times
from agent.transport import DataPlane, SendRecord, Shaping, encode
from agent.transport import Message as DataMessage
from agent.weights import (
    Entry,
    Tensors,
    WeightError,
    WeightStore,
    blob_tensor,
    from_bytes,
    load_layer_state,
    momentum_state,
    to_bytes,
)
from agent.zoo import build_model
from orchestrator.events import TimelineEvent
from orchestrator.formats import LayerTimes, parse_layer_times
from orchestrator.protocol import ProtocolError, StageSpec

log = logging.getLogger("edgepipe.agent")

Message = dict[str, Any]

FETCH_TIMEOUT_S = 20.0  # a recovering stage waits this long for weights from a peer or the server
DEPLOYMENT_TTL_S = 300.0  # a deployed stage whose start does not come is dropped after this
PROGRESS_EVERY_S = 0.5  # profiling progress goes to the server at most this often


def hardware_description() -> dict[str, Any]:
    """What the agent tells the server about this device."""
    memory = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    memory = int(line.split()[1]) * 1024
    except OSError:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"hostname": socket.gethostname(), "os": platform.platform(),
            "machine": platform.machine(), "cpus": os.cpu_count() or 1,
            "memory_bytes": memory, "python": platform.python_version(),
            "torch": torch.__version__}


def load_figures() -> dict[str, float]:
    figures: dict[str, float] = {"loadavg_1m": os.getloadavg()[0]}
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    figures["memory_available_bytes"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return figures


@dataclass
class Deployment:
    """A run's stage held by this agent."""

    spec: StageSpec
    executor: StageExecutor
    clock: Clock
    stop: threading.Event = field(default_factory=threading.Event)
    running: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


def freeze_heap() -> None:
    """Leave what the agent holds for good (torch's and the other modules' objects, a
    deployed stage's model and data) out of the garbage collector's full collections, which
    otherwise walk it all while every thread waits: 250,000 objects, 142 ms on an idle
    machine and 210-260 ms while three agents trained, twice in 3.6 s of a two-stage MLP
    pipeline (both stages stood still; the run trained at 0.66 of its prediction)."""
    gc.collect()
    gc.freeze()


class AgentRuntime:
    def __init__(self, config: AgentConfig, *, stop: threading.Event | None = None) -> None:
        self.config = config
        self.uid = config.enrolment.uid
        self.stop = stop or threading.Event()
        self.offset_s = 0.0  # server clock - local clock
        self.rtt_s = 0.0  # shortest round trip to the server seen
        self.outbox: deque[Message] = deque()
        self.lock = threading.Lock()
        self._flushing = threading.Lock()
        self.timeline: dict[int, list[TimelineEvent]] = {}
        self.metrics: dict[int, list[dict[str, Any]]] = {}
        self.deployments: dict[int, Deployment] = {}
        self.datasets: dict[str, Dataset] = {}
        self.stores: dict[int, WeightStore] = {}  # per run, across generations
        # global replicas waiting for the uploader, oldest first: (run, first, last, applied,
        # bytes); every one is sent (a recovery may need any of the two newest of each stage)
        self._uploads: deque[tuple[int, int, int, int, bytes]] = deque()
        self._uploads_waiting = threading.Condition()
        self._uploader: threading.Thread | None = None
        self._tokens = itertools.count(1)
        self.connected = threading.Event()
        self.rate_window: dict[int, tuple[float, int, int]] = {}  # run -> (since, samples, bytes)
        self.plane = DataPlane(
            bind=f"tcp://{config.data_host}:{config.data_port}", identity=self.uid,
            clock=self.server_time,
            shaping=Shaping(bandwidth_bps=config.bandwidth_bps, latency_s=config.latency_s),
            on_send=self._on_send, on_reject=self._on_reject, on_weights=self._on_weights)
        self.commands: dict[str, Callable[[Message], Message]] = {
            "profile": self._profile, "deploy": self._deploy, "start": self._start,
            "pause": self._pause, "resume": self._resume, "stop": self._stop_run,
            "measure": self._measure, "halt": self._halt, "probe": self._probe,
            "emulate": self._emulate, "exit": self._exit}
        if config.threads:
            torch.set_num_threads(config.threads)
        # the receiver, sender and stage threads hand messages to each other: a thread waiting
        # for the interpreter lock should not wait a whole default switch interval (5 ms) per
        # hand-off, which added milliseconds to every hop of a pipeline
        sys.setswitchinterval(0.0005)
        self.overhead_s = 0.0
        self.message_s = 0.0
        # this machine's warm per-layer times by (model, data set, batch size): kept from each
        # profile (in memory and in config.warm_times_path), measured at deployment when
        # missing; an emulated slowdown paces by them
        self._warm_lock = threading.Lock()
        self.warm: dict[tuple[str, str, int], LayerTimes] = self._load_warm_times()

    def spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        """Start a worker thread for torch work. torch.set_num_threads from the main thread does
        not reach other threads' OpenMP teams: a thread that does not set it runs each op on
        a team of every core (measured: a 0.1 ms layer took 8 ms), so each sets it itself."""
        threads = self.config.threads

        def run() -> None:
            if threads:
                torch.set_num_threads(threads)
            target()

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        return thread

    # ---- clocks and the outbox

    def server_time(self) -> float:
        return time.time() + self.offset_s

    def post(self, message: Message) -> None:
        with self.lock:
            self.outbox.append(message)

    def _flush_events(self) -> None:
        """Move what the stages produced into the outbox, one message per run."""
        with self._flushing:  # one flush at a time, so batches reach the outbox in order
            now = self.server_time()
            with self.lock:  # the stages take it for every event: hold it briefly
                taken = [(run, self.timeline.pop(run, []), self.metrics.pop(run, []))
                         for run in sorted(set(self.timeline) | set(self.metrics))]
            batches: list[Message] = []
            for run, timeline, metrics in taken:
                metrics += self._rates(run, timeline, now)
                if timeline or metrics:
                    batches.append({"type": "events", "run": run,
                                    "timeline": [e.to_json() for e in timeline],
                                    "metrics": metrics})
            if batches:
                with self.lock:
                    self.outbox.extend(batches)

    def _rates(self, run: int, timeline: list[TimelineEvent], now: float) -> list[dict[str, Any]]:
        """Samples per second through the last stage and bytes per second sent, each second."""
        deployment = self.deployments.get(run)
        if deployment is None:
            return []
        since, samples, sent = self.rate_window.get(run, (now, 0, 0))
        if deployment.spec.last:
            samples += sum(deployment.spec.batch_size for e in timeline if e.kind == "backward")
        sent += sum(e.bytes for e in timeline if e.kind == "send")
        if now - since < 1.0:
            self.rate_window[run] = (since, samples, sent)
            return []
        self.rate_window[run] = (now, 0, 0)
        at = deployment.clock.now()
        out = [{"at": at, "kind": "network_bps", "device": self.uid, "value": sent / (now - since)}]
        if deployment.spec.last:  # a replica of the last stage: its own share, by device
            out.append({"at": at, "kind": "throughput_sps",
                        "device": self.uid if deployment.spec.replicated else "",
                        "value": samples / (now - since)})
        return out

    # ---- what stages produce

    def _event(self, event: TimelineEvent) -> None:
        with self.lock:
            self.timeline.setdefault(event.run, []).append(event)

    def _metric(self, run: int, metric: Metric) -> None:
        with self.lock:
            self.metrics.setdefault(run, []).append(
                {"at": metric.at, "kind": metric.name, "device": self.uid, "value": metric.value})

    def _on_send(self, record: SendRecord) -> None:
        deployment = self.deployments.get(record.header.run)
        if deployment is None:
            return
        clock = deployment.clock
        self._event(TimelineEvent(record.header.run, self.uid, deployment.spec.stage, "send",
                                  record.header.microbatch, record.header.version,
                                  record.start - clock.started_at, record.end - clock.started_at,
                                  record.nbytes))

    def _on_reject(self, reason: str) -> None:
        log.warning("data plane rejected a message: %s", reason)

    # ---- commands

    def handle_command(self, command: Message) -> Message:
        """Carry out (or start) a command; returns its ack."""
        name = command.get("command")
        ack: Message = {"type": "ack", "id": command.get("id"), "command": name,
                        "run": command.get("run")}
        if "model" in command:
            ack["model"] = command["model"]
        handler = self.commands.get(str(name))
        if handler is None:
            return {**ack, "ok": False, "error": f"unknown command {name!r}"}
        try:
            return {**ack, **handler(command)}
        except (StageError, DataError, ValueError, KeyError, TypeError) as exc:
            log.warning("refused %s: %s", name, exc)
            return {**ack, "ok": False, "error": str(exc)}

    def _dataset(self, name: str) -> Dataset:
        if name not in self.datasets:
            self.datasets[name] = load_dataset(name)
        return self.datasets[name]

    def _profile(self, command: Message) -> Message:
        model_name, dataset = str(command["model"]), str(command.get("dataset", "digits"))
        batch_size = int(command.get("batch_size", 32))
        data = self._dataset(dataset)
        model = build_model(model_name, input_shape=data.input_shape,
                            num_classes=data.num_classes)

        def work() -> None:
            last = [-math.inf]

            def progress(done: int, total: int) -> None:
                # a step per layer, then one per timed sweep (hundreds for a small model):
                # the server hears of them at most every PROGRESS_EVERY_S, and of the last
                now = time.monotonic()
                if done < total and now - last[0] < PROGRESS_EVERY_S:
                    return
                last[0] = now
                self.post({"type": "profile_progress", "model": model_name, "done": done,
                           "total": total})

            try:
                profile = profile_model(model, batch_size=batch_size, reference=self.uid,
                                        dataset=dataset, slowdown=self.config.slowdown,
                                        progress=False, on_layer=progress)
            except (RuntimeError, ValueError) as exc:
                self.post({"type": "profile_failed", "model": model_name, "error": str(exc)})
                return
            self._keep_warm_times((model_name, dataset, batch_size),
                                  warm_times(profile, slowdown=self.config.slowdown))
            self.post({"type": "profile_result",
                       "model_spec": {"model": model_name, "dataset": dataset,
                                      "batch_size": batch_size},
                       "profile": profile.to_json()})

        self.spawn(work, f"profile-{model_name}")
        return {"ok": True}

    def _load_warm_times(self) -> dict[tuple[str, str, int], LayerTimes]:
        path = self.config.warm_times_path
        if path is None or not path.exists():
            return {}
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            return {(str(e["model"]), str(e["dataset"]), int(e["batch_size"])):
                    parse_layer_times(e["layer_times"], file=str(path)) for e in raw}
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("%s: not warm layer times (%s); measuring them again", path, exc)
            return {}

    def _keep_warm_times(self, key: tuple[str, str, int], times: LayerTimes) -> None:
        """Keep a model spec's warm times (a profile's thread and a deployment may both)."""
        with self._warm_lock:
            self.warm[key] = times
            path = self.config.warm_times_path
            if path is None:
                return
            document = [{"model": m, "dataset": d, "batch_size": b,
                         "layer_times": t.to_json()}
                        for (m, d, b), t in self.warm.items()]
            try:
                partial = path.with_suffix(".partial")
                partial.write_text(json.dumps(document), encoding="utf-8")
                partial.replace(path)
            except OSError as exc:
                log.warning("could not keep the warm layer times in %s: %s", path, exc)

    def _warm_times(self, model: str, dataset: str, batch_size: int) -> LayerTimes:
        """This machine's warm per-layer times for a model spec: kept from its profile, or
        measured now, on a copy of the model (an agent started since it was profiled)."""
        key = (model, dataset, batch_size)
        if key not in self.warm:
            data = self._dataset(dataset)
            probe = build_model(model, input_shape=data.input_shape,
                                num_classes=data.num_classes)
            if self.config.threads:  # this is a pool thread (see spawn)
                torch.set_num_threads(self.config.threads)
            log.info("measuring %s's warm layer times for its emulated slowdown", model)
            self._keep_warm_times(key, warm_times(
                profile_model(probe, batch_size=batch_size, reference=self.uid,
                              dataset=dataset, progress=False), slowdown=1.0))
        return self.warm[key]

    def _deploy(self, command: Message) -> Message:
        try:
            spec = StageSpec.from_json(command.get("spec"))
        except ProtocolError as exc:
            raise StageError(f"malformed stage deployment: {exc}") from None
        if spec.device != self.uid:
            raise StageError(f"this agent is device {self.uid}; the stage is for {spec.device}")
        if spec.run in self.deployments:
            raise StageError(f"run {spec.run} is already deployed here")
        peers = command.get("peers") or {}
        # the stages before and after it, the last (labels), the next one round (chain
        # replicas) and its own group (gradients)
        neighbours = {d for k in (spec.stage - 1, spec.stage, spec.stage + 1,
                                  spec.num_stages - 1, (spec.stage + 1) % spec.num_stages)
                      if 0 <= k < spec.num_stages for d in spec.stage_devices[k]} - {self.uid}
        missing = sorted(d for d in neighbours if not isinstance(peers.get(d), str))
        if missing:
            raise StageError(f"no data-plane address for neighbour {missing[0]}")
        data = self._dataset(spec.dataset)
        model = build_model(spec.model, input_shape=data.input_shape,
                            num_classes=data.num_classes, seed=spec.seed)
        module = model.stage(*spec.layers)
        for peer in sorted(neighbours):
            self.plane.connect(peer, peers[peer])
        clock = Clock(started_at=float(command.get("started_at") or 0.0), offset_s=self.offset_s)
        restore = command.get("restore")
        store = self.stores.setdefault(spec.run, WeightStore())
        restored: Tensors = {}
        if restore is not None:
            restored = self._restore(spec, module, restore, peers, clock)
        elif spec.generation:
            raise StageError("a deployment of a later generation needs restore")
        deployment_stop, running = threading.Event(), threading.Event()
        running.set()
        executor = StageExecutor(
            spec, module=module, plane=self.plane, clock=clock,
            dataset=data if spec.first else None, on_event=self._event,
            on_metric=lambda m: self._metric(spec.run, m), slowdown=self.config.slowdown,
            warm=self._warm_times(spec.model, spec.dataset, spec.batch_size),
            stop=deployment_stop, running=running, store=store, threads=self.config.threads,
            optimizer_state=momentum_state(restored),
            on_checkpoint=lambda applied, tensors, chain, central: self._replicate(
                spec, applied, tensors, chain=chain, central=central),
            on_suspect=lambda microbatch, waited: self.post({
                "type": "suspect", "run": spec.run, "generation": spec.generation,
                "microbatch": microbatch, "waited_s": waited}))
        self.deployments[spec.run] = Deployment(spec=spec, executor=executor, clock=clock,
                                                stop=deployment_stop, running=running)
        freeze_heap()  # the stage's model, data and schedule live as long as the stage
        # a daemon: a pending timer must not keep a stopping agent alive for DEPLOYMENT_TTL_S
        # (it did: `run` took five minutes to exit after SIGTERM following a deployment)
        timer = threading.Timer(DEPLOYMENT_TTL_S, self._drop_if_not_started, args=(spec.run,))
        timer.daemon = True
        timer.start()
        return {"ok": True, "generation": spec.generation}

    # ---- weights: restoring, replicating, serving

    def _restore(self, spec: StageSpec, module: torch.nn.Module, restore: Any,
                 peers: dict[str, Any], clock: Clock) -> Tensors:
        """Load every part the server listed (own memory, a peer, the server) into the new
        stage, and return what came (the optimizer's momentum buffers among it); refuses the
        deployment when a part is missing or does not fit."""
        if not isinstance(restore, list):
            raise StageError("restore must be a list of parts")
        if not restore and spec.first_microbatch == 0:
            # a run that lost a device while starting: nothing was trained, so the stage keeps
            # the weights it was built with from the run's seed, as every first deployment does
            log.info("run %s generation %s: layers %s..%s from the run's seed (nothing trained)",
                     spec.run, spec.generation, spec.layers[0], spec.layers[1])
            return {}
        began = clock.now()
        tensors: Tensors = {}
        moved = 0
        applied = spec.first_microbatch
        for i, part in enumerate(restore):
            try:
                first, last = (int(x) for x in part["layers"])
                source = str(part["source"])
                if int(part["applied"]) != applied:
                    raise ValueError(f"applied {part['applied']} is not the resume point "
                                     f"{applied}")
            except (KeyError, TypeError, ValueError) as exc:
                raise StageError(f"restore[{i}] is malformed: {exc}") from None
            if not spec.layers[0] <= first <= last <= spec.layers[1]:
                raise StageError(f"restore[{i}]: layers {first}..{last} are not in the stage")
            if source == "self":
                got = self.stores[spec.run].part(first, last, applied)
                if got is None:
                    raise StageError(f"this agent holds no layers {first}..{last} at "
                                     f"{applied} updates")
            elif source == "central":
                got, size = self._fetch_central(spec.run, first, last, applied)
                moved += size
            else:
                address = peers.get(source)
                if not isinstance(address, str):
                    raise StageError(f"restore[{i}]: no data-plane address for {source}")
                got, size = self._fetch_peer(spec.run, source, address, first, last, applied)
                moved += size
            tensors.update(got)
        try:
            load_layer_state(module, spec.layers[0], tensors)
        except WeightError as exc:
            raise StageError(f"restoring layers {spec.layers[0]}..{spec.layers[1]}: {exc}") \
                from None
        self._event(TimelineEvent(spec.run, self.uid, spec.stage, "load", applied, 0,
                                  began, max(began, clock.now()), moved))
        log.info("run %s generation %s: restored layers %s..%s at %s updates (%d bytes moved)",
                 spec.run, spec.generation, spec.layers[0], spec.layers[1], applied, moved)
        return tensors

    def _fetch_peer(self, run: int, peer: str, address: str, first: int, last: int,
                    applied: int) -> tuple[Tensors, int]:
        self.plane.connect(peer, address)
        token = next(self._tokens)
        self.plane.send(peer, encode(
            run=run, kind="weights", microbatch=applied, version=0,
            tensor=blob_tensor(b""),
            name=f"fetch:{token}:{first}-{last}:{self.uid}={self.advertised_address}"))
        try:
            reply = self.plane.receive(run, "weights", applied, name=f"fetched:{token}",
                                       timeout_s=FETCH_TIMEOUT_S)
        except TimeoutError:
            raise StageError(f"{peer} did not send layers {first}..{last} within "
                             f"{FETCH_TIMEOUT_S:.0f} s") from None
        if reply.tensor.numel() == 0:
            raise StageError(f"{peer} holds no layers {first}..{last} at {applied} updates")
        data = reply.tensor.numpy().tobytes()
        try:
            return from_bytes(data, first=first, last=last), len(data)
        except WeightError as exc:
            raise StageError(f"weights from {peer}: {exc}") from None

    def _replica_url(self, run: int) -> str:
        return f"{self.config.enrolment.server}/api/agent/runs/{run}/replicas/"

    def _fetch_central(self, run: int, first: int, last: int, applied: int
                       ) -> tuple[Tensors, int]:
        try:
            response = httpx.get(self._replica_url(run), timeout=FETCH_TIMEOUT_S,
                                 params={"first": first, "last": last, "applied": applied},
                                 headers={"Authorization": self.config.enrolment.authorization})
        except httpx.HTTPError as exc:
            raise StageError(f"could not fetch layers {first}..{last} from the server: "
                             f"{exc}") from None
        if response.status_code != 200:
            raise StageError(f"the server has no layers {first}..{last} at {applied} updates "
                             f"({response.status_code}: {response.text[:200]})")
        try:
            return from_bytes(response.content, first=first, last=last), len(response.content)
        except WeightError as exc:
            raise StageError(f"weights from the server: {exc}") from None

    def _replicate(self, spec: StageSpec, applied: int, tensors: Tensors, *, chain: bool,
                   central: bool) -> None:
        """A replication point: the stage's weights to the next stage's device (the last
        stage's to the first), and/or to the server, without holding up the stage."""
        first, last = spec.layers
        data = to_bytes(tensors, run=spec.run, first=first, last=last, applied=applied)
        if chain and spec.num_stages > 1:
            successor = spec.stage_devices[(spec.stage + 1) % spec.num_stages][0]
            self.plane.send(successor, encode(run=spec.run, kind="weights", microbatch=applied,
                                              version=spec.generation, tensor=blob_tensor(data),
                                              name=f"replica:{first}-{last}"))
        if central:
            with self._uploads_waiting:
                self._uploads.append((spec.run, first, last, applied, data))
                self._uploads_waiting.notify()
                if self._uploader is None:
                    self._uploader = threading.Thread(target=self._upload_loop,
                                                      name="replica-upload", daemon=True)
                    self._uploader.start()

    def _upload_loop(self) -> None:
        """Send the global replicas to the server, oldest first, over one connection
        (instead of a thread and a TCP connection per replica, which a fast pipeline made a
        few times a second)."""
        headers = {"Authorization": self.config.enrolment.authorization,
                   "Content-Type": "application/octet-stream"}
        with httpx.Client(timeout=60, headers=headers) as client:
            while not self.stop.is_set():
                with self._uploads_waiting:
                    if not self._uploads:
                        self._uploads_waiting.wait(0.5)
                        continue
                    run, first, last, applied, data = self._uploads.popleft()
                try:
                    response = client.put(self._replica_url(run), content=data, params={
                        "first": first, "last": last, "applied": applied})
                except httpx.HTTPError as exc:
                    log.warning("replica of layers %s..%s to the server failed: %s",
                                first, last, exc)
                    continue
                if response.status_code >= 300:
                    log.warning("the server refused the replica of layers %s..%s: %s %s",
                                first, last, response.status_code, response.text[:200])

    def _on_weights(self, message: DataMessage) -> None:
        """On the data plane's receiver thread: keep a chain replica, or answer a fetch."""
        name = message.header.name or ""
        run = message.header.run
        kind, _, rest = name.partition(":")
        if kind == "replica":
            first, last = (int(x) for x in rest.split("-"))
            tensors = from_bytes(message.tensor.numpy().tobytes(), first=first, last=last)
            self.stores.setdefault(run, WeightStore()).add(Entry(
                layers=(first, last), applied=message.header.microbatch, kind="replica",
                tensors=tensors, pinned=True, generation=message.header.version))
        elif kind == "fetch":
            token, layers, reply_to = rest.split(":", 2)
            first, last = (int(x) for x in layers.split("-"))
            requester, _, address = reply_to.partition("=")
            if not address.startswith("tcp://"):
                raise ValueError(f"fetch from {requester!r} without a reply address")
            self.plane.connect(requester, address)
            store = self.stores.get(run)
            applied = message.header.microbatch
            part = None if store is None else store.part(first, last, applied)
            data = b"" if part is None else to_bytes(part, run=run, first=first, last=last,
                                                     applied=applied)
            self.plane.send(requester, encode(run=run, kind="weights", microbatch=applied,
                                              version=0, tensor=blob_tensor(data),
                                              name=f"fetched:{token}"))
        else:
            raise ValueError(f"unknown weights message {name!r}")

    def _drop_if_not_started(self, run: int) -> None:
        """A deployment whose start never came (the run failed elsewhere, the server went)
        frees its memory."""
        deployment = self.deployments.get(run)
        if deployment is not None and deployment.thread is None:
            log.warning("run %s was deployed here but never started; dropped", run)
            self.deployments.pop(run, None)

    def _deployment(self, command: Message) -> Deployment:
        run = command.get("run")
        deployment = self.deployments.get(run) if isinstance(run, int) else None
        if deployment is None:
            raise StageError(f"no stage of run {run} is deployed here")
        generation = command.get("generation")
        if generation is not None and generation != deployment.spec.generation:
            raise StageError(f"run {run}'s stage here is of generation "
                             f"{deployment.spec.generation}, not {generation}")
        return deployment

    def _start(self, command: Message) -> Message:
        deployment = self._deployment(command)
        if deployment.thread is not None:
            raise StageError(f"run {deployment.spec.run} has already started here")
        started_at = float(command["started_at"])
        begin_at = float(command.get("begin_at") or started_at)
        deployment.clock.started_at = started_at
        deployment.clock.offset_s = self.offset_s
        if command.get("paused"):  # a paused run's recovery: built, waiting for "resume"
            deployment.running.clear()
        # the commit: every device of the new generation is ready, nobody fetches any more
        self.stores.setdefault(deployment.spec.run, WeightStore()).commit(
            deployment.spec.generation)

        def train() -> None:
            wait = begin_at - self.server_time()
            if wait > 0:
                deployment.stop.wait(wait)
            spec = deployment.spec
            run = spec.run
            try:
                result = deployment.executor.run()
            except StageStopped:
                self._flush_events()
            except (StageError, RuntimeError) as exc:
                self._flush_events()
                if not deployment.stop.is_set():
                    log.error("run %s failed: %s", run, exc)
                    self.post({"type": "stage_failed", "run": run, "error": str(exc),
                               "generation": spec.generation})
            else:
                self._flush_events()
                if not deployment.stop.is_set():
                    done: Message = {
                        "type": "stage_done", "run": run, "generation": spec.generation,
                        "forwards": len(result.forwards), "backwards": len(result.backwards),
                        "updates": result.updates, "applied_from": spec.first_microbatch,
                        "updated": result.updated}
                    done.update(self._measured_costs(deployment))
                    self.post(done)
            finally:
                if self.deployments.get(run) is deployment:
                    self.deployments.pop(run, None)

        deployment.thread = self.spawn(train, f"run-{deployment.spec.run}")
        return {"ok": True, "generation": deployment.spec.generation}

    def _measured_costs(self, deployment: Deployment) -> dict[str, float]:
        """This device's ``overhead_s``, ``message_s`` and ``pass_overhead_s`` for the stage's
        model as the stage just measured them, in the conditions it trained in (the other
        threads and processes sharing the processor, the checkpoints and replicas): its fixed
        time per micro-batch beyond its sends, the time of a send, and how much of the fixed
        time was spent inside the passes (their events count it). The server keeps them with
        the device's profile of the model. Empty when the stage measured nothing."""
        costs = deployment.executor.fixed_costs()
        if costs is None:
            return {}
        sending = costs.sends_per_microbatch * (costs.send_s or 0.0)
        overhead = max(0.0, costs.fixed_s - sending)
        out = {"overhead_s": overhead, "pass_overhead_s": min(costs.pass_s, overhead)}
        if costs.send_s is not None:
            out["message_s"] = costs.send_s
        log.info("run %s, stage %s: a micro-batch cost %.3f ms beyond its passes over %d "
                 "micro-batches, %.3f ms of it in %.1f sends: overhead %.3f ms (%.3f ms inside "
                 "the passes), per message %s (the probes': %.3f ms, %.3f ms)",
                 deployment.spec.run, deployment.spec.stage, costs.fixed_s * 1e3,
                 costs.microbatches, sending * 1e3, costs.sends_per_microbatch, overhead * 1e3,
                 out["pass_overhead_s"] * 1e3,
                 "-" if costs.send_s is None else f"{costs.send_s * 1e3:.3f} ms",
                 self.overhead_s * 1e3, self.message_s * 1e3)
        return out

    def _pause(self, command: Message) -> Message:
        self._deployment(command).running.clear()
        return {"ok": True}

    def _resume(self, command: Message) -> Message:
        self._deployment(command).running.set()
        return {"ok": True}

    def _end(self, run: int) -> Deployment | None:
        """Stop the run's stage here and wait for it; drop what it received."""
        deployment = self.deployments.pop(run, None)
        if deployment is not None:
            deployment.stop.set()
            deployment.running.set()
            if deployment.thread is not None:
                deployment.thread.join(timeout=30)
        self.plane.discard(run)
        return deployment

    def _stop_run(self, command: Message) -> Message:
        run = command.get("run")
        if isinstance(run, int):
            deployment = self.deployments.get(run)
            if deployment is not None:
                deployment.stop.set()
                deployment.running.set()
                if deployment.thread is None:
                    self.deployments.pop(run, None)
            self.stores.pop(run, None)
        return {"ok": True}

    def _halt(self, command: Message) -> Message:
        """Stop the run's stage for a recovery, keep every weight held; report them."""
        run = command.get("run")
        if not isinstance(run, int):
            raise StageError("halt needs a run")
        deployment = self._end(run)
        store = self.stores.get(run)
        applied = None if deployment is None else deployment.executor.applied
        log.info("run %s halted for generation %s (at %s updates)", run,
                 command.get("generation"), applied)
        return {"ok": True, "generation": command.get("generation"),
                "holdings": [] if store is None else store.holdings(), "applied": applied}

    def _probe(self, command: Message) -> Message:
        deployment = self.deployments.get(command.get("run"))  # type: ignore[arg-type]
        return {"ok": True, "holds": deployment is not None,
                "generation": None if deployment is None else deployment.spec.generation,
                "applied": None if deployment is None else deployment.executor.applied}

    def _emulate(self, command: Message) -> Message:
        """Change the emulated slowdown now (a device heating up, for tests and demos): the
        stages running here slow down from their next pass; profiles taken later see it."""
        slowdown = command.get("slowdown")
        if isinstance(slowdown, bool) or not isinstance(slowdown, (int, float)) or not (
                1 <= slowdown <= 1000):
            raise StageError("emulate needs slowdown, a number from 1 to 1000")
        self.config = replace(self.config, slowdown=float(slowdown))
        for deployment in list(self.deployments.values()):
            deployment.executor.set_slowdown(float(slowdown))
        log.warning("now emulating a device %gx slower", slowdown)
        return {"ok": True, "slowdown": float(slowdown)}

    def _exit(self, command: Message) -> Message:
        log.warning("told to exit by the server (fault injection): exiting now")
        logging.shutdown()
        os._exit(70)

    def _measure(self, command: Message) -> Message:
        peers = command.get("peers")
        if not isinstance(peers, dict) or not all(
                isinstance(a, str) and a.startswith("tcp://") for a in peers.values()):
            raise StageError("measure needs peers: {uid: tcp://host:port}")
        others = {uid: address for uid, address in peers.items() if uid != self.uid}
        for uid, address in others.items():
            self.plane.connect(uid, address)

        def work() -> None:
            links = []
            for uid in sorted(others):
                try:
                    bandwidth, latency = self.plane.measure_link(uid)
                except TimeoutError as exc:
                    log.warning("could not measure the link to %s: %s", uid, exc)
                    continue
                links.append({"peer": uid, "bandwidth_bps": bandwidth, "latency_s": latency})
                log.info("link to %s: %.1f MB/s, %.2f ms", uid, bandwidth / 1e6, latency * 1e3)
            self.post({"type": "links", "links": links})

        self.spawn(work, "measure")
        return {"ok": True}

    @property
    def busy(self) -> bool:
        return any(d.thread is not None for d in self.deployments.values())

    # ---- the connection

    def calibrate(self) -> float:
        """Measure this device's per-micro-batch overhead and per-message cost (reported at
        every hello)."""
        self.overhead_s = measure_overhead(slowdown=self.config.slowdown)
        self.message_s = measure_message_cost()
        log.info("per-micro-batch overhead %.3f ms, per message %.3f ms",
                 self.overhead_s * 1e3, self.message_s * 1e3)
        freeze_heap()
        return self.overhead_s

    async def serve(self) -> None:
        """Connect, and reconnect with backoff, until ``stop`` is set."""
        backoff = 0.5
        url = websocket_url(self.config.enrolment.server)
        while not self.stop.is_set():
            try:
                async with connect(url, additional_headers={
                        "Authorization": self.config.enrolment.authorization},
                        max_size=64 * 2**20, open_timeout=10) as ws:
                    backoff = 0.5
                    await self._session(ws)
            except (TimeoutError, OSError, websockets.exceptions.WebSocketException) as exc:
                if isinstance(exc, websockets.exceptions.InvalidStatus):
                    log.error("the server refused this agent (%s): is it enrolled, or retired?",
                              exc.response.status_code)
                else:
                    log.warning("connection to %s lost: %s", url, exc)
            finally:
                self.connected.clear()
            if self.stop.is_set():
                break
            delay = min(self.config.max_backoff_s, backoff) * random.uniform(0.5, 1.5)
            backoff *= 2
            log.info("reconnecting in %.1f s", delay)
            await asyncio.get_running_loop().run_in_executor(None, self.stop.wait, delay)

    async def _session(self, ws: ClientConnection) -> None:
        await ws.send(json.dumps({"type": "hello", "data_address": self.advertised_address,
                                  "hardware": hardware_description(),
                                  "overhead_s": self.overhead_s,
                                  "message_s": self.message_s}))
        early: list[Message] = []
        welcome = await self._await_reply(ws, "welcome", early)
        log.info("connected to %s as %s (%s)", self.config.enrolment.server, welcome["device"],
                 welcome.get("name"))
        await self._sync_clock(ws, early)
        link: Message = {"type": "link", "latency_s": self.config.latency_s + self.rtt_s / 2}
        if self.config.bandwidth_bps is not None:
            link["bandwidth_bps"] = self.config.bandwidth_bps
        self.post(link)
        self.connected.set()
        for message in early:
            self._dispatch(message)
        tasks = [asyncio.create_task(coro) for coro in (
            self._receive(ws), self._heartbeat(ws), self._send(ws), self._watch_stop(ws))]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    @property
    def advertised_address(self) -> str:
        port = self.plane.address.rsplit(":", 1)[1]
        return f"tcp://{self.config.data_host}:{port}"

    async def _await_reply(self, ws: ClientConnection, kind: str,
                           early: list[Message]) -> Message:
        while True:
            message = json.loads(await asyncio.wait_for(ws.recv(), timeout=30))
            if message.get("type") == kind:
                return message  # type: ignore[no-any-return]
            if message.get("type") == "error":
                raise websockets.exceptions.WebSocketException(
                    f"the server refused {kind}: {message.get('detail')}")
            early.append(message)

    async def _sync_clock(self, ws: ClientConnection, early: list[Message], *,
                          pings: int = 8) -> None:
        """NTP-style: offset = server time - midpoint of the round trip, from the ping with
        the shortest round trip (the least queueing)."""
        best: tuple[float, float] | None = None
        for i in range(pings):
            sent = time.time()
            await ws.send(json.dumps({"type": "ping", "id": i}))
            pong = await self._await_reply(ws, "pong", early)
            received = time.time()
            rtt = received - sent
            offset = float(pong["server_time"]) - (sent + received) / 2
            if best is None or rtt < best[0]:
                best = (rtt, offset)
        assert best is not None
        self.offset_s = best[1]
        self.rtt_s = best[0]
        log.info("clock offset to the server %.2f ms (round trip %.2f ms)",
                 1e3 * self.offset_s, 1e3 * best[0])

    def _dispatch(self, message: Message) -> None:
        kind = message.get("type")
        if kind == "command":
            self.post(self.handle_command(message))
        elif kind == "error":
            log.warning("the server refused a message: %s", message.get("detail"))
        elif kind not in ("stored", "profile_stored", "pong", "welcome"):
            log.debug("ignored %s", kind)

    async def _receive(self, ws: ClientConnection) -> None:
        loop = asyncio.get_running_loop()
        async for raw in ws:
            message = json.loads(raw)
            if message.get("type") == "command" and message.get("command") in ("deploy", "halt"):
                # building a stage loads a model, a data set and maybe weights from peers;
                # halting waits for the stage to stop: not on the event loop
                ack = await loop.run_in_executor(None, self.handle_command, message)
                self.post(ack)
            else:
                self._dispatch(message)

    async def _heartbeat(self, ws: ClientConnection) -> None:
        while True:
            self.post({"type": "heartbeat", "status": "busy" if self.busy else "online",
                       "load": load_figures()})
            await asyncio.sleep(self.config.heartbeat_s)

    async def _send(self, ws: ClientConnection) -> None:
        while True:
            self._flush_events()
            while True:
                with self.lock:
                    if not self.outbox:
                        break
                    message = self.outbox[0]
                await ws.send(json.dumps(message))
                with self.lock:
                    self.outbox.popleft()
            await asyncio.sleep(self.config.flush_s)

    async def _watch_stop(self, ws: ClientConnection) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.stop.wait)
        for deployment in list(self.deployments.values()):
            deployment.stop.set()
            deployment.running.set()
        self._flush_events()
        await ws.close()

    def close(self) -> None:
        self.stop.set()
        for deployment in list(self.deployments.values()):
            deployment.stop.set()
            deployment.running.set()
            if deployment.thread is not None:
                deployment.thread.join(timeout=10)
        self.plane.close()
