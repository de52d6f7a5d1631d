"""The demo's fault injection (``manage.py demo --kill-agent-at``): the agent it kills by
default, the kill on the run's clock, a killed child the testbed expects, and the flags'
refusals. Without starting a testbed (the end-to-end kill runs with the integration tests)."""

from __future__ import annotations

import re
import signal
import sys
import time
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from orchestrator.schedule import MAX_MICROBATCHES
from webapp.demo.client import DemoError
from webapp.demo.demo import DemoOptions, run_demo, stop_run
from webapp.demo.management.commands.demo import Command
from webapp.demo.processes import ProcessGroup
from webapp.demo.scenario import DEFAULT_AGENTS, LocalTestbed

# the testbed marks the devices it supervises in the database (webapp.devices.supervision)
pytestmark = pytest.mark.django_db

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def group(tmp_path: Path):
    processes = ProcessGroup(log_dir=tmp_path / "logs")
    yield processes
    processes.stop_all(grace_s=5)


def test_a_killed_child_is_expected_one_that_stops_on_its_own_is_not(group: ProcessGroup):
    victim = group.start("agent-b", SLEEP)
    group.start("agent-c", SLEEP)
    group.kill("agent-b")
    assert victim.process is not None and victim.process.returncode == -9  # SIGKILL
    assert victim.killed and group.exited() is None
    group.start("agent-d", [sys.executable, "-c", "raise SystemExit(3)"])
    deadline = time.monotonic() + 10
    while group.exited() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    exited = group.exited()
    assert exited is not None and exited.name == "agent-d"


class FakeApi:
    """The REST answers the testbed asks for: the run and its plans."""

    def __init__(self, *, started_s_ago: float, stages: list[list[str]]) -> None:
        self.started = timezone.now() - timedelta(seconds=started_s_ago)
        self.stages = stages

    def get(self, path: str) -> Any:
        if path == "/api/runs/7/":
            return {"id": 7, "state": "running", "started_at": self.started.isoformat()}
        if path == "/api/runs/7/plans/":
            return [{"id": 3, "document": {"stages": [{"devices": d, "layers": [k, k]}
                                                      for k, d in enumerate(self.stages)]}}]
        raise AssertionError(path)


def fake_testbed(group: ProcessGroup, api: FakeApi) -> LocalTestbed:
    bed = LocalTestbed(say=lambda line: None)
    bed.processes = group
    bed.api = api  # type: ignore[assignment]
    bed.devices = [{"uid": f"uid-{a.name}", "name": a.name} for a in bed.agents]
    return bed


@pytest.mark.parametrize(("stages", "victim"), [
    ([["uid-demo-fast"], ["uid-demo-slow"], ["uid-demo-slowlink"]], "demo-slow"),
    ([["uid-demo-slowlink"], ["uid-demo-fast"]], "demo-fast"),
    ([["uid-demo-slow", "uid-demo-fast"]], "demo-slow"),
])
def test_by_default_the_agent_of_the_plans_middle_stage_is_killed(group, stages, victim):
    bed = fake_testbed(group, FakeApi(started_s_ago=0, stages=stages))
    assert bed.agent_of_stage(7, 3).name == victim
    assert bed.agent_named("demo-slowlink") is DEFAULT_AGENTS[2]
    with pytest.raises(DemoError, match="no agent named 'nobody'; the agents: demo-fast, "):
        bed.agent_named("nobody")


def test_the_kill_comes_at_its_time_on_the_runs_clock_and_is_expected(group: ProcessGroup):
    bed = fake_testbed(group, FakeApi(started_s_ago=10.0, stages=[["uid-demo-slow"]]))
    slow = group.start("agent-demo-slow", SLEEP)
    slowlink = group.start("agent-demo-slowlink", SLEEP)
    fast = group.start("agent-demo-fast", SLEEP)
    timer = bed.kill_agent_at(7, DEFAULT_AGENTS[1:], 10.3)  # both, 0.3 s from now
    assert slow.process is not None and slow.process.poll() is None
    timer.join(timeout=10)
    assert slow.process.wait(timeout=10) == -9
    assert slowlink.process is not None and slowlink.process.wait(timeout=10) == -9
    assert fast.process is not None and fast.process.poll() is None
    bed.check_children()  # no DemoError: the testbed killed it on purpose
    group.start("worker", [sys.executable, "-c", "raise SystemExit(1)"])
    time.sleep(0.5)
    with pytest.raises(DemoError, match="worker stopped unexpectedly"):
        bed.check_children()


@pytest.mark.parametrize(("args", "says"), [
    (["--kill-agent-at", "0"], "--kill-agent-at: must be more than 0 seconds, got 0"),
    (["--kill-agent-at", "soon"], "--kill-agent-at: must be a number of seconds, got 'soon'"),
    (["--kill-agent-at", "5", "--kill-agent", "nobody"],
     "--kill-agent: no agent named 'nobody'; the agents: demo-fast, demo-slow, demo-slowlink"),
    (["--kill-agent-at", "5", "--kill-agent", "demo-slow,nobody"],
     "--kill-agent: no agent named 'nobody'"),
    (["--kill-agent", "demo-fast"], "--kill-agent: say when with --kill-agent-at SECONDS"),
    (["--pause-at", "-1"], "--pause-at: must be more than 0 seconds, got -1"),
    (["--pause-at", "3", "--pause-for", "later"],
     "--pause-for: must be a number of seconds, got 'later'"),
])
def test_the_demo_refuses_bad_kill_flags_before_starting_anything(args, says):
    sigterm = signal.getsignal(signal.SIGTERM)  # the command installs its own
    try:
        with pytest.raises(CommandError, match=re.escape(says)):
            call_command("demo", *args, stdout=StringIO(), stderr=StringIO())
    finally:
        signal.signal(signal.SIGTERM, sigterm)


def test_the_kill_flags_help_says_which_agent_by_default():
    text = " ".join(Command().create_parser("manage.py", "demo").format_help().split())
    assert "--kill-agent-at SECONDS fault injection: SECONDS after the run starts" in text
    assert "(default: the device of the middle stage of the chosen plan)" in text


@pytest.mark.parametrize(("changes", "message"), [
    ({"momentum": 1.0}, "--momentum must be from 0 to 0.999, got 1"),
    ({"momentum": -0.1}, "--momentum must be from 0 to 0.999, got -0.1"),
    ({"slow_to": 0.5}, "--slow-to must be from 1 to 1000, got 0.5"),
    ({"aggregate_every": -1}, "--aggregate-every must be from 0 to 1000, got -1"),
    ({"aggregate_every": 1001}, "--aggregate-every must be from 0 to 1000, got 1001"),
    ({"aggregate_every": 2, "schedule": "gpipe"},
     "--aggregate-every is for --schedule 1f1b (asynchronous), not gpipe"),
    ({"aggregate_every": 2, "schedule": "1f1b-sync"},
     "--aggregate-every is for --schedule 1f1b (asynchronous), not 1f1b-sync"),
    ({"lr": 0.0}, "--lr must be above 0 and at most 100, got 0"),
    ({"lr": 101.0}, "--lr must be above 0 and at most 100, got 101"),
    ({"kill_agents": ("demo-fast",)}, "--kill-agent: say when with --kill-agent-at SECONDS"),
    ({"microbatches": 0}, "--microbatches must be from 1 to 1024, got 0"),
    ({"batches": 0}, "--batches must be at least 1, got 0"),
    ({"batches": 10_000}, "--batches: 10,000 batches of 8 micro-batches make 80,000; a run "
                          "trains at most 50,000"),
])
def test_bad_demo_options_are_refused_before_anything_starts(changes, message):
    with pytest.raises(DemoError, match=re.escape(message)):
        run_demo(DemoOptions(**changes), say=lambda line: None)


@pytest.mark.parametrize(("args", "chosen"), [
    ([], (None, None)),  # the run's defaults: vertical sync on, no weight aggregation
    (["--no-vertical-sync"], (False, None)),
    (["--aggregate-every", "3"], (None, 3)),
    (["--no-vertical-sync", "--aggregate-every", "0"], (False, 0)),
    (["--schedule", "1f1b-sync", "--lr", "0.5"], (None, None)),
])
def test_the_demo_passes_vertical_sync_and_weight_aggregation_to_its_run(monkeypatch, args,
                                                                         chosen):
    """And --lr, --schedule 1f1b-sync: argparse takes them."""
    taken: list[DemoOptions] = []
    monkeypatch.setattr("webapp.demo.management.commands.demo.run_demo",
                        lambda options, say: taken.append(options))
    sigterm = signal.getsignal(signal.SIGTERM)  # the command installs its own
    try:
        call_command("demo", *args, stdout=StringIO(), stderr=StringIO())
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert [(o.vertical_sync, o.aggregate_every) for o in taken] == [chosen]


class RecordingApi:
    """Creates run 7 and plans it at once, keeping what the testbed sent."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, Any]] = []

    def post(self, path: str, body: Any = None) -> Any:
        self.posted.append((path, body))
        return {"id": 7}

    def get(self, path: str) -> Any:
        if path == "/api/runs/7/":
            return {"id": 7, "state": "planned"}
        if path == "/api/runs/7/plans/compare/":
            return {"rows": []}
        raise AssertionError(path)


@pytest.mark.parametrize(("settings", "sent"), [
    ({}, {}),
    ({"vertical_sync": False, "aggregate_every": 5},
     {"vertical_sync": False, "aggregate_every": 5}),
    ({"lr": 0.5}, {"lr": 0.5}),
])
def test_the_testbed_creates_its_run_with_the_settings_it_is_given(group, settings, sent):
    api = RecordingApi()
    bed = fake_testbed(group, FakeApi(started_s_ago=0, stages=[]))
    bed.api = api  # type: ignore[assignment]
    devices = [{**d, "id": k + 1} for k, d in enumerate(bed.devices)]
    compared = bed.plan(3, devices=devices, name="demo", algorithms=["ftpipehd"],
                        schedule="1f1b", microbatches=4, batches=10, **settings)
    assert compared["run"] == 7
    created = dict(api.posted)["/api/runs/"]
    assert {k: created[k] for k in ("vertical_sync", "aggregate_every", "lr")
            if k in created} == sent


def test_the_demo_creates_its_run_with_the_options_settings(monkeypatch):
    """run_demo hands the run's settings to the testbed's plan (stopped there)."""
    asked: dict[str, Any] = {}

    class Planned(Exception):
        pass

    class Bed:
        def __init__(self, **kwargs: Any) -> None:
            self.devices: list[dict[str, Any]] = []
            self.url = self.username = self.password = ""

        def __enter__(self) -> Bed:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def measure_links(self) -> list[Any]:
            return []

        def model_spec(self, **kwargs: Any) -> int:
            return 1

        def plan(self, spec: int, **kwargs: Any) -> dict[str, Any]:
            asked.update(kwargs)
            raise Planned

    monkeypatch.setattr("webapp.demo.demo.LocalTestbed", Bed)
    with pytest.raises(Planned):
        run_demo(DemoOptions(vertical_sync=False, aggregate_every=6, momentum=0.5, lr=0.3),
                 say=lambda line: None)
    assert ((asked["vertical_sync"], asked["aggregate_every"], asked["momentum"], asked["lr"])
            == (False, 6, 0.5, 0.3))


@pytest.mark.parametrize(("options", "batches"), [
    (DemoOptions(), MAX_MICROBATCHES // 8), (DemoOptions(headless=True), 100),
    (DemoOptions(batches=7), 7), (DemoOptions(batches=7, headless=True), 7)])
def test_the_demo_trains_until_stopped_unless_told_how_long(options, batches):
    # the demo's 100 batches were over before a new user looked at the run page
    assert options.batches_to_train() == batches


@pytest.mark.parametrize(("state", "stopped"), [("running", True), ("recovering", True),
                                                ("finished", False)])
def test_ctrl_c_stops_the_run_before_the_agents(state, stopped):
    # left running, the run read "failed: every device of the run was lost" at the next start
    posted: list[str] = []

    class Api:
        def get(self, path: str) -> Any:
            return {"id": 7, "state": state}

        def post(self, path: str, body: Any = None) -> Any:
            posted.append(path)
            return {}

    bed = LocalTestbed(say=lambda line: None)
    bed.api = Api()  # type: ignore[assignment]
    said: list[str] = []
    stop_run(bed, 7, said.append)
    assert posted == (["/api/runs/7/stop/"] if stopped else [])
    assert said == (["run 7 stopped"] if stopped else [])
