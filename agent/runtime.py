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
  latency), reported in one ``links`` message, so that planning sees real links.

Every command is acknowledged; one the agent cannot carry out (a stage for another device, a
model it does not know, a run it holds no stage of) is refused with the reason and changes
nothing. Long work (building a stage, profiling, training) runs on threads so that heartbeats
go on.
"""

from __future__ import annotations

import asyncio
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
from dataclasses import dataclass, field
from typing import Any

import torch
import websockets
from websockets.asyncio.client import ClientConnection, connect

from agent.config import AgentConfig, websocket_url
from agent.data import DataError, Dataset, load_dataset
from agent.executor import Clock, Metric, StageError, StageExecutor, StageSpec
from agent.profiler import measure_overhead, profile_model
from agent.transport import DataPlane, SendRecord, Shaping
from agent.zoo import build_model
from orchestrator.events import TimelineEvent

log = logging.getLogger("edgepipe.agent")

Message = dict[str, Any]

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


class AgentRuntime:
    def __init__(self, config: AgentConfig, *, stop: threading.Event | None = None) -> None:
        self.config = config
        self.uid = config.enrolment.uid
        self.stop = stop or threading.Event()
        self.offset_s = 0.0  # server clock - local clock
        self.rtt_s = 0.0  # shortest round trip to the server seen
        self.outbox: deque[Message] = deque()
        self.lock = threading.Lock()
        self.timeline: dict[int, list[TimelineEvent]] = {}
        self.metrics: dict[int, list[dict[str, Any]]] = {}
        self.deployments: dict[int, Deployment] = {}
        self.datasets: dict[str, Dataset] = {}
        self.connected = threading.Event()
        self.rate_window: dict[int, tuple[float, int, int]] = {}  # run -> (since, samples, bytes)
        self.plane = DataPlane(
            bind=f"tcp://{config.data_host}:{config.data_port}", identity=self.uid,
            clock=self.server_time,
            shaping=Shaping(bandwidth_bps=config.bandwidth_bps, latency_s=config.latency_s),
            on_send=self._on_send, on_reject=self._on_reject)
        self.commands: dict[str, Callable[[Message], Message]] = {
            "profile": self._profile, "deploy": self._deploy, "start": self._start,
            "pause": self._pause, "resume": self._resume, "stop": self._stop_run,
            "measure": self._measure}
        if config.threads:
            torch.set_num_threads(config.threads)
        # the receiver, sender and stage threads hand messages to each other: a thread waiting
        # for the interpreter lock should not wait a whole default switch interval (5 ms) per
        # hand-off, which added milliseconds to every hop of a pipeline
        sys.setswitchinterval(0.0005)
        self.overhead_s = 0.0

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
        now = self.server_time()
        with self.lock:
            runs = set(self.timeline) | set(self.metrics)
            for run in sorted(runs):
                timeline = self.timeline.pop(run, [])
                metrics = self.metrics.pop(run, [])
                metrics += self._rates(run, timeline, now)
                if timeline or metrics:
                    self.outbox.append({"type": "events", "run": run,
                                        "timeline": [e.to_json() for e in timeline],
                                        "metrics": metrics})

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
        if deployment.spec.last:
            out.append({"at": at, "kind": "throughput_sps", "device": "",
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
            self.post({"type": "profile_result",
                       "model_spec": {"model": model_name, "dataset": dataset,
                                      "batch_size": batch_size},
                       "profile": profile.to_json()})

        self.spawn(work, f"profile-{model_name}")
        return {"ok": True}

    def _deploy(self, command: Message) -> Message:
        spec = StageSpec.from_json(command["spec"])
        if spec.device != self.uid:
            raise StageError(f"this agent is device {self.uid}; the stage is for {spec.device}")
        if spec.run in self.deployments:
            raise StageError(f"run {spec.run} is already deployed here")
        peers = command.get("peers") or {}
        neighbours = {d for k in (spec.stage - 1, spec.stage + 1, spec.num_stages - 1)
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
        clock = Clock(started_at=0.0, offset_s=self.offset_s)
        deployment_stop, running = threading.Event(), threading.Event()
        running.set()
        executor = StageExecutor(
            spec, module=module, plane=self.plane, clock=clock,
            dataset=data if spec.first else None, on_event=self._event,
            on_metric=lambda m: self._metric(spec.run, m), slowdown=self.config.slowdown,
            stop=deployment_stop, running=running)
        self.deployments[spec.run] = Deployment(spec=spec, executor=executor, clock=clock,
                                                stop=deployment_stop, running=running)
        # a daemon: a pending timer must not keep a stopping agent alive for DEPLOYMENT_TTL_S
        # (it did: `run` took five minutes to exit after SIGTERM following a deployment)
        timer = threading.Timer(DEPLOYMENT_TTL_S, self._drop_if_not_started, args=(spec.run,))
        timer.daemon = True
        timer.start()
        return {"ok": True}

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
        return deployment

    def _start(self, command: Message) -> Message:
        deployment = self._deployment(command)
        if deployment.thread is not None:
            raise StageError(f"run {deployment.spec.run} has already started here")
        started_at = float(command["started_at"])
        deployment.clock.started_at = started_at
        deployment.clock.offset_s = self.offset_s

        def train() -> None:
            wait = started_at - self.server_time()
            if wait > 0:
                deployment.stop.wait(wait)
            run = deployment.spec.run
            try:
                result = deployment.executor.run()
            except (StageError, RuntimeError) as exc:
                log.error("run %s failed: %s", run, exc)
                self._flush_events()
                self.post({"type": "stage_failed", "run": run, "error": str(exc)})
            else:
                self._flush_events()
                if not deployment.stop.is_set():
                    self.post({"type": "stage_done", "run": run,
                               "forwards": len(result.forwards),
                               "backwards": len(result.backwards), "updates": result.updates})
            finally:
                self.deployments.pop(run, None)

        deployment.thread = self.spawn(train, f"run-{deployment.spec.run}")
        return {"ok": True}

    def _pause(self, command: Message) -> Message:
        self._deployment(command).running.clear()
        return {"ok": True}

    def _resume(self, command: Message) -> Message:
        self._deployment(command).running.set()
        return {"ok": True}

    def _stop_run(self, command: Message) -> Message:
        deployment = self.deployments.get(command.get("run"))  # type: ignore[arg-type]
        if deployment is not None:
            deployment.stop.set()
            deployment.running.set()
            if deployment.thread is None:
                self.deployments.pop(deployment.spec.run, None)
        return {"ok": True}

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
        """Measure this device's per-micro-batch overhead (reported at every hello)."""
        self.overhead_s = measure_overhead(slowdown=self.config.slowdown)
        log.info("per-micro-batch overhead %.3f ms", self.overhead_s * 1e3)
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
                                  "overhead_s": self.overhead_s}))
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
            if message.get("type") == "command" and message.get("command") == "deploy":
                # building a stage loads a model and a data set: not on the event loop
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
