"""Deploying and starting a run's stage on this agent: ``deploy`` builds the stage (its model
part, its data, maybe weights restored from where the server says) and holds it; ``start``
runs it on its own thread from the common start time and reports how it ended
(``stage_done`` with the fixed costs it measured, or ``stage_failed``). A deployment whose
start does not come is dropped after DEPLOYMENT_TTL_S.

A deployment admits the run's peers its command names to this agent's data plane, instead
of those an earlier deployment of the run named (a device the new generation leaves out can
no longer reach it); the run's end here revokes them: at once when the server stops the run
(agent.handlers) or the deployment is dropped unstarted, RUN_END_GRACE_S after its stages
here ended by themselves (a recovery of the rest of the pipeline may still fetch their
weights).

A generation that resumes from copies keeps its weights at the resume point here at once,
and uploads them to the server before it says it is ready (when the run keeps global
replicas): the commit that follows makes every survivor drop its older copies, and a device
lost before the new layout's first replicas took its layers' only copy with it (issue 28:
training started again from the seed)."""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Callable

import torch
from torch import nn

from agent.connection import Connection
from agent.data import Dataset
from agent.deployments import Deployment, Deployments, RegistryError, StageKey
from agent.executor import Clock, StageError, StageExecutor, StageStopped
from agent.layout import faster_format, has_conv2d, stage_example, to_format
from agent.reporting import Reporter
from agent.transport import DataPlane
from agent.turns import Turn, Turnstile
from agent.warmtimes import WarmTimes
from agent.weights import momentum_state
from agent.weightservice import WeightService
from agent.workers import freeze_heap, spawn
from agent.zoo import ZooModel, build_model
from orchestrator.events import TimelineEvent
from orchestrator.protocol import (
    Ack,
    DeployCommand,
    StageDone,
    StageFailed,
    StageSpec,
    StartCommand,
    Suspect,
)

log = logging.getLogger("edgepipe.agent")

DEPLOYMENT_TTL_S = 300.0  # a deployed stage whose start does not come is dropped after this
# a run whose stages here have ended keeps its peers admitted this long: the rest of the
# pipeline drains, and may lose a device and recover from weights held here (the server
# sends no stop when a run finishes)
RUN_END_GRACE_S = 300.0
# a resumed generation waits this long at most for the server to take its weights at the
# resume point before it says it is ready (it goes on without, logging that it did)
PROTECT_WAIT_S = 30.0
# a stage that ends waits this long at most for its replicas to reach the server before it
# says it is done (the last round's aggregated model of a split run, say)
UPLOADS_WAIT_S = 30.0


def reads_data(spec: StageSpec) -> bool:
    """Does this stage read the data set: the first (inputs), and the last of a U-shaped
    pipeline (its labels, which never leave the device that holds both ends)."""
    return spec.first or (spec.last and spec.u_shaped)


def run_grant(run: int) -> tuple[str, int]:
    """What a run's peers are admitted under on the data plane (DataPlane.admit)."""
    return ("run", run)


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
        # the turnstile each run's generation shares among its stages here that take turns
        # (agent.turns), kept while one of them holds it
        self.turnstiles: weakref.WeakValueDictionary[tuple[int, int], Turnstile] = (
            weakref.WeakValueDictionary())
        self._turnstiles_lock = threading.Lock()
        # the memory format each stage shape runs fastest in here (agent.layout), timed at
        # its first deployment: by model, data set, micro-batch size and layers
        self.formats: dict[tuple[str, str, int, int, int], str] = {}
        self._formats_lock = threading.Lock()

    def stage_format(self, spec: StageSpec, model: ZooModel, module: nn.Module,
                     input_shape: tuple[int, ...]) -> str:
        """The memory format the stage's module runs fastest in on this device: timed on a
        copy at the first deployment of its shape, then kept."""
        if not has_conv2d(module):
            return "contiguous"
        key = (spec.model, spec.dataset, spec.batch_size, *spec.layers)
        with self._formats_lock:
            found = self.formats.get(key)
        if found is not None:
            return found
        if self.threads:  # a pool thread (see agent.workers.spawn), as the stage's own
            torch.set_num_threads(self.threads)
        example = stage_example([layer.module for layer in model.layers], input_shape,
                                spec.batch_size, spec.layers[0])
        found = faster_format(module, example)
        log.info("%s layers %d..%d run %s here (timed both layouts)", spec.model,
                 spec.layers[0], spec.layers[1], found.replace("_", " "))
        with self._formats_lock:
            self.formats[key] = found
        return found

    def turnstile(self, spec: StageSpec) -> Turnstile | None:
        """The turnstile of the spec's run and generation on this device (None: the stage
        takes no turns), made by the first of its stages deployed here."""
        if not spec.turns:
            return None
        with self._turnstiles_lock:
            key = (spec.run, spec.generation)
            found = self.turnstiles.get(key)
            if found is None:
                found = self.turnstiles[key] = Turnstile(
                    [Turn(p, kind, n) for p, kind, n, _, _ in spec.turns],
                    first_microbatch=spec.first_microbatch)
            return found

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
        # admit them (any may fetch weights), instead of the run's earlier deployment's peers
        others = {uid: address for uid, address in command.peers.items() if uid != self.uid}
        self.plane.admit(run_grant(spec.run), {uid: command.keys[uid] for uid in others})
        for uid, address in others.items():
            self.plane.connect(uid, address, command.keys[uid], admit=False)
        if command.restore is None and spec.generation:
            raise StageError("a deployment of a later generation needs restore")
        data = self.dataset(spec.dataset)
        if spec.shard is not None:  # this pipeline's own part of the training set
            data = data.shard(*spec.shard, split=spec.shard_split, seed=spec.seed)
        model = build_model(spec.model, input_shape=data.input_shape,
                            num_classes=data.num_classes, seed=spec.seed)
        module = model.stage(*spec.layers)
        to_format(module, self.stage_format(spec, model, module, tuple(data.input_shape)))
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
            dataset=data if reads_data(spec) else None, on_event=self.reporter.event,
            on_metric=lambda m: self.reporter.metric(spec.run, m), slowdown=self.slowdown(),
            warm=self.warm.get(spec.model, spec.dataset, spec.batch_size),
            stop=stop, running=running, store=store, threads=self.threads,
            optimizer_state=momentum_state(restored), turns=self.turnstile(spec),
            on_checkpoint=lambda applied, tensors, chain, central: self.weights.replicate(
                spec, applied, tensors, chain=chain, central=central),
            on_suspect=lambda microbatch, waited: self.connection.post(Suspect(
                run=spec.run, generation=spec.generation, microbatch=microbatch,
                waited_s=max(0.0, waited))))
        if store is not None:
            self.weights.deployed(spec)
            if spec.first_microbatch and command.restore is not None:
                self._protect(spec, executor)
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
        return Ack.to(command, generation=spec.generation, pipeline=spec.pipeline,
                      stage=spec.stage)

    def _protect(self, spec: StageSpec, executor: StageExecutor) -> None:
        """Keep the restored weights at the resume point, and (its group's first device, when
        the run keeps global replicas) have the server keep them before this deployment says
        it is ready: from the commit on, nobody else may hold a copy of them."""
        tensors = executor.checkpoint(pinned=True)
        if tensors is None or not executor.replicates or not spec.global_every:
            return
        if not self.weights.upload(spec, spec.first_microbatch, tensors,
                                   wait_s=PROTECT_WAIT_S):
            log.warning("run %s generation %s: the server has no copy of layers %s..%s at "
                        "the resume point %s; until their first replica, they have none but "
                        "this device's", spec.run, spec.generation, spec.layers[0],
                        spec.layers[1], spec.first_microbatch)

    def _drop_if_not_started(self, key: StageKey) -> None:
        """A deployment whose start never came (the run failed elsewhere, the server went)
        frees its memory, and its peers are no longer admitted."""
        if self.deployments.drop_unstarted(key) is not None:
            log.warning("run %s was deployed here but never started; dropped", key.run)
            if key.run not in self.deployments:
                self.plane.revoke(run_grant(key.run))

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
                                                 generation=spec.generation,
                                                 pipeline=spec.pipeline, stage=spec.stage))
        else:
            self.reporter.flush()
            # (a stage may send the rounds' averages without global_every: Sharing.exclude)
            if not self.weights.uploads_sent(spec.run, wait_s=UPLOADS_WAIT_S):
                log.warning("run %s: replicas still on their way to the server after %g s",
                            spec.run, UPLOADS_WAIT_S)
            if not deployment.stop.is_set():
                self.connection.post(StageDone(
                    run=spec.run, generation=spec.generation, pipeline=spec.pipeline,
                    stage=spec.stage, forwards=len(result.forwards),
                    backwards=len(result.backwards), updates=result.updates,
                    applied_from=spec.first_microbatch, updated=tuple(result.updated),
                    **measured_costs(deployment)))
        finally:
            self.deployments.remove(deployment)
            if not deployment.stop.is_set() and spec.run not in self.deployments:
                # the run ended here by itself (a halt or a stop set ``stop``: a halted run is
                # redeployed or stopped, and a stop revokes at once)
                self.plane.revoke(run_grant(spec.run), after_s=RUN_END_GRACE_S)


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
    inbox = deployment.executor.plane.inbox
    log.info("this agent's inbox so far: %d messages read by a waiting stage, %d by the "
             "receiving thread, which a stage woke %d times", inbox.read_by_stage,
             inbox.read_by_background, inbox.wakes)
    if overhead > 10:
        return {}
    return {name: value for name, value in out.items() if value <= 10}
