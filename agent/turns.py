"""The order in which a device runs the passes of several pipelines' stages: a split-learning
helper serves its clients' forward and backward tasks as the chosen schedule prescribes
(orchestrator.sl), not as their activations and gradients happen to arrive.

Each of the device's stages runs on an executor of its own; they share one :class:`Turnstile`
per run and generation. Its order is one micro-batch's tasks, ``(pipeline, kind)`` with kind
"forward" or "backward", repeated for every micro-batch: task i of micro-batch m is turn
``m * len(order) + i``. A pass the schedule preempts is several tasks in the order, its parts
(numbered from 0 as they come), each over some of its layers (agent.layered). A pass waits
for its turn (its input may still be on its way: the turn is its, and the others wait, as in
the schedule), and its end gives the turn to the next task. A pipeline that trains fewer
micro-batches than the others has no task past its last: its turns are skipped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.protocol.stagespec import TURN_KINDS


class TurnError(RuntimeError):
    """A pass (or part) that is not in the order, or a turn that did not come in time."""


@dataclass(frozen=True)
class Turn:
    """One task of a micro-batch's order: ``pipeline``'s ``kind`` pass, in a pipeline that
    trains ``microbatches`` micro-batches."""

    pipeline: int
    kind: str
    microbatches: int


class Turnstile:
    def __init__(self, order: Sequence[Turn], *, first_microbatch: int = 0) -> None:
        seen: dict[tuple[int, str], int] = {}
        tasks = []  # (pipeline, kind, part)
        for t in order:
            part = seen[(t.pipeline, t.kind)] = seen.get((t.pipeline, t.kind), -1) + 1
            tasks.append((t.pipeline, t.kind, part))
        if not order or len({(t.pipeline, t.kind, t.microbatches) for t in order}) != len(seen):
            raise TurnError("an order names at least one task, and each pipeline's micro-batch "
                            "count once")
        if any(t.kind not in TURN_KINDS or t.microbatches < 1 for t in order):
            raise TurnError("an order's tasks are forward or backward passes of pipelines "
                            "that train at least one micro-batch")
        self.order = tuple(order)
        self._index = {task: i for i, task in enumerate(tasks)}
        self._last = max(t.microbatches for t in order) * len(order)
        self._changed = threading.Condition()
        self._next = first_microbatch * len(order)
        self._dropped: frozenset[int] = frozenset()
        self._skip()

    def position(self, pipeline: int, kind: str, microbatch: int, part: int = 0) -> int:
        i = self._index.get((pipeline, kind, part))
        if i is None:
            raise TurnError(f"part {part} of the {kind} of pipeline {pipeline} is not in this "
                            "device's order")
        return microbatch * len(self.order) + i

    def wait(self, pipeline: int, kind: str, microbatch: int, part: int = 0, *,
             timeout_s: float, cancelled: Callable[[], bool] = lambda: False) -> None:
        """Block until it is the turn of this pass (its ``part``); TurnError after
        ``timeout_s`` or once ``cancelled()`` turns true."""
        mine = self.position(pipeline, kind, microbatch, part)
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._next != mine:
                if self._next > mine:
                    raise TurnError(f"the {kind} of micro-batch {microbatch} of pipeline "
                                    f"{pipeline} came after its turn")
                left = deadline - time.monotonic()
                if cancelled() or left <= 0:
                    raise TurnError(f"the {kind} of micro-batch {microbatch} of pipeline "
                                    f"{pipeline} waited {timeout_s - max(left, 0):.1f} s for "
                                    f"its turn, held by {self._describe(self._next)}")
                self._changed.wait(min(0.2, left))

    def done(self, pipeline: int, kind: str, microbatch: int, part: int = 0) -> None:
        """The pass (its ``part``) ended: the next task's turn."""
        with self._changed:
            if self._next == self.position(pipeline, kind, microbatch, part):
                self._next += 1
                self._skip()
                self._changed.notify_all()

    def drop(self, pipelines: frozenset[int] | set[int]) -> None:
        """The run goes on without ``pipelines``: their turns are skipped from now on."""
        with self._changed:
            self._dropped = self._dropped | frozenset(pipelines)
            self._skip()
            self._changed.notify_all()

    def _skip(self) -> None:
        """(Under the lock, or alone.) Past the turns of pipelines that have ended, or that
        the run went on without."""
        while self._next < self._last:
            turn = self.order[self._next % len(self.order)]
            if (self._next // len(self.order) < turn.microbatches
                    and turn.pipeline not in self._dropped):
                return
            self._next += 1

    def _describe(self, position: int) -> str:
        if position >= self._last:
            return "nobody (every task has run)"
        turn = self.order[position % len(self.order)]
        return (f"the {turn.kind} of micro-batch {position // len(self.order)} of pipeline "
                f"{turn.pipeline}")
