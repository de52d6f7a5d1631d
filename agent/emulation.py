"""Emulating a slower device on this one (``--slowdown X``): a pass of a stage takes X times as
long as this machine takes for the same work warm, neither more nor less.

Where this machine's warm time for the work is known (the executor's forward and backward: the
profiler's per-layer times, measured in back-to-back sweeps), the pass is paced to X times that:
after work that took t seconds, wait X warm - t more. Waiting the emulated time makes the next
pass cold (the caches are refilled after a sleep), and pacing to X (t) instead, as EdgePipe
did first, multiplied that penalty by X too: the device ran several times slower than asked.
A pass whose warm time is not known (the update, whose cost the profile counts in the
backward) waits nothing and shortens the next wait by what it took.

``time.sleep`` wakes late (timer slack, the interpreter lock): that is kept as a debt and
settled by the next waits, so that over a run the device is as slow as asked. A pass that
overran its emulated time (a cold first pass, a busy machine) is forgiven beyond
``CATCH_UP_S``: a device does not run faster after a hiccup, and an emulated one that did (its
next passes ran unpaced until its slow first ones were repaid) measured faster than its
profile, so a recovery re-planned it with more capacity than it has.

The measurements behind both choices: docs/benchmarks.md, "Measurements behind choices in the
agent"."""

from __future__ import annotations

import time

CATCH_UP_S = 0.002  # how much of an overrun the next waits may make up

class Slowdown:
    def __init__(self, factor: float) -> None:
        if factor < 1:
            raise ValueError(f"slowdown must be at least 1, got {factor}")
        self.factor = factor
        self.debt_s = 0.0  # time still owed (negative: overslept or overran)

    def after(self, work_s: float, *, warm_s: float | None = None) -> None:
        """Wait as long as the device would take longer than this machine did for work that
        took ``work_s`` here: its ``factor`` times this machine's warm time for it
        (``warm_s``), or, where that is not known, ``factor`` times ``work_s``."""
        if self.factor == 1:
            return
        target = self.factor * (work_s if warm_s is None else warm_s)
        self.debt_s = max(self.debt_s + target - work_s, -CATCH_UP_S)
        if self.debt_s <= 0:
            return
        begun = time.perf_counter()
        time.sleep(self.debt_s)
        self.debt_s -= time.perf_counter() - begun
