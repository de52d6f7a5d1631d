"""Where replicas of a stage share their gradients and aggregation groups average their
weights, for the stage executor (docs/architecture.md, "Replicated stages and two lanes",
"Runs of several pipelines"): the ``A`` and ``G`` actions and the ``U`` of a micro-batch
another replica owns, over the data plane with agent.gradsync. A mixin of
:class:`agent.executor.StageExecutor`: it works on the executor's own state (a composed
helper holding the executor back would make every deployment a reference cycle, which the
agent's frozen heap never collects).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import torch

from agent.gradsum import GradientSum
from agent.gradsync import flatten, ring_all_reduce, send_gradients, unflatten
from agent.transport import DataPlane
from agent.versions import WeightVersions
from agent.weights import WeightStore, snapshot
from agent.wire import Message, encode_message
from orchestrator.events import TimelineEvent
from orchestrator.formats import synchronous
from orchestrator.protocol import StageSpec
from orchestrator.schedule import Action


class ClockLike(Protocol):
    def now(self) -> float: ...
    def absolute(self) -> float: ...


class ResultLike(Protocol):
    rounds: list[int]


class Host(Protocol):
    """What of the executor sharing reads (its state it changes is declared on Sharing)."""

    @property
    def spec(self) -> StageSpec: ...
    @property
    def plane(self) -> DataPlane: ...
    @property
    def clock(self) -> ClockLike: ...
    @property
    def params(self) -> list[torch.Tensor]: ...
    @property
    def grads(self) -> dict[int, list[torch.Tensor]]: ...
    @property
    def versions(self) -> WeightVersions: ...
    @property
    def result(self) -> ResultLike: ...
    @property
    def version(self) -> int: ...
    @property
    def on_event(self) -> Callable[[TimelineEvent], None]: ...
    gradient_sum: GradientSum
    excluded: frozenset[int]
    round_uploader: bool
    group_done: dict[str, tuple[int, torch.Tensor]]
    @property
    def store(self) -> WeightStore | None: ...
    @property
    def applied(self) -> int: ...
    @property
    def state(self) -> list[tuple[str, torch.Tensor]]: ...
    @property
    def on_checkpoint(self) -> Callable[[int, dict[str, torch.Tensor], bool, bool], None]: ...

    def _receive(self, kind: str, microbatch: int, timeout_s: float | None = None,
                 name: str | None = None,
                 changed: Callable[[], bool] | None = None) -> Message: ...
    def _record_receive(self, message: Message, stage: int) -> None: ...
    def _after_update(self) -> None: ...
    def _send_chunk(self, peer: str, microbatch: int, step: str,
                    chunk: torch.Tensor) -> None: ...
    def _send_group(self, peer: str, tag: str, index: int, step: str,
                    chunk: torch.Tensor) -> None: ...
    def _group_name(self, tag: str, pipeline: int, stage: int, step: str) -> str: ...
    def _group_all_reduce(self, flat: torch.Tensor, *, what: str, index: int
                          ) -> tuple[torch.Tensor, int]: ...
    def _group_channel(self, tag: str, index: int, excluded: frozenset[int],
                       done_name: str) -> tuple[Callable[[str, str, torch.Tensor], None],
                                                Callable[[str], torch.Tensor]]: ...
    def _send_group_done(self, what: str, index: int, total: torch.Tensor) -> None: ...


class SharingError(RuntimeError):
    """A peer's gradients or weights that do not fit this stage."""


class GroupChanged(RuntimeError):
    """The run went on without more pipelines while a group all-reduce waited."""


class Sharing:
    gradient_sum: GradientSum
    excluded: frozenset[int] = frozenset()  # pipelines the run went on without
    round_uploader: bool = False  # sends each round's average to the server without a store
    # by what ("avg", "bar"): the index and result of the last group all-reduce this member
    # finished, which it sends the members left when the group changes (see exclude)
    group_done: dict[str, tuple[int, torch.Tensor]]

    def all_reduce(self: Host, action: Action) -> None:
        """Share gradients with the stage's other replicas (agent.gradsync)."""
        spec, m = self.spec, action.microbatch
        peers = [d for d in spec.replicas if d != spec.device]
        start = self.clock.now()
        if not synchronous(spec.schedule):
            sent = send_gradients(self.plane, run=spec.run, name=spec.tag, microbatch=m,
                                  version=self.version, grads=self.grads[m], peers=peers,
                                  sent_at=self.clock.absolute)
        else:
            like = self.params
            held = self.gradient_sum.total or [torch.zeros_like(p) for p in like]
            flat = torch.cat([flatten(held, dtype=like[0].dtype),
                              torch.tensor([float(self.gradient_sum.count)],
                                           dtype=like[0].dtype)])
            total, sent = ring_all_reduce(
                flat, group=spec.replicas, me=spec.device,
                send=lambda peer, step, chunk: self._send_chunk(peer, m, step, chunk),
                receive=lambda step: self._receive(
                    "grads", m, name=f"{spec.tag}:{step}").tensor)
            # the replicas' summed gradients and micro-batches: the update takes the average
            self.gradient_sum.replace(unflatten(total[:-1], like), round(float(total[-1])))
        self.on_event(TimelineEvent(spec.run, spec.device, spec.stage, "aggregate", m,
                                    self.version, start, self.clock.now(), sent,
                                    pipeline=spec.pipeline))

    def _send_chunk(self: Host, peer: str, microbatch: int, step: str,
                    chunk: torch.Tensor) -> None:
        header, frames = encode_message(
            run=self.spec.run, kind="grads", microbatch=microbatch, version=self.version,
            tensor=chunk, name=f"{self.spec.tag}:{step}", sent_at=self.clock.absolute())
        self.plane.send(peer, frames, header=header)

    def _peer_gradients(self: Host, m: int) -> list[torch.Tensor]:
        """The gradients of micro-batch m, which another replica owns and sent."""
        message = self._receive("grads", m)
        self._record_receive(message, self.spec.stage)
        try:
            return unflatten(message.tensor, self.params)
        except ValueError as exc:
            raise SharingError(f"stage {self.spec.stage}, micro-batch {m}: {exc}") from None

    def average_group(self: Host, action: Action) -> None:
        """A round's end: the live weights become the average of the aggregation group's
        members' (FedAvg, weighted by ``group_weight``), by ring all-reduce of the weighted
        weights and the weights' sum among the members (agent.gradsync); members of
        pipelines the run went on without (:meth:`exclude`) take no part, and the average is
        of those left. The version stays; the round's last update is checkpointed (and
        replicated) with the average."""
        spec, m = self.spec, action.microbatch
        round_index = (m + 1) // spec.round_every - 1
        start = self.clock.now()
        like = self.params
        flat = torch.cat([flatten(like) * spec.group_weight,
                          torch.tensor([spec.group_weight], dtype=like[0].dtype)])
        total, sent = self._group_all_reduce(flat, what="avg", index=round_index)
        average = unflatten(total[:-1] / total[-1], like)
        with self.versions.lock, torch.no_grad():
            for param, value in zip(self.params, average, strict=True):
                param.copy_(value)
        self.versions.refresh()
        self.result.rounds.append(m)
        self.on_event(TimelineEvent(spec.run, spec.device, spec.stage, "aggregate", m,
                                    self.version, start, self.clock.now(), sent,
                                    pipeline=spec.pipeline))
        self._after_update()
        if self.store is None and self.round_uploader:  # the server's copy of the average
            self.on_checkpoint(self.applied, snapshot(self.state), False, True)

    def batch_barrier(self: Host, m: int) -> None:
        """Split learning's batch (``batch_sync``): wait until every member of this first
        stage's aggregation group (of the pipelines left) finished micro-batch m - 1 and is
        at m, by a ring all-reduce of nothing; the paper releases each batch to every client
        at once, and its makespan is a batch's."""
        self._group_all_reduce(torch.zeros(1), what="bar", index=m)  # (sized in there)

    def exclude(self: Host, pipelines: Iterable[int], *, uploader: int | None) -> None:
        """The run goes on without ``pipelines`` (a device of theirs was lost): their members
        leave this stage's group from now on, an all-reduce under way starts again without
        them; ``uploader``, the pipeline whose stages now send the server each round's
        average (pipeline 0's did)."""
        self.excluded = self.excluded | frozenset(pipelines)
        if uploader is not None:
            self.round_uploader = self.spec.pipeline == uploader
        # a member lost after sending this one its last chunks of an all-reduce, but not
        # the others theirs: this one went on, the others started again without it, and
        # waited for this one until their receive timed out (the run failed). The result
        # this one finished with lets them finish that all-reduce alike.
        for what, (index, total) in list(self.group_done.items()):
            self._send_group_done(what, index, total)

    def _group_all_reduce(self: Host, flat: torch.Tensor, *, what: str, index: int
                          ) -> tuple[torch.Tensor, int]:
        """Ring all-reduce of ``flat`` among the group's members of the pipelines left (this
        one alone: ``flat`` itself), started again if more are excluded meanwhile; its
        messages are named by ``what``, the members excluded and ``index``."""
        spec = self.spec
        me = f"{spec.device}/{spec.pipeline}/{spec.stage}"
        done_name = self._group_name(f"done-{what}", spec.pipeline, spec.stage, "r")
        while True:
            excluded = self.excluded
            names = [f"{device}/{pipeline}/{stage}" for device, pipeline, stage in spec.group
                     if pipeline not in excluded]
            if len(names) < 2:
                return flat.clone(), 0
            tag = what + ("x" + ".".join(map(str, sorted(excluded))) if excluded else "")
            send, receive = self._group_channel(tag, index, excluded, done_name)
            try:
                total, sent = ring_all_reduce(
                    flat if what == "avg" else torch.zeros(len(names)), group=names, me=me,
                    send=send, receive=receive)
            except GroupChanged:
                if self.plane.holds(spec.run, "grads", index, name=done_name):
                    # another member finished it before the group changed: finish alike
                    done = self._receive("grads", index, name=done_name).tensor
                    self.group_done[what] = (index, done)
                    return done, 0
                continue
            self.group_done[what] = (index, total)
            if self.excluded != excluded:  # the group changed as this one finished it
                self._send_group_done(what, index, total)
            return total, sent

    def _send_group_done(self: Host, what: str, index: int, total: torch.Tensor) -> None:
        """Send the members left the result this one finished all-reduce ``index`` with."""
        spec = self.spec
        for device, pipeline, stage in spec.group:
            if pipeline in self.excluded or (pipeline, stage) == (spec.pipeline, spec.stage):
                continue
            self._send_group(f"{device}/{pipeline}/{stage}", f"done-{what}", index, "r", total)

    def _group_channel(self: Host, tag: str, index: int, excluded: frozenset[int],
                       done_name: str) -> tuple[Callable[[str, str, torch.Tensor], None],
                                                Callable[[str], torch.Tensor]]:
        """One all-reduce attempt's send and receive (its receive gives up, GroupChanged,
        once more pipelines than ``excluded`` are, or another member's result of it,
        ``done_name``, arrived)."""
        spec = self.spec

        def changed() -> bool:
            return self.excluded != excluded or self.plane.holds(spec.run, "grads", index,
                                                                 name=done_name)

        def send(peer: str, step: str, chunk: torch.Tensor) -> None:
            self._send_group(peer, tag, index, step, chunk)

        def receive(step: str) -> torch.Tensor:
            return self._receive("grads", index,
                                 name=self._group_name(tag, spec.pipeline, spec.stage, step),
                                 changed=changed).tensor

        return send, receive

    def _group_name(self: Host, tag: str, pipeline: int, stage: int, step: str) -> str:
        """The data-plane name of a group all-reduce's chunk for the member (pipeline, stage)
        (members of one device share its inbox)."""
        return f"g{self.spec.generation}:{tag}:p{pipeline}s{stage}:{step}"

    def _send_group(self: Host, peer: str, tag: str, index: int, step: str,
                    chunk: torch.Tensor) -> None:
        device, pipeline, stage = peer.rsplit("/", 2)
        header, frames = encode_message(
            run=self.spec.run, kind="grads", microbatch=index, version=self.version,
            tensor=chunk, name=self._group_name(tag, int(pipeline), int(stage), step),
            sent_at=self.clock.absolute())
        self.plane.send(device, frames, header=header)

