"""What each process of a local testbed used of the machine's cores, and how long its threads
waited for one (bench/faults.py reads it before a kill and after the resumption: the agents,
the server and anything else running share this machine's cores, and real devices do not)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

SAMPLE_S = 0.5  # how often CpuSampler reads the processes' threads


class CpuSampler:
    """What each of the testbed's processes used of the machine's cores, and how long its
    threads were ready to run but waited for a core (Linux's per-thread schedstat: time on a
    core, time runnable on a run queue), sampled every SAMPLE_S on a thread of its own. Sampled
    rather than read at the end: a stage's thread has exited by the time its run has ended,
    and what it used and waited would be lost with it. ``window`` reads any part of a run
    afterwards (the steady state after the resumption, say)."""

    def __init__(self, testbed: Any) -> None:
        self.testbed = testbed
        self.ticks: list[tuple[float, float, dict[str, tuple[float, float]]]] = []
        self._last: dict[tuple[int, str], tuple[int, int]] = {}
        self._known: set[int] = set()  # processes sampled before (a new one starts uncounted)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)
        self._at = time.time()

    def __enter__(self) -> CpuSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def _pids(self) -> dict[int, str]:
        out = {}
        for name, child in list(self.testbed.processes.children.items()):
            if child.process is not None and child.process.poll() is None:
                out[child.process.pid] = name.removeprefix("agent-")
        return out

    def _sample(self) -> None:
        now = time.time()
        seen: dict[tuple[int, str], tuple[int, int]] = {}
        used: dict[str, tuple[float, float]] = {}
        pids = self._pids()
        for pid, name in pids.items():
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                        on_ns, waiting_ns = (int(x) for x in f.read().split()[:2])
                except (OSError, ValueError):
                    continue
                seen[(pid, tid)] = (on_ns, waiting_ns)
                if pid not in self._known:
                    continue
                # a thread new since the last sample counts from its start
                was_on, was_waiting = self._last.get((pid, tid), (0, 0))
                cpu, wait = used.get(name, (0.0, 0.0))
                used[name] = (cpu + (on_ns - was_on) / 1e9, wait + (waiting_ns - was_waiting) / 1e9)
        self._known |= set(pids)
        self._last = seen
        self.ticks.append((self._at, now, used))
        self._at = now

    def window(self, start: float, end: float) -> dict[str, dict[str, float]]:
        """Per process, over the samples that lie within [start, end] (epoch seconds): the
        cores it used and the cores' worth of its threads that waited for one."""
        inside = [(a, b, used) for a, b, used in self.ticks if a >= start and b <= end]
        span = sum(b - a for a, b, _ in inside)
        if span <= 0:
            return {}
        total: dict[str, list[float]] = {}
        for _, _, used in inside:
            for name, (cpu, wait) in used.items():
                acc = total.setdefault(name, [0.0, 0.0])
                acc[0] += cpu
                acc[1] += wait
        return {name: {"cores": round(cpu / span, 3), "waiting": round(wait / span, 3)}
                for name, (cpu, wait) in sorted(total.items())}


def agents_waiting(cpu: dict[str, dict[str, float]]) -> float | None:
    """The agents' threads' wait for a core, summed (cores' worth)."""
    waits = [v["waiting"] for name, v in cpu.items() if name not in ("web", "worker")]
    return round(sum(waits), 3) if waits else None
