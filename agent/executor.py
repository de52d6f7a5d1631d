"""The stage executor: runs this device's action list (orchestrator.schedule) through one
dispatch table, exchanging activations, gradients and labels with its neighbours.

- ``F`` (forward): stage 0 reads micro-batch m from the data set; other stages take the
  activation from the inbox. The output goes to the next stage's device for m, or, on the
  last stage, into the loss (cross-entropy) and accuracy. The labels ride with the
  activations, stage to stage, to the last stage (a message of their own from stage 0 to the
  last stage cost a send, a receive and two timeline events per micro-batch); in a U-shaped
  pipeline (split learning) they never leave the device that holds both ends, whose last
  stage reads them from its own copy of the data.
- ``B`` (backward): the last stage differentiates its loss; others take the gradient of their
  output from the inbox. The gradient of the input goes back to the previous stage's device.
- ``A`` (replicas of a stage share gradients, agent.gradsync): under asynchronous 1F1B this
  replica's gradient of its micro-batch goes to the other replicas; under a synchronous
  schedule (GPipe, 1F1B-sync) the replicas ring-all-reduce what they accumulated over the
  batch.
- ``U`` (update): SGD with momentum; each update is a new weight version. Under 1F1B a
  replica also applies the updates of the micro-batches the other replicas own, with the
  gradients they sent, so every replica holds the same weights at every version.

Weight versions. A forward runs on the version its gate names (orchestrator.schedule.
forward_gates): the weights holding that many of the list's updates. Weight stashing
(PipeDream, FTPipeHD): a forward whose backward comes after an update runs on a snapshot of
its version (cloned tensors put in the parameters' places for the call), and its backward
differentiates that same graph, so updates in between never touch what it needs. Under 1F1B
the gradient of micro-batch m is applied to the latest weights at its ``U``; under GPipe and
1F1B-sync gradients accumulate until the flush's single update. Vertical sync (1F1B): every stage
forwards m on the version stage 0 used for it (carried in the message header), and stage 0
on the updates up to m - the pipeline's lag (StageSpec.pipeline_lag). FTPipeHD's weight
aggregation (``aggregate_every``): every ``aggregate_every`` x D updates (D the stage's
in-flight depth, the number of weight versions its concurrent micro-batches use) the stage's
weights become the average of its last D versions.

Two lanes (Duan-Wu): on a device that splits its resources between the passes, forwards run
on a thread of their own beside the backwards, updates and all-reduces, each lane paced to
its share of the device (``lane_shares``) when the device is emulated, and given that share
of torch's threads otherwise. Forwards then always run on snapshots (an update may change the
live weights meanwhile).

Every forward, backward, update and aggregate becomes a timeline event (shared schema, run
clock); the data plane reports sends and this executor records receives; the last stage
reports loss and accuracy per micro-batch.

Beside this module: agent.stage (a stage's errors, clock, metric points and result),
agent.gradsum (a synchronous batch's gradients, summed in the parameters' ``.grad``),
agent.stageio (its receives, timed passes and sends), agent.sharing (the ``A`` and ``G``
actions) and agent.backwards (a backward whose gradients come back as tensors), the last
three mixins of :class:`StageExecutor`.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from agent.backwards import Backwards, InFlight
from agent.data import Dataset
from agent.emulation import Slowdown
from agent.fixedcosts import CostClock, FixedCosts
from agent.gradsum import GradientSum
from agent.layered import forward_layers, layers_of_parameters
from agent.optim import SGD
from agent.sharing import Sharing
from agent.stage import (
    Checkpoint,
    Clock,
    Metric,
    StageError,
    StageResult,
    StageStopped,
    check_spec,
)
from agent.stageio import StageIO
from agent.stageweights import StageWeights, stash_needed
from agent.transport import DataPlane
from agent.turns import Turnstile
from agent.versions import Aggregation, VersionError, WeightVersions
from agent.weights import (
    Tensors,
    WeightStore,
    parameter_slots,
    state_refs,
)
from orchestrator.events import TimelineEvent
from orchestrator.formats import LayerTimes, synchronous
from orchestrator.protocol import StageSpec
from orchestrator.protocol.stagespec import TURN_KINDS
from orchestrator.schedule import Action, ForwardGate

__all__ = ["Clock", "FixedCosts", "Metric", "StageError", "StageExecutor", "StageResult",
           "StageSpec", "StageStopped", "check_spec"]


# the method each kind of action runs, by name: a dict of the executor's bound methods made every
# executor a reference cycle, which the agent's frozen heap (runtime.freeze_heap) never
# collects, so each deployment's model, data and stashes stayed in memory after it ended
HANDLERS = {"F": "forward", "B": "backward", "U": "update", "A": "all_reduce",
            "G": "average_group"}


class StageExecutor(StageIO, StageWeights, Sharing, Backwards):
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
                 optimizer_state: Tensors | None = None, threads: int | None = None,
                 turns: Turnstile | None = None) -> None:
        """``warm``: this machine's warm per-layer times for the model (the profiler's), by
        which an emulated ``slowdown`` paces the stage's passes; without them it multiplies
        what each pass took. ``optimizer_state``: the momentum buffers restored with the
        weights, by parameter name (a resumed stage of a run with momentum needs them).
        ``threads``: torch's threads for this stage (split between two lanes). ``turns``:
        the order this device's stages of the run share (``spec.turns``; agent.turns)."""
        check_spec(spec)
        if bool(spec.turns) != (turns is not None):
            raise StageError("a stage with turns takes its device's turnstile, and only it")
        if spec.first and dataset is None:
            raise StageError("the first stage needs the data set")
        if slowdown < 1.0:
            raise StageError(f"slowdown must be at least 1, got {slowdown}")
        self.spec = spec
        self.turns = turns
        self.module = module.train()
        self.plane = plane
        self.clock = clock
        self.dataset = dataset
        self.on_event = on_event or (lambda e: None)
        self.on_metric = on_metric or (lambda m: None)
        self.threads = threads
        self.lanes = spec.two_lane
        self.set_slowdown(slowdown)
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
        own = self.schedule.actions_of(spec.device, spec.stage)
        # numbered from the generation's first micro-batch (a copy only when it is not 0:
        # dataclasses.replace of each took 0.2-0.4 s of a deploy of 50,000 micro-batches)
        self.actions: Sequence[Action] = own if not first else [
            Action(a.stage, a.kind, a.microbatch + first, a.pipeline) for a in own]
        # each forward's gate, by micro-batch (a device forwards each once)
        self.gates: dict[int, ForwardGate] = {
            self.actions[position].microbatch: gate
            for position, gate in self.schedule.gates(spec.device, spec.stage).items()}
        self.store = store
        # the stages of pipeline 0 send the server each round's average (with their store);
        # another pipeline's once the run goes on without pipeline 0 (Sharing.exclude)
        self.round_uploader = spec.pipeline == 0
        self.on_checkpoint = on_checkpoint or (lambda applied, tensors, chain, central: None)
        self.on_suspect = on_suspect or (lambda microbatch, waited: None)
        self.gradient_arrivals: list[float] = []  # stage 0's backward timer
        # where each parameter lives, to put a stashed version in its place for one forward
        slots = parameter_slots(module, spec.layers[0])
        self.slots = [(owner, name) for _, owner, name in slots]
        self.param_names = [name for name, _, _ in slots]
        self.params = [getattr(owner, name) for owner, name in self.slots]
        # a preempted helper's passes in parts, each over some of its layers (agent.layered):
        # (first, last) within the stage, in the order the pass runs them
        self.parts = {kind: [(a - spec.layers[0], e - spec.layers[0])
                             for p, k, _, a, e in spec.turns if (p, k) == (spec.pipeline, kind)]
                      for kind in TURN_KINDS}
        self.layered = any(len(parts) > 1 for parts in self.parts.values())
        self.param_layers = (layers_of_parameters(module, [owner for owner, _ in self.slots])
                             if self.layered else [])
        self.warm = warm
        self.optimizer = SGD(self.params, lr=spec.lr, momentum=spec.momentum)
        # the stage's parameters and buffers under their model-wide names, for checkpoints;
        # the optimizer's momentum buffers join them once they exist
        self.state = state_refs(module, spec.layers[0])
        self._weight_refs = len(self.state)
        self._restore_momentum(optimizer_state or {})
        # weight versions count updates: under asynchronous 1F1B one per micro-batch, under a
        # synchronous schedule (GPipe, 1F1B-sync) one per flush
        self.synchronous = synchronous(spec.schedule)
        self.per_version = (spec.flush_every or 1) if self.synchronous else 1
        self.base_version = first // self.per_version
        self.stash_for = stash_needed(self.actions)
        self.versions = WeightVersions(
            self.params, version=self.base_version, snapshots_only=self.lanes,
            keep_every=spec.vertical_sync,
            needed=[self.base_version + g.updates for g in self.gates.values()])
        self.in_flight: dict[int, InFlight] = {}
        self.grads: dict[int, list[torch.Tensor]] = {}
        self.gradient_sum = GradientSum(self.params)  # a synchronous schedule's, per batch
        self.group_done = {}
        self.latest_header_version = self.version
        self.aggregation = None if not spec.aggregate_every else Aggregation(
            self.params, version=self.version, every=spec.aggregate_every,
            window=(spec.num_stages - spec.stage if spec.inflight is None
                    else spec.inflight[spec.stage]))
        self.result = StageResult()
        # the fixed cost's clock ticks at each backward; on a replica at each update (it pays
        # its fixed cost for every micro-batch of the stage: cost.shared_compute_s)
        self.tick = "U" if spec.replicated and not self.synchronous else "B"
        self.costs = CostClock(backwards=sum(1 for a in self.actions if a.kind == self.tick))
        # two lanes: how far the lane of everything but forwards has got
        self.lane_state = threading.Condition()
        self.others_started = 0
        self.others_finished = 0
        self.failure: BaseException | None = None
        # updates an aggregation group's average follows: their checkpoint waits for it
        self.round_ends = {a.microbatch for a in self.actions if a.kind == "G"}
        if any(member[0] == spec.device and member != spec.member for member in spec.group):
            # another stage of this device is in the group: its chunks go to this inbox
            plane.connect(spec.device, plane.address, plane.public_key)

    def set_slowdown(self, slowdown: float) -> None:
        """Emulate a device ``slowdown`` times slower from the next pass on; on two lanes each
        lane runs at its share of it."""
        self.emulation = Slowdown(slowdown)
        shares = self.spec.lane_shares if self.lanes and slowdown > 1 else None
        self.lane_emulation = (None if shares is None else
                               {"forward": Slowdown(slowdown / shares[0]),
                                "other": Slowdown(slowdown / shares[1])})

    # ---- the loop

    @property
    def waited_s(self) -> float:
        return self.costs.waited_s

    def run(self) -> StageResult:
        tensors = self.checkpoint(pinned=True)
        if tensors is not None and self.replicates:  # the resume point goes on at once
            self.on_checkpoint(self.applied, tensors, bool(self.spec.chain_every), False)
        if not self.lanes:
            self._run_lane(self.actions)
        else:
            forwards = [a for a in self.actions if a.kind == "F"]
            others = [a for a in self.actions if a.kind != "F"]
            share = self.spec.lane_shares or (1.0, 1.0)
            lane = threading.Thread(target=self._lane_thread, args=(forwards, share[0]),
                                    name=f"run-{self.spec.run}-forwards", daemon=True)
            lane.start()
            try:
                self._lane_threads(share[1])
                self._run_lane(others)
            except BaseException as exc:
                self._fail(exc)
            lane.join()
            if self.failure is not None:
                raise self.failure
        self.plane.flush(timeout_s=self.spec.receive_timeout_s)
        return self.result

    def _lane_threads(self, share: float) -> None:
        if self.threads:
            torch.set_num_threads(max(1, round(self.threads * share)))

    def _lane_thread(self, actions: list[Action], share: float) -> None:
        try:
            self._lane_threads(share)
            self._run_lane(actions)
        except BaseException as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """One lane failed: the other stops at its next wait."""
        with self.lane_state:
            if self.failure is None:
                self.failure = exc
            self.lane_state.notify_all()

    def _run_lane(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if not self.running.is_set():
                begun = time.perf_counter()
                while not self.running.wait(0.1) and not self.stop.is_set():
                    pass
                self.costs.waited_s += time.perf_counter() - begun
            if self.stop.is_set() or self.failure is not None:
                break
            name = HANDLERS.get(action.kind)
            if name is None:
                raise StageError(f"unknown action {action}")
            if action.kind == "F":
                self._gate(self.gates[action.microbatch])
                getattr(self, name)(action)
                continue
            with self.lane_state:
                self.others_started += 1
                self.lane_state.notify_all()
            getattr(self, name)(action)
            with self.lane_state:
                self.others_finished += 1
                self.lane_state.notify_all()

    def _gate(self, gate: ForwardGate) -> None:
        """On two lanes: wait until the other lane has got as far as the forward needs."""
        if not self.lanes:
            return
        begun = time.perf_counter()
        with self.lane_state:
            while (self.others_started < gate.started or self.others_finished < gate.finished
                   ) and self.failure is None:
                if self.stop.is_set():
                    raise StageStopped(f"stage {self.spec.stage} stopped")
                self.lane_state.wait(0.1)
        self.costs.waited_s += time.perf_counter() - begun

    def fixed_costs(self) -> FixedCosts | None:
        """What a micro-batch cost this stage beyond its paced passes and its waits, over the
        steady state (agent.fixedcosts); None without warm times, with too few micro-batches,
        or on two lanes (no single thread's time is the stage's). A replica under 1F1B
        measures per micro-batch of the stage, each of whose updates it applies (counted per
        micro-batch of its own, its peers' updates read as its device's overhead and slowed
        every later plan of it), as the cost model charges it."""
        if self.warm_s is None or self.lanes:
            return None
        return self.costs.costs()

    # ---- helpers

    def _call(self, params: list[torch.Tensor], inputs: torch.Tensor,
              layers: tuple[int, int] | None = None) -> Any:
        """The stage's forward with ``params`` in its parameters' places; with ``layers``
        (first, last within the stage), those layers' outputs (agent.layered)."""

        def run() -> Any:
            if layers is None:
                return self.module(inputs)
            return forward_layers(self.module, inputs, *layers)

        if self.versions.is_live(params):
            return run()
        for (owner, name), tensor in zip(self.slots, params, strict=True):
            owner._parameters[name] = tensor  # type: ignore[assignment]
        try:
            return run()
        finally:
            for (owner, name), original in zip(self.slots, self.params, strict=True):
                owner._parameters[name] = original

    # ---- the actions

    def forward(self, action: Action) -> None:
        k, m = action.stage, action.microbatch
        labels: torch.Tensor | None = None
        if self.spec.first:
            assert self.dataset is not None
            if self.spec.batch_sync and m > self.spec.first_microbatch:
                self.batch_barrier(m)
            inputs, labels = self.dataset.microbatch(m, self.spec.batch_size, seed=self.spec.seed)
            version = self._forward_version(m, None)
            header_version = version
            # the oldest version a forward to come may use (vertical sync keeps those after)
            self.latest_header_version = max(self.latest_header_version, header_version)
        else:
            message = self._receive("activation", m)
            self._record_receive(message, k)
            inputs = message.tensor.requires_grad_(True)
            if self.spec.last and self.spec.u_shaped:  # the labels never left this device
                assert self.dataset is not None
                labels = self.dataset.labels(m, self.spec.batch_size, seed=self.spec.seed)
            else:
                labels = message.labels  # they ride with the activations, to the last stage
            header_version = message.header.version
            self.latest_header_version = max(self.latest_header_version, header_version)
            version = self._forward_version(m, header_version)
        if self.spec.last and labels is None:
            raise StageError(f"micro-batch {m}'s activation came without its labels")
        stash = self.spec.vertical_sync or self.stash_for.get(m, False)
        try:
            params = self.versions.weights(version, stash=stash, gated=self._gated(m))
        except VersionError as exc:
            raise StageError(str(exc)) from None

        def work() -> tuple[torch.Tensor, torch.Tensor]:
            out = self._call(params, inputs)
            if self.spec.last:
                assert labels is not None
                return nn.functional.cross_entropy(out, labels), out
            return out, out

        layer_outputs: list[torch.Tensor] | None = None
        if self.layered:  # in parts, each in its turn (a preempted helper's)
            layer_outputs, x = [], inputs
            for part, layers in enumerate(self.parts["forward"]):
                outs = self._timed("forward", m, header_version,
                                   functools.partial(self._call, params, x, layers),
                                   part=part, layers=layers)
                layer_outputs.extend(outs)
                x = outs[-1]
            output = logits = x
        else:
            output, logits = self._timed("forward", m, header_version, work)
        if self.spec.last:
            # measured outside the timed pass, whose event is the layers' work and the loss
            # (capacity estimation compares it with the profile): this is overhead
            assert labels is not None
            # the count of right answers over the count (.float().mean() was two ops more,
            # 9.5 us against 5.5 a micro-batch)
            right = int(torch.count_nonzero(logits.detach().argmax(dim=1) == labels))
            accuracy = right / max(1, labels.numel())
            now = self.clock.now()
            self.on_metric(Metric("loss", output.item(), m, now))
            self.on_metric(Metric("accuracy", accuracy, m, now))
        with self.lane_state:
            self.in_flight[m] = InFlight(version=version, header_version=header_version,
                                         inputs=inputs, output=output, params=params,
                                         layer_outputs=layer_outputs)
            self.lane_state.notify_all()
        self.result.forwards.append(m)
        self.result.versions[m] = version
        if not self.spec.last:
            self._send("activation", k + 1, m, header_version, output.detach(),
                       labels=None if self.spec.u_shaped else labels)

    def _take_in_flight(self, m: int) -> InFlight:
        """The forward of m's state (on two lanes the last stage's backward may come before
        its forward has ended: it waits for it)."""
        with self.lane_state:
            while m not in self.in_flight:
                if not self.lanes or self.failure is not None:
                    raise StageError(f"backward of micro-batch {m} before its forward")
                if self.stop.is_set():
                    raise StageStopped(f"stage {self.spec.stage} stopped")
                self.lane_state.wait(0.1)
            return self.in_flight.pop(m)

    def backward(self, action: Action) -> None:
        k, m = action.stage, action.microbatch
        upstream: torch.Tensor | None = None
        if not self.spec.last:
            message = (self._receive_gradient(m) if self.spec.first
                       else self._receive("gradient", m))
            self._record_receive(message, k)
            upstream = message.tensor
        flight = self._take_in_flight(m)
        wrt = flight.params
        needs_input_grad = not self.spec.first
        if self.synchronous and not self.layered and self.versions.is_live(wrt):
            # summed into the parameters' .grad, as torch's backward sums (agent.gradsum)
            input_grad = self._timed("backward", m, flight.header_version, functools.partial(
                self.gradient_sum.backward, flight.output, upstream,
                flight.inputs if needs_input_grad else None))
            if input_grad is not None:
                self._send("gradient", k - 1, m, flight.header_version, input_grad)
        else:
            self._backward_apart(flight, upstream, k, m, needs_input_grad)
        self.result.backwards.append(m)
        if self.tick == "B":
            self.costs.mark(len(self.result.backwards))

    def update(self, action: Action) -> None:
        m = action.microbatch
        if self.synchronous:
            batch = self.gradient_sum.take()
            if batch is None:
                return
            grads = batch
        else:
            grads = self.grads.pop(m) if m in self.grads else self._peer_gradients(m)

        def work() -> None:
            with self.versions.lock:
                self.optimizer.step(grads)

        before = self.applied
        if not self.synchronous and m != before:
            raise StageError(f"update of micro-batch {m} on weights holding {before} updates: "
                             "updates must come in micro-batch order")
        self._timed("update", m, self.version, work)
        self._keep_momentum()
        if self.aggregation is not None:
            start = self.clock.now()
            averaged = self.aggregation.after_update(self.version + 1, self.versions.lock)
            if averaged is not None:
                self.result.aggregated.append((self.version + 1, averaged))
                self.on_event(TimelineEvent(self.spec.run, self.spec.device, self.spec.stage,
                                            "aggregate", m, self.version + 1, start,
                                            self.clock.now(), pipeline=self.spec.pipeline))
        self.versions.updated(in_flight=[f.version for f in list(self.in_flight.values())],
                              floor=self.latest_header_version)
        self.result.updates += 1
        self.result.updated.extend(range(before, self.applied))
        if self.tick == "U":
            self.costs.mark(self.result.updates)
        if m not in self.round_ends:
            self._after_update()
