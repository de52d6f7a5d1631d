"""How a stage's passes and messages are timed and recorded, for the stage executor: its
receives (with stage 0's backward timer), its timed passes (in their turn on a device that
takes turns, paced when emulated) and its sends, each a timeline event. A mixin of
:class:`agent.executor.StageExecutor`, as agent.sharing is (a composed helper holding the
executor back would make every deployment a reference cycle)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from agent.emulation import Slowdown
from agent.fixedcosts import CostClock
from agent.sharing import GroupChanged
from agent.stage import Clock, StageError, StageStopped
from agent.transport import DataPlane
from agent.turns import TurnError, Turnstile
from agent.wire import Message, encode_message
from orchestrator.events import TimelineEvent
from orchestrator.formats import LayerTimes
from orchestrator.protocol import StageSpec
from orchestrator.schedule import Schedule


class Host(Protocol):
    """What of the executor these methods read (and ``costs``, which they add to)."""

    spec: StageSpec
    plane: DataPlane
    clock: Clock
    schedule: Schedule
    stop: threading.Event
    running: threading.Event
    failure: BaseException | None
    costs: CostClock
    turns: Turnstile | None
    warm: LayerTimes | None
    warm_s: dict[str, float] | None
    emulation: Slowdown
    lane_emulation: dict[str, Slowdown] | None
    gradient_arrivals: list[float]
    on_event: Callable[[TimelineEvent], None]
    on_suspect: Callable[[int, float], None]

    def _receive(self, kind: str, microbatch: int, timeout_s: float | None = None,
                 name: str | None = None,
                 changed: Callable[[], bool] | None = None) -> Message: ...
    def _suspect_after(self) -> float | None: ...
    def _pass(self, kind: str, microbatch: int, version: int, work: Callable[[], Any],
              layers: tuple[int, int] | None = None) -> Any: ...


class StageIO:
    """The executor's receives, timed passes and sends."""

    def _receive(self: Host, kind: str, microbatch: int, timeout_s: float | None = None,
                 name: str | None = None,
                 changed: Callable[[], bool] | None = None) -> Message:
        """The message of ``kind`` and ``microbatch`` (and ``name``); StageStopped once the
        stage stops, GroupChanged once ``changed()`` (a group all-reduce's members went),
        StageError after the timeout."""
        begun = time.perf_counter()
        moved = changed or (lambda: False)
        try:
            return self.plane.receive(self.spec.run, kind, microbatch,
                                      name=name or self.spec.tag,
                                      timeout_s=timeout_s or self.spec.receive_timeout_s,
                                      cancelled=lambda: self.stop.is_set()
                                      or self.failure is not None or moved())
        except TimeoutError as exc:
            if self.stop.is_set() or self.failure is not None:
                raise StageStopped(f"stage {self.spec.stage} stopped") from None
            if moved():
                raise GroupChanged(f"stage {self.spec.stage}: its group changed") from None
            raise StageError(f"stage {self.spec.stage}: {exc}") from None
        finally:
            self.costs.waited_s += time.perf_counter() - begun

    def _suspect_after(self: Host) -> float | None:
        """FTPipeHD's backward timer: how long stage 0 waits for a gradient before it suspects
        a device, a multiple of the moving average time between gradients (None until a few
        have come)."""
        arrivals = self.gradient_arrivals
        if len(arrivals) < 4:
            return None
        gaps = [b - a for a, b in zip(arrivals[-9:], arrivals[-8:], strict=False)]
        average = sum(gaps) / len(gaps)
        return max(self.spec.suspect_min_s, self.spec.suspect_factor * average)

    def _receive_gradient(self: Host, microbatch: int) -> Message:
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

    def _record_receive(self: Host, message: Message, stage: int) -> None:
        """A receive spans from the sender's start to the arrival (both on the server's epoch
        clock, as the data plane keeps time)."""
        arrived = message.arrived_at - self.clock.started_at
        sent = arrived if message.header.sent_at is None else (
            message.header.sent_at - self.clock.started_at)
        self.on_event(TimelineEvent(self.spec.run, self.spec.device, stage, "recv",
                                    message.header.microbatch, message.header.version,
                                    min(sent, arrived), arrived, message.nbytes,
                                    pipeline=self.spec.pipeline))

    def _timed(self: Host, kind: str, microbatch: int, version: int, work: Callable[[], Any], *,
               part: int = 0, layers: tuple[int, int] | None = None) -> Any:
        """Run ``work``, a pass (or the ``part`` of one over the stage's ``layers``), in its
        turn when the device takes turns; its timeline event; paced when emulated."""
        if self.turns is not None and kind != "update":
            try:  # the device's schedule says when (a split-learning helper's)
                self.turns.wait(self.spec.pipeline, kind, microbatch, part,
                                timeout_s=self.spec.receive_timeout_s,
                                cancelled=self.stop.is_set)
            except TurnError as exc:
                if self.stop.is_set():
                    raise StageStopped(f"stage {self.spec.stage} stopped") from None
                raise StageError(str(exc)) from None
            try:
                return self._pass(kind, microbatch, version, work, layers)
            finally:
                self.turns.done(self.spec.pipeline, kind, microbatch, part)
        return self._pass(kind, microbatch, version, work, layers)

    def _pass(self: Host, kind: str, microbatch: int, version: int, work: Callable[[], Any],
              layers: tuple[int, int] | None = None) -> Any:
        start = self.clock.now()
        begun = time.perf_counter()
        out = work()
        warm_s = None if self.warm_s is None else self.warm_s[kind]
        if layers is not None and self.warm is not None:  # a part of the pass: its layers'
            a = self.spec.layers[0]
            times = self.warm.forward_s if kind == "forward" else self.warm.backward_s
            warm_s = sum(times[a + layers[0]:a + layers[1] + 1])
        emulation = self.emulation if self.lane_emulation is None else self.lane_emulation[
            "forward" if kind == "forward" else "other"]
        emulation.after(time.perf_counter() - begun, warm_s=warm_s)
        if warm_s is not None:
            self.costs.paced_s += emulation.factor * warm_s
        self.costs.passed_s += time.perf_counter() - begun
        self.on_event(TimelineEvent(self.spec.run, self.spec.device, self.spec.stage, kind,
                                    microbatch, version, start, self.clock.now(),
                                    pipeline=self.spec.pipeline))
        return out

    def _send(self: Host, kind: str, stage: int, microbatch: int, version: int,
              tensor: torch.Tensor, labels: torch.Tensor | None = None) -> None:
        begun = time.perf_counter()
        peer = self.schedule.device_for(stage, microbatch - self.spec.first_microbatch)
        header, frames = encode_message(
            run=self.spec.run, kind=kind, microbatch=microbatch, version=version, tensor=tensor,
            name=self.spec.tag, sent_at=self.clock.absolute(), labels=labels)
        self.plane.send(peer, frames, header=header)
        self.costs.sent_s += time.perf_counter() - begun
        self.costs.sends += 1

