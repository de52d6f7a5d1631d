"""The stage executor: runs this device's action list (orchestrator.schedule) through one
dispatch table, exchanging activations, gradients and labels with its neighbours.

- ``F`` (forward): stage 0 reads micro-batch m from the data set and sends its labels straight to
  the last stage; other stages take the activation from the inbox. The output goes to the next
  stage's device for m, or, on the last stage, into the loss (cross-entropy) and accuracy.
- ``B`` (backward): the last stage differentiates its loss; others take the gradient of their
  output from the inbox. The gradient of the input goes back to the previous stage's device.
- ``U`` (update): SGD with momentum; each update is a new weight version.
- ``A`` (all-reduce among a stage's replicas) is refused at deployment: this runtime runs one
  device per stage.

Weight stashing (PipeDream, FTPipeHD): a forward runs on a snapshot of the weights of its version
(cloned tensors put in the parameters' places for the call), and its backward differentiates
that same graph, so updates in between never touch what a pending backward needs. A stage
stashes only for the micro-batches whose action list has an update between their forward and
backward: never under GPipe, never on a 1F1B stage with one micro-batch in flight (the last).
Under 1F1B the gradient of micro-batch m (computed with the version m saw) is applied to the
latest weights at its ``U``; under GPipe gradients accumulate until the flush's single
update. With vertical sync
every stage forwards micro-batch m with the version stage 0 used for it (carried in the message
header), as PipeDream's vertical sync prescribes.

Every forward, backward and update becomes a timeline event (shared schema, run clock); the
data plane reports sends and this executor records receives; the last stage reports loss and
accuracy per micro-batch.

What a micro-batch costs the stage beyond its paced passes (``fixed_costs``): over the steady
state (from the fifth of its backwards on), its time less what it waited (for a neighbour's
message, or paused) and less what its passes should take (the emulated factor times their warm
times), per micro-batch, and what its sends took each; and how much of it was spent inside the
passes, beyond their paced time. The agent turns them into its device's ``overhead_s``,
``message_s`` and ``pass_overhead_s`` for the model (docs/architecture.md, "A device's fixed
overhead").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from agent.data import Dataset
from agent.emulation import Slowdown
from agent.optim import SGD
from agent.transport import DataPlane, Message, encode_message
from agent.weights import (
    Entry,
    Tensors,
    WeightStore,
    momentum_refs,
    parameter_slots,
    snapshot,
    state_refs,
)
from orchestrator.events import TimelineEvent
from orchestrator.formats import LayerTimes
from orchestrator.schedule import Action, Schedule, build_schedule


class StageError(RuntimeError):
    """The stage cannot go on (a neighbour stopped answering, a deployment it cannot run)."""


class StageStopped(StageError):
    """The stage was told to stop (or halt) while it waited: not a failure."""


@dataclass(frozen=True)
class StageSpec:
    """Everything a device needs to run its stage of a run; sent by the server as JSON."""

    run: int
    device: str
    stage: int
    layers: tuple[int, int]
    model: str
    dataset: str
    batch_size: int
    schedule: str
    stage_devices: tuple[tuple[str, ...], ...]
    stage_times_s: tuple[tuple[float, ...], ...]
    microbatches: int
    flush_every: int | None = None
    inflight: tuple[int, ...] | None = None
    lr: float = 0.1
    momentum: float = 0.0
    seed: int = 0
    vertical_sync: bool = False
    receive_timeout_s: float = 60.0
    # fault tolerance (docs/architecture.md, "Fault tolerance")
    generation: int = 0
    first_microbatch: int = 0  # resume point: this generation runs first_microbatch..end
    chain_every: int = 0  # micro-batches applied between chain replicas (0: off)
    global_every: int = 0  # micro-batches applied between replicas to the server (0: off)
    suspect_factor: float = 4.0  # backward timer: late by this many average batch times
    suspect_min_s: float = 0.5

    @property
    def num_stages(self) -> int:
        return len(self.stage_devices)

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.num_stages - 1

    def build_schedule(self) -> Schedule:
        """The schedule of this generation's micro-batches, numbered from 0 (the executor
        adds ``first_microbatch``)."""
        return build_schedule(name=self.schedule, stage_devices=self.stage_devices,
                              stage_times_s=self.stage_times_s,
                              microbatches=self.microbatches - self.first_microbatch,
                              flush_every=self.flush_every, inflight=self.inflight)

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run, "device": self.device, "stage": self.stage,
                "layers": list(self.layers), "model": self.model, "dataset": self.dataset,
                "batch_size": self.batch_size, "schedule": self.schedule,
                "stage_devices": [list(s) for s in self.stage_devices],
                "stage_times_s": [list(t) for t in self.stage_times_s],
                "microbatches": self.microbatches, "flush_every": self.flush_every,
                "inflight": None if self.inflight is None else list(self.inflight),
                "lr": self.lr, "momentum": self.momentum, "seed": self.seed,
                "vertical_sync": self.vertical_sync,
                "receive_timeout_s": self.receive_timeout_s, "generation": self.generation,
                "first_microbatch": self.first_microbatch, "chain_every": self.chain_every,
                "global_every": self.global_every, "suspect_factor": self.suspect_factor,
                "suspect_min_s": self.suspect_min_s}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> StageSpec:
        try:
            spec = cls(
                run=int(raw["run"]), device=str(raw["device"]), stage=int(raw["stage"]),
                layers=(int(raw["layers"][0]), int(raw["layers"][1])), model=str(raw["model"]),
                dataset=str(raw["dataset"]), batch_size=int(raw["batch_size"]),
                schedule=str(raw["schedule"]),
                stage_devices=tuple(tuple(str(d) for d in s) for s in raw["stage_devices"]),
                stage_times_s=tuple(tuple(float(t) for t in s) for s in raw["stage_times_s"]),
                microbatches=int(raw["microbatches"]),
                flush_every=None if raw.get("flush_every") is None else int(raw["flush_every"]),
                inflight=None if raw.get("inflight") is None else tuple(
                    int(x) for x in raw["inflight"]),
                lr=float(raw.get("lr", 0.1)), momentum=float(raw.get("momentum", 0.0)),
                seed=int(raw.get("seed", 0)), vertical_sync=bool(raw.get("vertical_sync", False)),
                receive_timeout_s=float(raw.get("receive_timeout_s", 60.0)),
                generation=int(raw.get("generation", 0)),
                first_microbatch=int(raw.get("first_microbatch", 0)),
                chain_every=int(raw.get("chain_every", 0)),
                global_every=int(raw.get("global_every", 0)),
                suspect_factor=float(raw.get("suspect_factor", 4.0)),
                suspect_min_s=float(raw.get("suspect_min_s", 0.5)))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise StageError(f"malformed stage deployment: {exc!r}") from None
        spec.check()
        return spec

    def check(self) -> None:
        if not 0 <= self.stage < self.num_stages:
            raise StageError(f"stage {self.stage} is not in 0..{self.num_stages - 1}")
        if self.device not in self.stage_devices[self.stage]:
            raise StageError(f"device {self.device!r} does not serve stage {self.stage}")
        replicated = [k for k, s in enumerate(self.stage_devices) if len(s) > 1]
        if replicated:
            raise StageError(f"stage {replicated[0]} has several devices; this runtime runs one "
                             "device per stage (choose a plan without replicated stages)")
        if self.batch_size < 1 or self.microbatches < 1 or self.lr <= 0:
            raise StageError("batch_size, microbatches and lr must be positive")
        if not 0 <= self.first_microbatch < self.microbatches:
            raise StageError(f"first_microbatch {self.first_microbatch} is not in "
                             f"0..{self.microbatches - 1}")
        if self.schedule == "gpipe" and self.first_microbatch % (self.flush_every or 1):
            raise StageError("under gpipe a generation resumes at a batch boundary "
                             f"(first_microbatch a multiple of {self.flush_every})")
        if min(self.generation, self.chain_every, self.global_every) < 0 or not (
                self.suspect_factor > 0 and self.suspect_min_s > 0):
            raise StageError("generation, chain_every and global_every must not be negative, "
                             "suspect_factor and suspect_min_s must be positive")

    @property
    def tag(self) -> str:
        """The data-plane name of this generation's messages: a late activation of the
        generation before a recovery is never taken for one of this generation."""
        return f"g{self.generation}"


@dataclass
class Metric:
    name: str
    value: float
    microbatch: int
    at: float


@dataclass
class Clock:
    """Seconds since the run started, on the server's clock (the agent's offset applied)."""

    started_at: float  # server epoch seconds
    offset_s: float = 0.0  # server clock - local clock

    def absolute(self) -> float:
        """The server's epoch time (what headers' ``sent_at`` and the data plane use)."""
        return time.time() + self.offset_s

    def now(self) -> float:
        return self.absolute() - self.started_at


@dataclass
class _InFlight:
    version: int
    header_version: int
    inputs: torch.Tensor
    output: torch.Tensor  # the loss on the last stage
    params: list[torch.Tensor]


STEADY_FROM = 0.2  # the fraction of a stage's backwards before its steady state (the fill)
MIN_STEADY_MICROBATCHES = 20  # fewer in the steady state measure no fixed cost


@dataclass(frozen=True)
class Mark:
    """The fixed cost's clock at a backward's end."""

    at: float
    waited_s: float
    paced_s: float
    passed_s: float
    sent_s: float
    sends: int
    backwards: int


@dataclass(frozen=True)
class FixedCosts:
    """What a stage measured over its steady state, per micro-batch beyond its paced passes
    and waits (``fixed_s``, its sends included), and per send (``send_s``; None without
    sends). ``pass_s``: the part of ``fixed_s`` spent inside the timed passes, beyond what
    they should take (the loss, an autograd call's own cost, a sleep that woke late and could
    not be repaid): their timeline events show it as the layers' work, which capacity
    estimation must not count twice."""

    microbatches: int
    fixed_s: float
    sends_per_microbatch: float
    send_s: float | None
    pass_s: float


@dataclass
class StageResult:
    forwards: list[int] = field(default_factory=list)
    backwards: list[int] = field(default_factory=list)
    updates: int = 0
    updated: list[int] = field(default_factory=list)  # micro-batches whose update was applied


Checkpoint = Callable[[int, dict[str, torch.Tensor], bool, bool], None]


# the method each kind of action runs, by name: a dict of the executor's bound methods made every
# executor a reference cycle, which the agent's frozen heap (runtime.freeze_heap) never
# collects, so each deployment's model, data and stashes stayed in memory after it ended
# (VGG-5: 20 MB more per deployment, for good)
HANDLERS = {"F": "forward", "B": "backward", "U": "update", "A": "all_reduce"}


class StageExecutor:
    """Runs one stage's action list to the end (or until ``stop`` is set)."""

    def __init__(self, spec: StageSpec, *, module: nn.Module, plane: DataPlane,
                 clock: Clock, dataset: Dataset | None = None,
                 on_event: Callable[[TimelineEvent], None] | None = None,
                 on_metric: Callable[[Metric], None] | None = None,
                 slowdown: float = 1.0, stop: threading.Event | None = None,
                 running: threading.Event | None = None, store: WeightStore | None = None,
                 on_checkpoint: Checkpoint | None = None,
                 on_suspect: Callable[[int, float], None] | None = None,
                 warm: LayerTimes | None = None,
                 optimizer_state: Tensors | None = None) -> None:
        """``warm``: this machine's warm per-layer times for the model (the profiler's), by
        which an emulated ``slowdown`` paces the stage's passes; without them it multiplies
        what each pass took. ``optimizer_state``: the momentum buffers restored with the
        weights, by parameter name (a resumed stage of a run with momentum needs them)."""
        spec.check()
        if spec.first and dataset is None:
            raise StageError("the first stage needs the data set")
        if slowdown < 1.0:
            raise StageError(f"slowdown must be at least 1, got {slowdown}")
        self.spec = spec
        self.module = module.train()
        self.plane = plane
        self.clock = clock
        self.dataset = dataset
        self.on_event = on_event or (lambda e: None)
        self.on_metric = on_metric or (lambda m: None)
        self.emulation = Slowdown(slowdown)
        a, e = spec.layers
        # the warm seconds of each timed kind of pass; the update's are in the backward's
        self.warm_s: dict[str, float] | None = None if warm is None else {
            "forward": sum(warm.forward_s[a:e + 1]), "backward": sum(warm.backward_s[a:e + 1]),
            "update": 0.0}
        self.stop = stop or threading.Event()
        # cleared while the run is paused: the stage finishes its current action, then waits
        self.running = running or threading.Event()
        if running is None:
            self.running.set()
        self.schedule = spec.build_schedule()
        first = spec.first_microbatch
        self.actions: Sequence[Action] = [replace(a, microbatch=a.microbatch + first)
                                          for a in self.schedule.actions[spec.device]]
        self.store = store
        self.on_checkpoint = on_checkpoint or (lambda applied, tensors, chain, central: None)
        self.on_suspect = on_suspect or (lambda microbatch, waited: None)
        self.gradient_arrivals: list[float] = []  # stage 0's backward timer
        # where each parameter lives, to put a stashed version in its place for one forward
        slots = parameter_slots(module, spec.layers[0])
        self.slots = [(owner, name) for _, owner, name in slots]
        self.param_names = [name for name, _, _ in slots]
        self.params = [getattr(owner, name) for owner, name in self.slots]
        self.optimizer = SGD(self.params, lr=spec.lr, momentum=spec.momentum)
        # the stage's parameters and buffers under their model-wide names, for checkpoints;
        # the optimizer's momentum buffers join them once they exist
        self.state = state_refs(module, spec.layers[0])
        self._weight_refs = len(self.state)
        self._restore_momentum(optimizer_state or {})
        # weight versions count updates: under 1F1B one per micro-batch, under GPipe one per flush
        self.per_version = (spec.flush_every or 1) if spec.schedule == "gpipe" else 1
        self.version = first // self.per_version
        self.snapshots: dict[int, list[torch.Tensor]] = {}
        self.stash_for = self._stash_needed()
        self.in_flight: dict[int, _InFlight] = {}
        self.grads: dict[int, list[torch.Tensor]] = {}
        self.accumulated: list[torch.Tensor] | None = None
        self.accumulated_count = 0
        self.latest_header_version = self.version
        self.result = StageResult()
        # the fixed cost's clock (fixed_costs): seconds waited, seconds the passes should
        # take, seconds and count of sends, and marks of them at the steady state's start and
        # at the latest backward
        self.waited_s = 0.0
        self.paced_s = 0.0
        self.passed_s = 0.0  # inside the timed passes
        self.sent_s = 0.0  # in sends: encoding, handing to the data plane
        self.sends = 0
        self._steady_from = int(STEADY_FROM * sum(1 for a in self.actions if a.kind == "B"))
        self._steady: Mark | None = None
        self._latest: Mark | None = None

    def _restore_momentum(self, buffers: Tensors) -> None:
        """Take up the momentum the stage's weights were trained with: a stage resumed past
        its first update under momentum would otherwise restart from none, and train another
        model than the one that failed."""
        if self.spec.momentum == 0 or (not buffers and self.spec.first_microbatch == 0):
            return
        if not buffers:
            raise StageError(
                f"resuming at {self.spec.first_microbatch} updates with momentum "
                f"{self.spec.momentum} needs the weights' momentum buffers; none came with them")
        restored = []
        for name, param in zip(self.param_names, self.params, strict=True):
            buffer = buffers.get(name)
            if buffer is None:
                raise StageError(f"no momentum buffer for {name}")
            if buffer.shape != param.shape:
                raise StageError(f"the momentum buffer of {name} has shape {list(buffer.shape)}"
                                 f", the parameter {list(param.shape)}")
            restored.append(buffer.to(param.dtype).clone())
        self.optimizer.buffers = restored
        self._keep_momentum()

    def _keep_momentum(self) -> None:
        """Checkpoints carry the optimizer's momentum buffers from when it has them."""
        buffers = self.optimizer.buffers
        if buffers is not None and len(self.state) == self._weight_refs:
            self.state = self.state + momentum_refs(self.param_names, buffers)

    # ---- the loop

    @property
    def applied(self) -> int:
        """Micro-batches whose updates the live weights hold."""
        return self.version * self.per_version

    def checkpoint(self, *, pinned: bool) -> dict[str, torch.Tensor] | None:
        """Keep the live weights at ``applied`` in the store (a replication point when
        ``pinned``, else the rollback window)."""
        if self.store is None:
            return None
        tensors = snapshot(self.state)
        self.store.add(Entry(layers=self.spec.layers, applied=self.applied, kind="own",
                             tensors=tensors, pinned=pinned, generation=self.spec.generation))
        return tensors

    def _after_update(self) -> None:
        if self.store is None:
            return
        applied, spec = self.applied, self.spec
        chain = bool(spec.chain_every) and applied % spec.chain_every == 0
        central = bool(spec.global_every) and applied % spec.global_every == 0
        tensors = self.checkpoint(pinned=chain or central)
        if (chain or central) and tensors is not None:
            self.on_checkpoint(applied, tensors, chain, central)
        # stage 0 commits as it updates; a later stage may be asked for any version from the
        # oldest stage 0 can still be at (what its latest activation says) on
        floor = applied if spec.first else self.latest_header_version * self.per_version
        self.store.trim_window(spec.layers, floor, applied)

    def run(self) -> StageResult:
        tensors = self.checkpoint(pinned=True)
        if tensors is not None:  # the resume point goes to the next stage at once
            self.on_checkpoint(self.applied, tensors, bool(self.spec.chain_every), False)
        for action in self.actions:
            if not self.running.is_set():
                begun = time.perf_counter()
                while not self.running.wait(0.1) and not self.stop.is_set():
                    pass
                self.waited_s += time.perf_counter() - begun
            if self.stop.is_set():
                break
            name = HANDLERS.get(action.kind)
            if name is None:
                raise StageError(f"unknown action {action}")
            getattr(self, name)(action)
        self.plane.flush(timeout_s=self.spec.receive_timeout_s)
        return self.result

    def fixed_costs(self) -> FixedCosts | None:
        """What a micro-batch cost this stage beyond its paced passes and its waits, over the
        steady state; None without warm times or with fewer than MIN_STEADY_MICROBATCHES
        micro-batches in it."""
        if self.warm_s is None or self._steady is None or self._latest is None:
            return None
        start, end = self._steady, self._latest
        count = end.backwards - start.backwards
        if count < MIN_STEADY_MICROBATCHES:
            return None
        busy = (end.at - start.at) - (end.waited_s - start.waited_s)
        sent = end.sent_s - start.sent_s
        sends = end.sends - start.sends
        paced = end.paced_s - start.paced_s
        fixed = max(0.0, (busy - paced) / count)
        return FixedCosts(
            microbatches=count, fixed_s=fixed,
            sends_per_microbatch=sends / count, send_s=sent / sends if sends else None,
            pass_s=min(fixed, max(0.0, (end.passed_s - start.passed_s - paced) / count)))

    def _mark(self) -> None:
        mark = Mark(at=time.perf_counter(), waited_s=self.waited_s, paced_s=self.paced_s,
                    passed_s=self.passed_s, sent_s=self.sent_s, sends=self.sends,
                    backwards=len(self.result.backwards))
        if mark.backwards == self._steady_from + 1:
            self._steady = mark
        self._latest = mark

    # ---- helpers

    def _receive(self, kind: str, microbatch: int, timeout_s: float | None = None) -> Message:
        begun = time.perf_counter()
        try:
            return self.plane.receive(self.spec.run, kind, microbatch, name=self.spec.tag,
                                      timeout_s=timeout_s or self.spec.receive_timeout_s,
                                      cancelled=self.stop.is_set)
        except TimeoutError as exc:
            if self.stop.is_set():
                raise StageStopped(f"stage {self.spec.stage} stopped") from None
            raise StageError(f"stage {self.spec.stage}: {exc}") from None
        finally:
            self.waited_s += time.perf_counter() - begun

    def _suspect_after(self) -> float | None:
        """FTPipeHD's backward timer: how long stage 0 waits for a gradient before it suspects
        a device, a multiple of the moving average time between gradients (None until a few
        have come)."""
        arrivals = self.gradient_arrivals
        if len(arrivals) < 4:
            return None
        gaps = [b - a for a, b in zip(arrivals[-9:], arrivals[-8:], strict=False)]
        average = sum(gaps) / len(gaps)
        return max(self.spec.suspect_min_s, self.spec.suspect_factor * average)

    def _receive_gradient(self, microbatch: int) -> Message:
        """Stage 0's wait for a gradient, with the backward timer."""
        after = self._suspect_after()
        message = None
        if after is not None:
            try:
                message = self._receive("gradient", microbatch, timeout_s=after)
            except StageStopped:
                raise
            except StageError:  # late
                if self.running.is_set():  # a paused pipeline is late on purpose
                    self.on_suspect(microbatch, after)
        if message is None:
            message = self._receive("gradient", microbatch)
        self.gradient_arrivals.append(time.monotonic())
        del self.gradient_arrivals[:-16]
        return message

    def _record_receive(self, message: Message, stage: int) -> None:
        """A receive spans from the sender's start to the arrival (both on the server's epoch
        clock, as the data plane keeps time)."""
        arrived = message.arrived_at - self.clock.started_at
        sent = arrived if message.header.sent_at is None else (
            message.header.sent_at - self.clock.started_at)
        self.on_event(TimelineEvent(self.spec.run, self.spec.device, stage, "recv",
                                    message.header.microbatch, message.header.version,
                                    min(sent, arrived), arrived, message.nbytes))

    def _timed(self, kind: str, microbatch: int, version: int, work: Callable[[], Any]) -> Any:
        start = self.clock.now()
        begun = time.perf_counter()
        out = work()
        warm_s = None if self.warm_s is None else self.warm_s[kind]
        self.emulation.after(time.perf_counter() - begun, warm_s=warm_s)
        if warm_s is not None:
            self.paced_s += self.emulation.factor * warm_s
        self.passed_s += time.perf_counter() - begun
        self.on_event(TimelineEvent(self.spec.run, self.spec.device, self.spec.stage, kind,
                                    microbatch, version, start, self.clock.now()))
        return out

    def _send(self, kind: str, stage: int, microbatch: int, version: int,
              tensor: torch.Tensor) -> None:
        begun = time.perf_counter()
        peer = self.schedule.device_for(stage, microbatch - self.spec.first_microbatch)
        header, frames = encode_message(
            run=self.spec.run, kind=kind, microbatch=microbatch, version=version, tensor=tensor,
            name=self.spec.tag, sent_at=self.clock.absolute())
        self.plane.send(peer, frames, header=header)
        self.sent_s += time.perf_counter() - begun
        self.sends += 1

    def _stash_needed(self) -> dict[int, bool]:
        """For each micro-batch this device forwards: does an update come between its forward
        and its backward (so that the backward needs the weights as they were)?"""
        needed: dict[int, bool] = {}
        open_forwards: set[int] = set()
        for action in self.actions:
            if action.kind == "F":
                open_forwards.add(action.microbatch)
                needed.setdefault(action.microbatch, False)
            elif action.kind == "B":
                open_forwards.discard(action.microbatch)
            elif action.kind == "U":
                for m in open_forwards:
                    needed[m] = True
        return needed

    def _weights(self, version: int) -> list[torch.Tensor]:
        """The (stashed) weights of a version, as leaves autograd can differentiate."""
        if version not in self.snapshots:
            if version != self.version:
                raise StageError(f"weight version {version} is no longer stashed "
                                 f"(current {self.version})")
            self.snapshots[version] = [p.detach().clone().requires_grad_(True)
                                       for p in self.params]
        return self.snapshots[version]

    def _call(self, params: list[torch.Tensor], inputs: torch.Tensor) -> torch.Tensor:
        """The stage's forward with ``params`` in its parameters' places."""
        if params is self.params:
            out: torch.Tensor = self.module(inputs)
            return out
        for (owner, name), tensor in zip(self.slots, params, strict=True):
            owner._parameters[name] = tensor  # type: ignore[assignment]
        try:
            out = self.module(inputs)
        finally:
            for (owner, name), original in zip(self.slots, self.params, strict=True):
                owner._parameters[name] = original
        return out

    def _prune_snapshots(self) -> None:
        needed = {f.version for f in self.in_flight.values()}
        needed.add(self.version)
        if self.spec.vertical_sync:
            floor = min([*needed, self.latest_header_version])
            needed |= {v for v in self.snapshots if v >= floor}
        for version in [v for v in self.snapshots if v not in needed]:
            del self.snapshots[version]

    # ---- the actions

    def forward(self, action: Action) -> None:
        k, m = action.stage, action.microbatch
        labels: torch.Tensor | None = None
        if self.spec.first:
            assert self.dataset is not None
            inputs, labels = self.dataset.microbatch(m, self.spec.batch_size, seed=self.spec.seed)
            header_version = self.version
            if not self.spec.last:
                self._send("labels", self.spec.num_stages - 1, m, header_version, labels)
        else:
            message = self._receive("activation", m)
            self._record_receive(message, k)
            inputs = message.tensor.requires_grad_(True)
            header_version = message.header.version
            self.latest_header_version = max(self.latest_header_version, header_version)
        version = header_version if self.spec.vertical_sync else self.version
        if self.spec.last and labels is None:
            label_message = self._receive("labels", m)
            self._record_receive(label_message, k)
            labels = label_message.tensor
        stash = self.spec.vertical_sync or self.stash_for.get(m, False)
        params = self._weights(version) if stash else self.params

        def work() -> tuple[torch.Tensor, torch.Tensor]:
            out = self._call(params, inputs)
            if self.spec.last:
                assert labels is not None
                return nn.functional.cross_entropy(out, labels), out
            return out, out

        output, logits = self._timed("forward", m, header_version, work)
        if self.spec.last:
            # measured outside the timed pass, whose event is the layers' work and the loss
            # (capacity estimation compares it with the profile): this is overhead
            assert labels is not None
            accuracy = (logits.detach().argmax(dim=1) == labels).float().mean().item()
            now = self.clock.now()
            self.on_metric(Metric("loss", output.item(), m, now))
            self.on_metric(Metric("accuracy", accuracy, m, now))
        self.in_flight[m] = _InFlight(version=version, header_version=header_version,
                                      inputs=inputs, output=output, params=params)
        self.result.forwards.append(m)
        if not self.spec.last:
            self._send("activation", k + 1, m, header_version, output.detach())

    def backward(self, action: Action) -> None:
        k, m = action.stage, action.microbatch
        flight = self.in_flight.pop(m, None)
        if flight is None:
            raise StageError(f"backward of micro-batch {m} before its forward")
        upstream: torch.Tensor | None = None
        if not self.spec.last:
            message = (self._receive_gradient(m) if self.spec.first
                       else self._receive("gradient", m))
            self._record_receive(message, k)
            upstream = message.tensor
        wrt = flight.params
        needs_input_grad = not self.spec.first

        def work() -> tuple[torch.Tensor | None, ...]:
            inputs = ([flight.inputs] if needs_input_grad else []) + wrt
            return torch.autograd.grad(flight.output, inputs, grad_outputs=upstream,
                                       allow_unused=True)

        grads = self._timed("backward", m, flight.header_version, work)
        param_grads = [torch.zeros_like(p) if g is None else g
                       for g, p in zip(grads[int(needs_input_grad):], wrt, strict=True)]
        if needs_input_grad:
            input_grad = grads[0] if grads[0] is not None else torch.zeros_like(flight.inputs)
            self._send("gradient", k - 1, m, flight.header_version, input_grad)
        if self.spec.schedule == "gpipe":
            if self.accumulated is None:
                self.accumulated = param_grads
            else:
                self.accumulated = [a + g for a, g in zip(self.accumulated, param_grads,
                                                          strict=True)]
            self.accumulated_count += 1
        else:
            self.grads[m] = param_grads
        self.result.backwards.append(m)
        self._mark()

    def update(self, action: Action) -> None:
        m = action.microbatch
        if self.spec.schedule == "gpipe":
            if self.accumulated is None:
                return
            grads = [g / self.accumulated_count for g in self.accumulated]
            self.accumulated, self.accumulated_count = None, 0
        else:
            grads = self.grads.pop(m)

        def work() -> None:
            self.optimizer.step(grads)

        before = self.applied
        if self.spec.schedule != "gpipe" and m != before:
            raise StageError(f"update of micro-batch {m} on weights holding {before} updates: "
                             "updates must come in micro-batch order")
        self._timed("update", m, self.version, work)
        self._keep_momentum()
        self.version += 1
        self.result.updates += 1
        self.result.updated.extend(range(before, self.applied))
        self._after_update()
        if self.spec.vertical_sync:
            self._weights(self.version)  # every version may be asked for by a later micro-batch
        self._prune_snapshots()

    def all_reduce(self, action: Action) -> None:
        raise StageError(f"{action}: this runtime runs one device per stage")
