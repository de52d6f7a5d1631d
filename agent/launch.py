"""Deploying and starting a run's stage on this agent: ``deploy`` builds the stage (its model
part, its data, maybe weights restored from where the server says) and holds it; ``start``
runs it on its own thread from the common start time and reports how it ended
(``stage_done`` with the fixed costs it measured, or ``stage_failed``). A deployment whose
start does not come is dropped after DEPLOYMENT_TTL_S."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable

from agent.connection import Connection
from agent.data import Dataset
from agent.deployments import Deployment, Deployments, RegistryError, StageKey
from agent.executor import Clock, StageError, StageExecutor, StageStopped
from agent.reporting import Reporter
from agent.transport import DataPlane
from agent.warmtimes import WarmTimes
from agent.weights import momentum_state
from agent.weightservice import WeightService
from agent.workers import freeze_heap, spawn
from agent.zoo import build_model
from orchestrator.events import TimelineEvent
from orchestrator.protocol import (
    Ack,
    DeployCommand,
    StageDone,
    StageFailed,
    StartCommand,
    Suspect,
)

log = logging.getLogger("edgepipe.agent")

DEPLOYMENT_TTL_S = 300.0  # a deployed stage whose start does not come is dropped after this


def neighbours(command: DeployCommand) -> set[str]:
    """The devices a stage talks to: the stages before and after it, the last (labels), the
    next one round (chain replicas), its own replicas (gradients) and its aggregation
    group's members (weights)."""
    spec = command.spec
    return ({d for k in (spec.stage - 1, spec.stage, spec.stage + 1, spec.num_stages - 1,
                         (spec.stage + 1) % spec.num_stages)
             if 0 <= k < spec.num_stages for d in spec.stage_devices[k]}
            | {device for device, _, _ in spec.group}) - {spec.device}


class Launcher:
    def __init__(self, *, uid: str, threads: int | None, plane: DataPlane,
                 connection: Connection, deployments: Deployments, weights: WeightService,
                 reporter: Reporter, warm: WarmTimes, dataset: Callable[[str], Dataset],
                 slowdown: Callable[[], float]) -> None:
        """``slowdown``: the emulated slowdown now (``emulate`` changes it)."""
        self.uid = uid
        self.threads = threads
        self.plane = plane
        self.connection = connection
        self.deployments = deployments
        self.weights = weights
        self.reporter = reporter
        self.warm = warm
        self.dataset = dataset
        self.slowdown = slowdown

    def deploy(self, command: DeployCommand) -> Ack:
        spec = command.spec
        if spec.device != self.uid:
            raise StageError(f"this agent is device {self.uid}; the stage is for {spec.device}")
        if self.deployments.get(StageKey(spec.run, spec.pipeline, spec.stage)) is not None:
            raise StageError(f"run {spec.run}'s stage {spec.stage} of pipeline "
                             f"{spec.pipeline} is already deployed here")
        missing = sorted(neighbours(command) - set(command.peers))
        if missing:
            raise StageError(f"no data-plane address for neighbour {missing[0]}")
        for uid, address in command.peers.items():  # and admit them: any may fetch weights
            if uid != self.uid:
                self.plane.connect(uid, address, command.keys[uid])
        if command.restore is None and spec.generation:
            raise StageError("a deployment of a later generation needs restore")
        data = self.dataset(spec.dataset)
        model = build_model(spec.model, input_shape=data.input_shape,
                            num_classes=data.num_classes, seed=spec.seed)
        module = model.stage(*spec.layers)
        clock = Clock(started_at=command.started_at or 0.0, offset_s=self.connection.offset_s)
        # checkpoints and replicas are kept by run and layers: a run of several pipelines,
        # whose stages on one device may hold the same layers, keeps pipeline 0's only
        store = self.weights.store(spec.run) if spec.pipeline == 0 else None
        restored = {}
        if command.restore is not None:
            began = clock.now()
            loaded = self.weights.restore(spec, module, command.restore, command.peers)
            restored = loaded.tensors
            if loaded.tensors:
                self.reporter.event(TimelineEvent(
                    spec.run, self.uid, spec.stage, "load", spec.first_microbatch, 0, began,
                    max(began, clock.now()), loaded.bytes_moved))
        stop, running = threading.Event(), threading.Event()
        running.set()
        executor = StageExecutor(
            spec, module=module, plane=self.plane, clock=clock,
            dataset=data if spec.first else None, on_event=self.reporter.event,
            on_metric=lambda m: self.reporter.metric(spec.run, m), slowdown=self.slowdown(),
            warm=self.warm.get(spec.model, spec.dataset, spec.batch_size),
            stop=stop, running=running, store=store, threads=self.threads,
            optimizer_state=momentum_state(restored),
            on_checkpoint=lambda applied, tensors, chain, central: self.weights.replicate(
                spec, applied, tensors, chain=chain, central=central),
            on_suspect=lambda microbatch, waited: self.connection.post(Suspect(
                run=spec.run, generation=spec.generation, microbatch=microbatch,
                waited_s=max(0.0, waited))))
        deployment = Deployment(spec=spec, executor=executor, clock=clock, stop=stop,
                                running=running)
        try:
            self.deployments.add(deployment)
        except RegistryError as exc:
            raise StageError(str(exc)) from None
        freeze_heap()  # the stage's model, data and schedule live as long as the stage
        # a daemon: a pending timer must not keep a stopping agent alive for DEPLOYMENT_TTL_S
        # (it did: `run` took five minutes to exit after SIGTERM following a deployment)
        timer = threading.Timer(DEPLOYMENT_TTL_S, self._drop_if_not_started,
                                args=(deployment.key,))
        timer.daemon = True
        timer.start()
        return Ack.to(command, generation=spec.generation)

    def _drop_if_not_started(self, key: StageKey) -> None:
        """A deployment whose start never came (the run failed elsewhere, the server went)
        frees its memory."""
        if self.deployments.drop_unstarted(key) is not None:
            log.warning("run %s was deployed here but never started; dropped", key.run)

    def start(self, command: StartCommand, held: list[Deployment]) -> Ack:
        """Start the run's stages ``held`` here (their generation checked)."""
        if any(d.started for d in held):
            raise StageError(f"run {command.run} has already started here")
        begin_at = command.begin_at or command.started_at
        # the commit: every device of the new generation is ready, nobody fetches any more
        self.weights.commit(command.run, held[0].spec.generation)
        for deployment in held:
            deployment.clock.started_at = command.started_at
            deployment.clock.offset_s = self.connection.offset_s
            if command.paused:  # a paused run's recovery: built, waiting for "resume"
                deployment.running.clear()
            if self.deployments.begin(deployment):
                deployment.thread = spawn(functools.partial(self._train, deployment, begin_at),
                                          f"run-{command.run}", threads=self.threads)
        return Ack.to(command, generation=held[0].spec.generation)

    def _train(self, deployment: Deployment, begin_at: float) -> None:
        wait = begin_at - self.connection.server_time()
        if wait > 0:
            deployment.stop.wait(wait)
        spec = deployment.spec
        try:
            result = deployment.executor.run()
        except StageStopped:
            self.reporter.flush()
        except (StageError, RuntimeError) as exc:
            self.reporter.flush()
            if not deployment.stop.is_set():
                log.error("run %s failed: %s", spec.run, exc)
                self.connection.post(StageFailed(run=spec.run, error=str(exc)[:4000],
                                                 generation=spec.generation))
        else:
            self.reporter.flush()
            if not deployment.stop.is_set():
                self.connection.post(StageDone(
                    run=spec.run, generation=spec.generation, forwards=len(result.forwards),
                    backwards=len(result.backwards), updates=result.updates,
                    applied_from=spec.first_microbatch, updated=tuple(result.updated),
                    **measured_costs(deployment)))
        finally:
            self.deployments.remove(deployment)


def measured_costs(deployment: Deployment) -> dict[str, float]:
    """This device's ``overhead_s``, ``message_s`` and ``pass_overhead_s`` for the stage's
    model as the stage just measured them, in the conditions it trained in (the other threads
    and processes sharing the processor, the checkpoints and replicas): its fixed time per
    micro-batch beyond its sends, the time of a send, and how much of the fixed time was
    spent inside the passes (their events count it). The server keeps them with the device's
    profile of the model. Empty when the stage measured nothing, or more than a
    ``stage_done`` carries (10 s: a stage that stood still)."""
    costs = deployment.executor.fixed_costs()
    if costs is None:
        return {}
    sending = costs.sends_per_microbatch * (costs.send_s or 0.0)
    overhead = max(0.0, costs.fixed_s - sending)
    out = {"overhead_s": overhead, "pass_overhead_s": min(costs.pass_s, overhead)}
    if costs.send_s is not None:
        out["message_s"] = costs.send_s
    log.info("run %s, stage %s: a micro-batch cost %.3f ms beyond its passes over %d "
             "micro-batches, %.3f ms of it in %.1f sends: overhead %.3f ms (%.3f ms inside the "
             "passes), per message %s", deployment.spec.run, deployment.spec.stage,
             costs.fixed_s * 1e3, costs.microbatches, sending * 1e3, costs.sends_per_microbatch,
             overhead * 1e3, out["pass_overhead_s"] * 1e3,
             "-" if costs.send_s is None else f"{costs.send_s * 1e3:.3f} ms")
    if overhead > 10:
        return {}
    return {name: value for name, value in out.items() if value <= 10}
