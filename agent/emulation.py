"""Emulating a slower device on this one (``--slowdown X``): after work that took t seconds,
wait (X - 1) t more, so the work takes X times as long as here.

``time.sleep`` wakes 50-200 us late (timer slack, the interpreter lock), which on
sub-millisecond layers made an emulated device up to twice as slow as asked: the oversleep is
kept as a debt and settled by the next waits, so that over a run the device is X times slower,
neither more nor less. The executor and the profiler emulate the same way, at the same
granularity (after each pass of a stage), so that what an emulated agent profiles is what it
then runs like (on a virtual machine, work right after a sleep runs slower than in a busy
loop; the profile sees that too)."""

from __future__ import annotations

import time


class Slowdown:
    def __init__(self, factor: float) -> None:
        if factor < 1:
            raise ValueError(f"slowdown must be at least 1, got {factor}")
        self.factor = factor
        self.debt_s = 0.0  # time still owed (negative: overslept)

    def after(self, work_s: float) -> None:
        """Wait as long as work that took ``work_s`` here would take longer on the device."""
        if self.factor == 1:
            return
        self.debt_s += work_s * (self.factor - 1)
        if self.debt_s <= 0:
            return
        begun = time.perf_counter()
        time.sleep(self.debt_s)
        self.debt_s -= time.perf_counter() - begun
