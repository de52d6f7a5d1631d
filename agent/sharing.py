"""Where replicas of a stage share their gradients and aggregation groups average their
weights, for the stage executor (docs/architecture.md, "Replicated stages and two lanes",
"Runs of several pipelines"): the ``A`` and ``G`` actions and the ``U`` of a micro-batch
another replica owns, over the data plane with agent.gradsync. A mixin of
:class:`agent.executor.StageExecutor`: it works on the executor's own state (a composed
helper holding the executor back would make every deployment a reference cycle, which the
agent's frozen heap never collects).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from agent.gradsync import flatten, ring_all_reduce, send_gradients, unflatten
from agent.transport import DataPlane
from agent.versions import WeightVersions
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
    accumulated: list[torch.Tensor] | None
    accumulated_count: int

    def _receive(self, kind: str, microbatch: int, timeout_s: float | None = None,
                 name: str | None = None) -> Message: ...
    def _record_receive(self, message: Message, stage: int) -> None: ...
    def _after_update(self) -> None: ...
    def _send_chunk(self, peer: str, microbatch: int, step: str,
                    chunk: torch.Tensor) -> None: ...
    def _send_round(self, peer: str, round_index: int, step: str,
                    chunk: torch.Tensor) -> None: ...
    def _round_name(self, pipeline: int, stage: int, step: str) -> str: ...
    def _send_barrier(self, peer: str, m: int, step: str, chunk: torch.Tensor) -> None: ...
    def _barrier_name(self, pipeline: int, stage: int, step: str) -> str: ...


class SharingError(RuntimeError):
    """A peer's gradients or weights that do not fit this stage."""


class Sharing:
    accumulated: list[torch.Tensor] | None
    accumulated_count: int

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
            held = self.accumulated or [torch.zeros_like(p) for p in like]
            flat = torch.cat([flatten(held, dtype=like[0].dtype),
                              torch.tensor([float(self.accumulated_count)], dtype=like[0].dtype)])
            total, sent = ring_all_reduce(
                flat, group=spec.replicas, me=spec.device,
                send=lambda peer, step, chunk: self._send_chunk(peer, m, step, chunk),
                receive=lambda step: self._receive(
                    "grads", m, name=f"{spec.tag}:{step}").tensor)
            # the replicas' summed gradients and micro-batches: the update takes the average
            self.accumulated = unflatten(total[:-1], like)
            self.accumulated_count = round(float(total[-1]))
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
        weights and the weights' sum among the members (agent.gradsync). The version stays;
        the round's last update is checkpointed (and replicated) with the average."""
        spec, m = self.spec, action.microbatch
        round_index = (m + 1) // spec.round_every - 1
        start = self.clock.now()
        like = self.params
        flat = torch.cat([flatten(like) * spec.group_weight,
                          torch.tensor([spec.group_weight], dtype=like[0].dtype)])
        names = [f"{device}/{pipeline}/{stage}" for device, pipeline, stage in spec.group]
        total, sent = ring_all_reduce(
            flat, group=names, me=f"{spec.device}/{spec.pipeline}/{spec.stage}",
            send=lambda peer, step, chunk: self._send_round(peer, round_index, step, chunk),
            receive=lambda step: self._receive(
                "grads", round_index, name=self._round_name(spec.pipeline, spec.stage,
                                                            step)).tensor)
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

    def batch_barrier(self: Host, m: int) -> None:
        """Split learning's batch (``batch_sync``): wait until every member of this first
        stage's aggregation group finished micro-batch m - 1 and is at m, by a ring
        all-reduce of nothing; the paper releases each batch to every client at once, and
        its makespan is a batch's."""
        spec = self.spec
        names = [f"{device}/{pipeline}/{stage}" for device, pipeline, stage in spec.group]
        ring_all_reduce(
            torch.zeros(len(names)), group=names,
            me=f"{spec.device}/{spec.pipeline}/{spec.stage}",
            send=lambda peer, step, chunk: self._send_barrier(peer, m, step, chunk),
            receive=lambda step: self._receive(
                "grads", m, name=self._barrier_name(spec.pipeline, spec.stage, step)).tensor)

    def _barrier_name(self: Host, pipeline: int, stage: int, step: str) -> str:
        return f"g{self.spec.generation}:bar:p{pipeline}s{stage}:{step}"

    def _send_barrier(self: Host, peer: str, m: int, step: str, chunk: torch.Tensor) -> None:
        device, pipeline, stage = peer.rsplit("/", 2)
        header, frames = encode_message(
            run=self.spec.run, kind="grads", microbatch=m, version=self.version, tensor=chunk,
            name=self._barrier_name(int(pipeline), int(stage), step),
            sent_at=self.clock.absolute())
        self.plane.send(device, frames, header=header)

    def _round_name(self: Host, pipeline: int, stage: int, step: str) -> str:
        """The data-plane name of a group average's chunk for the member (pipeline, stage)
        (members of one device share its inbox)."""
        return f"g{self.spec.generation}:avg:p{pipeline}s{stage}:{step}"

    def _send_round(self: Host, peer: str, round_index: int, step: str,
                    chunk: torch.Tensor) -> None:
        device, pipeline, stage = peer.rsplit("/", 2)
        header, frames = encode_message(
            run=self.spec.run, kind="grads", microbatch=round_index, version=self.version,
            tensor=chunk, name=self._round_name(int(pipeline), int(stage), step),
            sent_at=self.clock.absolute())
        self.plane.send(device, frames, header=header)

