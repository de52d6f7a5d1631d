"""The stage's weights, for the stage executor: the version each forward runs on (its gate,
vertical sync), which forwards need their weights stashed, the optimizer's momentum taken up
on a resume, and the checkpoints kept in the weight store after each update (replication
points and the rollback window). A mixin of :class:`agent.executor.StageExecutor`, as
agent.sharing is (module docstring of agent.executor, "Weight versions")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from agent.optim import SGD
from agent.stage import Checkpoint, StageError
from agent.versions import WeightVersions
from agent.weights import Entry, Tensors, WeightStore, momentum_refs, snapshot
from orchestrator.protocol import StageSpec
from orchestrator.schedule import Action, ForwardGate, reference_version


class Host(Protocol):
    """What of the executor these methods read (and ``state``, which they extend)."""

    spec: StageSpec
    store: WeightStore | None
    state: list[tuple[str, torch.Tensor]]
    _weight_refs: int
    optimizer: SGD
    params: list[torch.Tensor]
    param_names: list[str]
    versions: WeightVersions
    per_version: int
    base_version: int
    synchronous: bool
    gates: dict[int, ForwardGate]
    latest_header_version: int
    on_checkpoint: Checkpoint

    @property
    def version(self) -> int: ...
    @property
    def applied(self) -> int: ...
    @property
    def replicates(self) -> bool: ...
    def checkpoint(self, *, pinned: bool) -> dict[str, torch.Tensor] | None: ...
    def _keep_momentum(self) -> None: ...
    def _gated(self, m: int) -> int: ...


def stash_needed(actions: Sequence[Action]) -> dict[int, bool]:
    """For each micro-batch this device forwards: does an update come between its forward
    and its backward (so that the backward needs the weights as they were)?"""
    needed: dict[int, bool] = {}
    open_forwards: set[int] = set()
    for action in actions:
        if action.kind == "F":
            open_forwards.add(action.microbatch)
            needed.setdefault(action.microbatch, False)
        elif action.kind == "B":
            open_forwards.discard(action.microbatch)
        elif action.kind == "U":
            for m in open_forwards:
                needed[m] = True
    return needed



class StageWeights:
    """The executor's weight versions, momentum and checkpoints."""

    @property
    def version(self: Host) -> int:
        """The live weights' version: how many updates they hold."""
        return self.versions.version

    @property
    def applied(self: Host) -> int:
        """Micro-batches whose updates the live weights hold."""
        return self.version * self.per_version

    def checkpoint(self: Host, *, pinned: bool) -> dict[str, torch.Tensor] | None:
        """Keep the live weights at ``applied`` in the store (a replication point when
        ``pinned``, else the rollback window)."""
        if self.store is None:
            return None
        tensors = snapshot(self.state)
        self.store.add(Entry(layers=self.spec.layers, applied=self.applied, kind="own",
                             tensors=tensors, pinned=pinned, generation=self.spec.generation))
        return tensors

    @property
    def replicates(self: Host) -> bool:
        """Does this device send the stage's replicas (its group's first: the others hold the
        same weights)?"""
        return self.spec.replicas[0] == self.spec.device

    def _after_update(self: Host) -> None:
        if self.store is None:
            return
        applied, spec = self.applied, self.spec
        chain = bool(spec.chain_every) and applied % spec.chain_every == 0
        central = bool(spec.global_every) and applied % spec.global_every == 0
        tensors = self.checkpoint(pinned=chain or central)
        if (chain or central) and tensors is not None and self.replicates:
            self.on_checkpoint(applied, tensors, chain, central)
        # stage 0 commits as it updates; a later stage may be asked for any version from the
        # oldest stage 0 can still be at (what its latest activation says) on
        floor = applied if spec.first else self.latest_header_version * self.per_version
        self.store.trim_window(spec.layers, floor, applied)

    def _restore_momentum(self: Host, buffers: Tensors) -> None:
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

    def _keep_momentum(self: Host) -> None:
        """Checkpoints carry the optimizer's momentum buffers from when it has them."""
        buffers = self.optimizer.buffers
        if buffers is not None and len(self.state) == self._weight_refs:
            self.state = self.state + momentum_refs(self.param_names, buffers)

    def _gated(self: Host, m: int) -> int:
        """The version the forward of m runs on by its gate."""
        return self.base_version + self.gates[m].updates

    def _forward_version(self: Host, m: int, header_version: int | None) -> int:
        """The version this forward runs on (module docstring, "Weight versions")."""
        gate = self._gated(m)
        if not self.spec.vertical_sync or self.synchronous:
            return gate
        if header_version is None:  # stage 0: the updates up to m - the pipeline's lag
            m_local = m - self.spec.first_microbatch
            return min(gate, self.base_version + reference_version(m_local,
                                                                   self.spec.pipeline_lag))
        if header_version > gate:
            raise StageError(f"vertical sync: micro-batch {m} came with version "
                             f"{header_version}; this stage has only {gate} for it")
        return header_version
