"""The device's and the agent process's system figures while a run trains here: CPU use,
memory and the temperature where the device has a sensor, sampled with psutil every
:data:`SAMPLE_EVERY_S` and reported with each training run's events as metric points of the
kinds in :data:`orchestrator.protocol.SYSTEM_METRICS`, so that the run page can show them
beside the idle breakdown.

An agent reports what it measures: agents emulating devices on one machine (the demo's)
report that machine's CPU, memory and temperature each, and their own process's share.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import psutil

from agent.deployments import Deployments
from agent.executor import Metric
from orchestrator.protocol import SYSTEM_METRICS

log = logging.getLogger("edgepipe.agent")

SAMPLE_EVERY_S = 2.0
# the first reading comes this soon after training starts here, so that a short run has one
# (a CPU share measured over half a second is still an average over many passes)
FIRST_AFTER_S = 0.5
# the micro-batch of a point that is of none (agent.executor.Metric carries one)
NO_MICROBATCH = -1


class Sensor(Protocol):
    """A temperature reading as psutil gives it (``shwtemp``)."""

    @property
    def label(self) -> str: ...

    @property
    def current(self) -> float | None: ...


@dataclass(frozen=True)
class SystemSample:
    """One reading: CPU use in percent of all the device's cores (the device's, and the
    agent process's), memory in bytes, the hottest sensor's temperature (None without
    one)."""

    cpu_pct: float
    proc_cpu_pct: float
    proc_rss_bytes: float
    mem_used_bytes: float
    mem_total_bytes: float
    temp_c: float | None = None

    def figures(self) -> dict[str, float]:
        """The reading by metric kind; the temperature only when there is one."""
        out = {"cpu_pct": self.cpu_pct, "proc_cpu_pct": self.proc_cpu_pct,
               "proc_rss_bytes": self.proc_rss_bytes, "mem_used_bytes": self.mem_used_bytes,
               "mem_total_bytes": self.mem_total_bytes}
        if self.temp_c is not None:
            out["temp_c"] = self.temp_c
        return out


def _within(kind: str, value: float) -> float:
    """``value`` in ``kind``'s range, to a tenth (a live page holds a minute of every
    device's points: the digits past that only made the snapshot larger)."""
    low, high = SYSTEM_METRICS[kind]
    return round(min(high, max(low, value)), 1)


def hottest_temperature(sensors: Mapping[str, Sequence[Sensor]]) -> float | None:
    """The hottest current reading among ``sensors`` (psutil.sensors_temperatures' answer),
    None when there is none. A reading outside the protocol's range (a sensor reporting
    -128 or 255 for "no value") is not a temperature and is left out."""
    low, high = SYSTEM_METRICS["temp_c"]
    readings = [float(s.current) for group in sensors.values() for s in group
                if s.current is not None and low <= float(s.current) <= high]
    return max(readings, default=None)


def read_temperature() -> float | None:
    """The device's hottest sensor in degrees Celsius, or None where psutil has no sensor
    here (no hwmon or thermal zone, a platform without ``sensors_temperatures``)."""
    read = getattr(psutil, "sensors_temperatures", None)
    if read is None:
        return None
    try:
        sensors = read()
    except (OSError, RuntimeError) as exc:
        log.debug("no temperature: %s", exc)
        return None
    return hottest_temperature(sensors or {})


class SystemSampler:
    """Reads the figures with psutil. CPU use is measured between two calls (psutil keeps
    the previous call's counters): :meth:`start` begins a window, :meth:`sample` ends it
    and begins the next."""

    def __init__(self, *, process: psutil.Process | None = None) -> None:
        self.process = process or psutil.Process()
        self.cores = psutil.cpu_count() or 1

    def start(self) -> None:
        psutil.cpu_percent(interval=None)
        self.process.cpu_percent(interval=None)

    def sample(self) -> SystemSample:
        memory = psutil.virtual_memory()
        return SystemSample(
            cpu_pct=_within("cpu_pct", psutil.cpu_percent(interval=None)),
            # psutil gives the process's use in percent of one core
            proc_cpu_pct=_within("proc_cpu_pct",
                                 self.process.cpu_percent(interval=None) / self.cores),
            proc_rss_bytes=float(self.process.memory_info().rss),
            mem_used_bytes=float(memory.total - memory.available),
            mem_total_bytes=float(memory.total),
            temp_c=read_temperature())


class SystemMonitor:
    """Samples while a stage of a run trains here (its start came), ``first_s`` after
    training starts and then every ``every_s``, and reports each reading to every such run,
    at the run's clock. :meth:`tick` is called often (at each flush of the agent's events):
    it samples only when a reading is due."""

    def __init__(self, *, deployments: Deployments,
                 report: Callable[[int, Metric], None], sampler: SystemSampler | None = None,
                 every_s: float = SAMPLE_EVERY_S, first_s: float = FIRST_AFTER_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if not every_s > 0:
            raise ValueError(f"every_s must be positive, got {every_s!r}")
        if not 0 < first_s <= every_s:
            raise ValueError(f"first_s must be positive and at most every_s ({every_s!r}), "
                             f"got {first_s!r}")
        self.deployments = deployments
        self.report = report
        self.sampler = sampler or SystemSampler()
        self.every_s = every_s
        self.first_s = first_s
        self.monotonic = monotonic
        self._since: float | None = None  # the current window's start; None: not sampling
        self._window_s = first_s  # the current window's length

    def tick(self) -> int:
        """Sample if a reading is due; returns the number of points reported."""
        runs = self._training_runs()
        if not runs:
            self._since = None
            return 0
        now = self.monotonic()
        if self._since is None:  # a run started training here: the first window begins
            self.sampler.start()
            self._since, self._window_s = now, self.first_s
            return 0
        if now - self._since < self._window_s:
            return 0
        self._since, self._window_s = now, self.every_s
        try:
            figures = self.sampler.sample().figures()
        except (OSError, psutil.Error) as exc:
            log.warning("system figures not read: %s", exc)
            return 0
        return sum(self._report(run, at, figures) for run, at in runs)

    def _training_runs(self) -> list[tuple[int, float]]:
        """Each run with a started stage here and the run's clock now."""
        runs: dict[int, float] = {}
        for deployment in self.deployments.all():
            if deployment.started and deployment.spec.run not in runs:
                runs[deployment.spec.run] = round(deployment.clock.now(), 3)
        return sorted(runs.items())

    def _report(self, run: int, at: float, figures: Mapping[str, float]) -> int:
        for kind, value in figures.items():
            self.report(run, Metric(kind, value, NO_MICROBATCH, at))
        return len(figures)
