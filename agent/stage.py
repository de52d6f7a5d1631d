"""What a stage's run is made of, beside its executor (agent.executor): the errors that end
it, the run's clock, the metric points the last stage reports, and what the run did."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from orchestrator.protocol import ProtocolError, StageSpec


class StageError(RuntimeError):
    """The stage cannot go on (a neighbour stopped answering, a deployment it cannot run)."""


class StageStopped(StageError):
    """The stage was told to stop (or halt) while it waited: not a failure."""


def check_spec(spec: StageSpec) -> StageSpec:
    """The spec, or a StageError saying why no device can run it."""
    try:
        spec.check()
    except ProtocolError as exc:
        raise StageError(f"malformed stage deployment: {exc}") from None
    return spec


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
class StageResult:
    forwards: list[int] = field(default_factory=list)
    backwards: list[int] = field(default_factory=list)
    updates: int = 0
    updated: list[int] = field(default_factory=list)  # micro-batches whose update was applied
    versions: dict[int, int] = field(default_factory=dict)  # micro-batch -> forward's version
    aggregated: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)  # micro-batches a group average followed


# what a stage calls with each replication point: (micro-batches applied, its weights, whether
# a chain replica is due, whether the central one is)
Checkpoint = Callable[[int, dict[str, torch.Tensor], bool, bool], None]
