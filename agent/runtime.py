"""The agent's life: one control connection to the server, commands in, events out.

:class:`AgentRuntime` composes the agent's parts, each of which can be tested alone:

- the control connection (agent.connection: the session over a WebSocket, its outbox, the
  clock's offset to the server, heartbeats, reconnecting), injected, so that a test can
  connect a runtime to an in-process harness instead of a server;
- the data plane to the other agents (agent.transport);
- the stages held here, in a locked registry by (run, pipeline, stage) (agent.deployments);
- the command handlers (agent.handlers, deploying and starting in agent.launch);
- the weight service (agent.weightservice: restoring, replicating, answering fetches);
- what the stages produce, batched for the server (agent.reporting), with the device's CPU,
  memory and temperature while it trains (agent.system), and this machine's warm layer times
  (agent.warmtimes).

It says hello with its data plane's address, its hardware, its measured fixed costs and its
emulated compute resources (``--resources``), and stops cleanly on SIGTERM (agent.cli).
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from agent.calibration import FixedCosts
from agent.config import AgentConfig
from agent.connection import Connect, Session, websocket_channel
from agent.data import Dataset, load_dataset
from agent.deployments import Deployments
from agent.handlers import CommandHandlers
from agent.profiler import measure_message_cost, measure_overhead
from agent.reporting import Reporter
from agent.security import DataKeys, load_or_create_keys
from agent.system import SystemMonitor
from agent.transport import DataPlane, Shaping
from agent.warmtimes import WarmTimes
from agent.weightservice import HttpReplicaServer, ReplicaServer, WeightService
from agent.workers import freeze_heap, spawn
from orchestrator.events import TimelineEvent
from orchestrator.protocol import PROTOCOL, Ack, Heartbeat, Hello

log = logging.getLogger("edgepipe.agent")


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


class AgentRuntime:
    def __init__(self, config: AgentConfig, *, stop: threading.Event | None = None,
                 connection: Session | None = None,
                 replica_server: ReplicaServer | None = None) -> None:
        """``connection``: the control connection (a new :class:`Session` by default);
        ``replica_server``: the server's store of global replicas (its REST API by
        default)."""
        self.config = config
        self.uid = config.enrolment.uid
        self.stop = stop or threading.Event()
        self.connection = connection or Session(config, stop=self.stop)
        self.deployments = Deployments()
        self.reporter = Reporter(uid=self.uid, deployments=self.deployments,
                                 post=self.connection.post, clock=self.connection.server_time)
        self.system = SystemMonitor(deployments=self.deployments, report=self.reporter.metric)
        self.plane = DataPlane(
            bind=f"tcp://{config.data_host}:{config.data_port}", identity=self.uid,
            clock=self.connection.server_time,
            keys=(DataKeys.generate() if config.data_keys_dir is None
                  else load_or_create_keys(config.data_keys_dir)),
            shaping=Shaping(bandwidth_bps=config.bandwidth_bps, latency_s=config.latency_s),
            on_send=self.reporter.on_send, on_reject=self._on_reject,
            on_weights=lambda message: self.weights.on_weights(message))
        self.weights = WeightService(
            uid=self.uid, plane=self.plane, reply_to=lambda: self.advertised_address,
            server=replica_server or HttpReplicaServer(config.enrolment), stop=self.stop)
        self.dataset: Callable[[str], Dataset] = functools.cache(
            functools.partial(load_dataset, data_dir=config.data_dir))
        self.warm = WarmTimes(path=config.warm_times_path, uid=self.uid,
                              threads=config.threads, dataset=self.dataset)
        self.handlers = CommandHandlers(
            uid=self.uid, threads=config.threads, slowdown=config.slowdown, plane=self.plane,
            connection=self.connection, deployments=self.deployments, weights=self.weights,
            reporter=self.reporter, warm=self.warm, dataset=self.dataset)
        if config.threads:
            torch.set_num_threads(config.threads)
        # the receiver, sender and stage threads hand messages to each other: a thread waiting
        # for the interpreter lock should not wait a whole default switch interval (5 ms) per
        # hand-off, which added milliseconds to every hop of a pipeline
        sys.setswitchinterval(0.0005)
        self.overhead_s = 0.0
        self.message_s = 0.0

    @property
    def connected(self) -> threading.Event:
        return self.connection.connected

    @property
    def advertised_address(self) -> str:
        port = self.plane.address.rsplit(":", 1)[1]
        return f"tcp://{self.config.data_host}:{port}"

    def spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        """A worker thread for torch work (agent.workers.spawn, with this agent's threads)."""
        return spawn(target, name, threads=self.config.threads)

    def record_event(self, event: TimelineEvent) -> None:
        """Report a timeline event as the stages do (for benchmarks feeding the live path)."""
        self.reporter.event(event)

    _event = record_event  # bench/live.py's name for it

    def _on_reject(self, reason: str) -> None:
        log.warning("data plane rejected a message: %s", reason)

    def calibrate(self, measured: FixedCosts | None = None) -> float:
        """This device's per-micro-batch overhead and per-message cost (reported at every
        hello): ``measured`` (agent.calibration: probed as the agent started, or kept from an
        earlier start), else measured now."""
        if measured is None:
            measured = FixedCosts(overhead_s=measure_overhead(slowdown=self.config.slowdown),
                                  message_s=measure_message_cost())
        self.overhead_s, self.message_s = measured.overhead_s, measured.message_s
        log.info("per-micro-batch overhead %.3f ms, per message %.3f ms",
                 self.overhead_s * 1e3, self.message_s * 1e3)
        freeze_heap()
        return self.overhead_s

    # ---- what the session asks of the agent (agent.connection.SessionAgent)

    def hello(self) -> Hello:
        return Hello(protocol=PROTOCOL, data_address=self.advertised_address,
                     data_key=self.plane.public_key.decode("ascii"),
                     hardware=hardware_description(),
                     overhead_s=min(10.0, self.overhead_s), message_s=min(10.0, self.message_s),
                     resources=self.config.resources or None)

    def heartbeat(self) -> Heartbeat:
        return Heartbeat(status="busy" if self.deployments.busy else "online",
                         load=load_figures())

    def handle_command(self, raw: Any) -> Ack:
        """Carry out (or start) the command ``raw`` (its JSON); returns its ack."""
        return self.handlers.handle(raw)

    def blocks(self, raw: Any) -> bool:
        return self.handlers.blocks(raw)

    def flush(self) -> None:
        self.system.tick()  # CPU, memory and temperature every few seconds while training
        self.reporter.flush()

    def stopping(self) -> None:
        for deployment in self.deployments.all():
            deployment.end()

    # ---- running

    async def serve(self, *, connect_to: Connect = websocket_channel) -> None:
        """Connect, and reconnect with backoff, until ``stop`` is set."""
        await self.connection.serve(self, connect_to=connect_to)

    def close(self) -> None:
        self.stop.set()
        for deployment in self.deployments.all():
            deployment.end()
            if deployment.thread is not None:
                deployment.thread.join(timeout=10)
        self.plane.close()
