"""agent.system: the device's and the agent process's CPU, memory and temperature, read with
psutil (the real one, but for the temperature, which this machine has no sensor for), sampled
every few seconds while a stage of a run trains here and reported to each such run at its
clock, as metric points the protocol takes."""

from __future__ import annotations

import os
from collections import namedtuple
from typing import Any

import psutil
import pytest

from agent import system
from agent.deployments import Deployments
from agent.executor import Metric
from agent.reporting import Reporter
from agent.system import SystemMonitor, SystemSample, SystemSampler, hottest_temperature
from orchestrator.protocol import SYSTEM_METRICS, Events, Message
from tests.agent.test_reporting import deployment, points

# psutil's own record of a reading
shwtemp = namedtuple("shwtemp", ["label", "current", "high", "critical"])


def test_the_sampler_reads_this_machine_and_this_process() -> None:
    # Prepare
    sampler = SystemSampler()
    sampler.start()
    sum(i * i for i in range(200_000))  # some CPU of this process in the window

    # Execute
    sample = sampler.sample()

    # Assert
    memory = psutil.virtual_memory()
    assert sample.mem_total_bytes == memory.total
    assert 0 < sample.mem_used_bytes <= sample.mem_total_bytes
    rss = psutil.Process(os.getpid()).memory_info().rss
    assert 0.5 * rss < sample.proc_rss_bytes < 2 * rss
    assert 0 <= sample.cpu_pct <= 100 and 0 <= sample.proc_cpu_pct <= 100
    for kind, value in sample.figures().items():
        low, high = SYSTEM_METRICS[kind]
        assert low <= value <= high, kind


def test_without_a_sensor_there_is_no_temperature(monkeypatch: pytest.MonkeyPatch) -> None:
    # this machine's psutil finds none; a platform without sensors_temperatures has none
    monkeypatch.setattr(psutil, "sensors_temperatures", lambda: {})
    assert system.read_temperature() is None
    monkeypatch.delattr(psutil, "sensors_temperatures")
    assert system.read_temperature() is None
    sample = SystemSampler().sample()
    assert sample.temp_c is None and "temp_c" not in sample.figures()


def test_the_temperature_is_the_hottest_sensor_in_range(monkeypatch: pytest.MonkeyPatch) -> None:
    # a Raspberry Pi's cpu_thermal and a board sensor reporting "no value" as 255 and -128
    sensors = {"cpu_thermal": [shwtemp("", 61.3, None, None)],
               "board": [shwtemp("a", 255.0, None, None), shwtemp("b", -128.0, None, None),
                         shwtemp("c", 44.0, 80.0, 90.0), shwtemp("d", None, None, None)]}
    monkeypatch.setattr(psutil, "sensors_temperatures", lambda: sensors)

    sample = SystemSampler().sample()

    assert sample.temp_c == 61.3 and sample.figures()["temp_c"] == 61.3
    assert hottest_temperature({"board": sensors["board"]}) == 44.0
    assert hottest_temperature({"board": [shwtemp("a", 255.0, None, None)]}) is None


def test_a_sensor_that_fails_to_read_gives_no_temperature(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    def broken() -> Any:
        raise OSError("hwmon0: Input/output error")

    monkeypatch.setattr(psutil, "sensors_temperatures", broken)
    assert system.read_temperature() is None


class FixedSampler(SystemSampler):
    """The real sampler's process, with readings chosen by the test."""

    def __init__(self, sample: SystemSample) -> None:
        super().__init__()
        self.fixed = sample
        self.starts = 0

    def start(self) -> None:
        self.starts += 1

    def sample(self) -> SystemSample:
        return self.fixed


READING = SystemSample(cpu_pct=40.0, proc_cpu_pct=12.5, proc_rss_bytes=3e8,
                       mem_used_bytes=2e9, mem_total_bytes=8e9, temp_c=55.0)


def test_the_monitor_samples_soon_then_every_few_seconds_while_a_run_trains_here() -> None:
    # Prepare: a run's stage deployed here, not started yet; a clock the test moves
    deployments = Deployments()
    held = deployment(0, started_at=0.0)
    deployments.add(held)
    reported: list[tuple[int, Metric]] = []
    now = [1000.0]
    sampler = FixedSampler(READING)
    monitor = SystemMonitor(deployments=deployments, report=lambda run, m: reported.append(
        (run, m)), sampler=sampler, every_s=2.0, first_s=0.5, monotonic=lambda: now[0])

    # Execute / Assert: nothing before the stage starts
    assert monitor.tick() == 0 and sampler.starts == 0
    deployments.begin(held)
    held.clock.started_at = held.clock.absolute() - 30.0  # the run started 30 s ago
    assert monitor.tick() == 0 and sampler.starts == 1  # the first window begins
    now[0] += 0.25
    assert monitor.tick() == 0  # not due yet
    now[0] += 0.25
    assert monitor.tick() == 6  # the first reading, half a second in
    assert [m.name for _, m in reported] == ["cpu_pct", "proc_cpu_pct", "proc_rss_bytes",
                                            "mem_used_bytes", "mem_total_bytes", "temp_c"]
    assert {run for run, _ in reported} == {7}
    assert [m.value for _, m in reported] == [40.0, 12.5, 3e8, 2e9, 8e9, 55.0]
    assert all(30.0 <= m.at < 31.0 for _, m in reported)  # on the run's clock
    now[0] += 1.5
    assert monitor.tick() == 0  # then every 2 s
    now[0] += 0.5
    assert monitor.tick() == 6

    # the run ends here: no more readings, and the next run's first window starts anew
    deployments.take_run(7)
    now[0] += 10.0
    assert monitor.tick() == 0
    assert len(reported) == 12 and sampler.starts == 1


def test_the_monitor_refuses_periods_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="every_s must be positive, got 0"):
        SystemMonitor(deployments=Deployments(), report=lambda run, m: None, every_s=0)
    with pytest.raises(ValueError, match=r"first_s must be positive and at most every_s "
                                         r"\(2.0\), got 3.0"):
        SystemMonitor(deployments=Deployments(), report=lambda run, m: None, every_s=2.0,
                      first_s=3.0)


def test_readings_reach_the_server_as_metric_points_it_takes() -> None:
    # the real sampler through the real reporter: every point reads back as a MetricSample
    deployments = Deployments()
    held = deployment(1, started_at=0.0)
    deployments.add(held)
    deployments.begin(held)
    held.clock.started_at = held.clock.absolute() - 5.0
    posted: list[Message] = []
    reporter = Reporter(uid="edge-a", deployments=deployments, post=posted.append,
                        clock=lambda: 0.0)
    now = [0.0]
    monitor = SystemMonitor(deployments=deployments, report=reporter.metric,
                            monotonic=lambda: now[0])
    monitor.tick()
    now[0] = 2.0

    assert monitor.tick() >= 5
    reporter.flush()

    [batch] = posted
    assert isinstance(batch, Events) and batch.run == 7
    read = points(batch)  # as the server reads them: none refused
    assert {p["kind"] for p in read} >= {"cpu_pct", "proc_cpu_pct", "proc_rss_bytes",
                                         "mem_used_bytes", "mem_total_bytes"}
    assert {p["device"] for p in read} == {"edge-a"}
