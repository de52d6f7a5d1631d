"""What a micro-batch costs a stage beyond its paced passes, measured while it trains.

Over the steady state (from the fifth of its backwards on), a stage's time less what it
waited (for a neighbour's message, or paused) and less what its passes should take (the
emulated factor times their warm times), per micro-batch; what its sends took each; and how
much of it was spent inside the passes, beyond their paced time. The agent turns them into
its device's ``overhead_s``, ``message_s`` and ``pass_overhead_s`` for the model
(docs/architecture.md, "A device's fixed overhead"). A stage that runs its passes on two
lanes at once has no single thread whose time this is: it measures nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

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


class CostClock:
    """The running totals a stage keeps for :class:`FixedCosts`, and marks of them at the
    steady state's start and at the latest backward."""

    def __init__(self, *, backwards: int) -> None:
        self.waited_s = 0.0
        self.paced_s = 0.0
        self.passed_s = 0.0  # inside the timed passes
        self.sent_s = 0.0  # in sends: encoding, handing to the data plane
        self.sends = 0
        self.steady_from = int(STEADY_FROM * backwards)
        self.steady: Mark | None = None
        self.latest: Mark | None = None

    def mark(self, backwards: int) -> None:
        mark = Mark(at=time.perf_counter(), waited_s=self.waited_s, paced_s=self.paced_s,
                    passed_s=self.passed_s, sent_s=self.sent_s, sends=self.sends,
                    backwards=backwards)
        if backwards == self.steady_from + 1:
            self.steady = mark
        self.latest = mark

    def costs(self) -> FixedCosts | None:
        """None with fewer than MIN_STEADY_MICROBATCHES micro-batches in the steady state."""
        if self.steady is None or self.latest is None:
            return None
        start, end = self.steady, self.latest
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
