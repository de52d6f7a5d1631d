"""The demo's fault injection (``manage.py demo --kill-agent-at``, ``--kill-agent-at-batch``):
the agent it kills by default, the kill on the run's clock or after batches, a killed child the
testbed expects, and the flags' refusals. Without starting a testbed (the end-to-end kill runs
with the integration tests)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from orchestrator.schedule import MAX_MICROBATCHES
from tests.webapp.factories import RunFactory
from tests.webapp.integration.stack import free_port
from webapp.demo.client import DemoError
from webapp.demo.demo import ASYNC_LR, DemoOptions, run_demo, stop_run
from webapp.demo.management.commands.demo import Command
from webapp.demo.processes import ProcessGroup
from webapp.demo.scenario import DEFAULT_AGENTS, SERVER_NICE, DemoAgent, LocalTestbed
from webapp.demo.triggers import When, run_progress
from webapp.runs.models import TimelineEvent

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


def test_a_child_started_nicer_runs_nicer_and_so_do_the_threads_it_starts(group: ProcessGroup):
    # Arrange: a child that reports its niceness and a new thread's, after its interpreter
    # started (the web server starts its threads once its imports are done)
    report = ("import os, threading, time; time.sleep(0.3); got = []; "
              "t = threading.Thread(target=lambda: got.append(os.getpriority(os.PRIO_PROCESS, 0)));"
              " t.start(); t.join(); print('nice', os.getpriority(os.PRIO_PROCESS, 0), got[0], "
              "flush=True)")
    ours = os.getpriority(os.PRIO_PROCESS, 0)

    # Act
    nicer = group.start("web", [sys.executable, "-c", report], nice=10)
    same = group.start("agent-a", [sys.executable, "-c", report])

    # Assert
    for child, expected in ((nicer, min(19, ours + 10)), (same, ours)):
        assert child.process is not None and child.process.wait(timeout=30) == 0
        assert f"nice {expected} {expected}" in child.log_path.read_text(), child.name


def test_the_testbed_starts_its_servers_beneath_its_agents(tmp_path: Path, monkeypatch):
    started: dict[str, int] = {}

    class Recording(ProcessGroup):
        def start(self, name: str, command: list[str], *, nice: int = 0) -> Any:
            started[name] = nice

    bed = LocalTestbed(say=lambda line: None, port=free_port(), workers=2)
    bed.processes = Recording(log_dir=tmp_path)
    bed._start_servers()
    assert started == {"web": SERVER_NICE, "worker": SERVER_NICE, "worker-2": SERVER_NICE}
    assert SERVER_NICE > 0
    assert LocalTestbed(say=lambda line: None, server_nice=0).server_nice == 0
    with pytest.raises(DemoError, match="server_nice must be at least 0"):
        LocalTestbed(say=lambda line: None, server_nice=-1)


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
    timer = bed.kill_agent_at(7, DEFAULT_AGENTS[1:], When(seconds=10.3))  # 0.3 s from now
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
    (["--kill-agent", "demo-fast"],
     "--kill-agent: say when with --kill-agent-at SECONDS or --kill-agent-at-batch N"),
    (["--kill-agent-at-batch", "soon"],
     "--kill-agent-at-batch: must be a whole number of batches, got 'soon'"),
    (["--kill-agent-at-batch", "2.5"],
     "--kill-agent-at-batch: must be a whole number of batches, got '2.5'"),
    (["--kill-agent-at-batch", "0"],
     "--kill-agent-at-batch must be from 1 to 6,250 (the batches the run trains), got 0"),
    (["--headless", "--kill-agent-at-batch", "101"],
     "--kill-agent-at-batch must be from 1 to 100 (the batches the run trains), got 101"),
    (["--batches", "30", "--kill-agent-at-batch", "31", "--kill-agent", "demo-fast"],
     "--kill-agent-at-batch must be from 1 to 30 (the batches the run trains), got 31"),
    (["--kill-agent-at", "5", "--kill-agent-at-batch", "3"],
     "--kill-agent-at SECONDS and --kill-agent-at-batch N: give one of them, not both"),
    (["--pause-at", "-1"], "--pause-at: must be more than 0 seconds, got -1"),
    (["--pause-at-batch", "x"], "--pause-at-batch: must be a whole number of batches, got 'x'"),
    (["--pause-at-batch", "-1"],
     "--pause-at-batch must be from 1 to 6,250 (the batches the run trains), got -1"),
    (["--pause-at", "2", "--pause-at-batch", "3"],
     "--pause-at SECONDS and --pause-at-batch N: give one of them, not both"),
    (["--pause-at", "3", "--pause-for", "later"],
     "--pause-for: must be a number of seconds, got 'later'"),
    # a model or data set no agent has: an agent refuses to profile it, and the demo waited
    # 300 s for the profile
    (["--model", "gpt"], "argument --model: invalid choice: 'gpt' (choose from 'mlp', "),
    (["--split", "--dataset", "imagenet"],
     "argument --dataset: no agent has the data set 'imagenet': choose digits, "
     "synthetic-cifar or npz:PATH"),
    (["--dataset", "npz:"], "argument --dataset: no agent has the data set 'npz:'"),
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
    assert ("batch the kill waits until the run is paused, so that the device is lost while it "
            "is paused") in text


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
    ({"kill_agent_at_batch": 0}, "--kill-agent-at-batch must be from 1 to 6,250"),
    ({"pause_at_batch": 11, "batches": 10}, "--pause-at-batch must be from 1 to 10"),
    ({"kill_agent_at": 1.0, "kill_agent_at_batch": 1},
     "--kill-agent-at SECONDS and --kill-agent-at-batch N: give one of them, not both"),
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


@pytest.mark.parametrize(("changes", "lr"), [
    ({}, ASYNC_LR),  # the default schedule, 1F1B: its stale weights kept VGG-5 from learning
    ({"lr": 0.1}, 0.1),
    ({"vertical_sync": False}, None),  # each stage on its newest weights: it learns at 0.1
    ({"schedule": "1f1b-sync"}, None),  # the run's default, 0.1
    ({"schedule": "gpipe", "lr": 0.3}, 0.3),
])
def test_the_demo_trains_the_asynchronous_1f1b_at_a_lower_rate_unless_told(changes, lr):
    # the demo's own run (VGG-5, FTPipeHD, 1F1B, the runs' default 0.1) never learned: its loss
    # rose to 5 and stayed at ln 10 (tests/integration/test_pipeline_training.py trains it)
    assert DemoOptions(**changes).run_lr() == lr


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


class DemoBed:
    """A testbed that run_demo drives through a headless run: it plans run 7 with one plan,
    3, whose middle stage is demo-slow's, and keeps what it was asked for."""

    def __init__(self) -> None:
        self.devices: list[dict[str, Any]] = []
        self.url = self.username = self.password = ""
        self.planned: dict[str, Any] = {}
        self.faults: list[tuple[Any, ...]] = []

    def __enter__(self) -> DemoBed:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def measure_links(self) -> list[Any]:
        return []

    def model_spec(self, **kwargs: Any) -> int:
        return 1

    def plan(self, spec: int, **kwargs: Any) -> dict[str, Any]:
        self.planned.update(kwargs)
        return {"run": 7, "reason": "", "best": 3, "rows": [{
            "plan": 3, "algorithm": "ftpipehd", "stages": 3, "throughput_sps": 100.0,
            "memory_ok": True, "status": "done", "error": ""}]}

    def start(self, run_id: int, plan_id: int) -> None:
        pass

    def agent_of_stage(self, run_id: int, plan_id: int) -> DemoAgent:
        return DEFAULT_AGENTS[1]

    def agent_named(self, name: str) -> DemoAgent:
        return next(a for a in DEFAULT_AGENTS if a.name == name)

    def kill_agent_at(self, run_id: int, agents: list[DemoAgent], when: When) -> None:
        self.faults.append(("kill", [a.name for a in agents], when))

    def pause_at(self, run_id: int, when: When, for_s: float) -> None:
        self.faults.append(("pause", when, for_s))

    def finish(self, run_id: int, *, timeout_s: float) -> dict[str, Any]:
        return {"run": run_id, "state": "finished"}


def run_on(monkeypatch: pytest.MonkeyPatch, bed: DemoBed, options: DemoOptions) -> list[str]:
    """run_demo on ``bed``, headless; the lines it said, without their times."""
    monkeypatch.setattr("webapp.demo.demo.LocalTestbed", lambda **kwargs: bed)
    said: list[str] = []
    assert run_demo(replace(options, headless=True), say=said.append) == {
        "run": 7, "state": "finished"}
    return [re.sub(r"^\[ *[0-9.]+ s\] ", "", line) for line in said]


def test_the_demo_creates_its_run_with_the_options_settings(monkeypatch):
    """run_demo hands the run's settings to the testbed's plan."""
    bed = DemoBed()
    run_on(monkeypatch, bed, DemoOptions(vertical_sync=False, aggregate_every=6, momentum=0.5,
                                         lr=0.3))
    asked = bed.planned
    assert ((asked["vertical_sync"], asked["aggregate_every"], asked["momentum"], asked["lr"])
            == (False, 6, 0.5, 0.3))


@pytest.mark.parametrize(("options", "faults", "lines"), [
    (DemoOptions(kill_agent_at=3.5, pause_at=2.0, pause_for=3.0),
     [("kill", ["demo-slow"], When(seconds=3.5)), ("pause", When(seconds=2.0), 3.0)],
     ["fault injection: demo-slow will be killed 3.5 s into the run",
      "the run will be paused 2 s into it, for 3 s"]),
    # at the pause's batch, the kill waits for the pause: the device is lost while paused
    (DemoOptions(kill_agent_at_batch=20, pause_at_batch=20, pause_for=3.0),
     [("kill", ["demo-slow"], When(batches=20, paused=True)), ("pause", When(batches=20), 3.0)],
     ["fault injection: demo-slow will be killed 20 batches into the run, once it is paused",
      "the run will be paused 20 batches into it, for 3 s"]),
    (DemoOptions(kill_agent_at_batch=1, pause_at_batch=2, kill_agents=("demo-fast", "demo-slow")),
     [("kill", ["demo-fast", "demo-slow"], When(batches=1)), ("pause", When(batches=2), 2.0)],
     ["fault injection: demo-fast, demo-slow will be killed 1 batch into the run",
      "the run will be paused 2 batches into it, for 2 s"]),
    (DemoOptions(kill_agent_at_batch=5, pause_at=5.0),
     [("kill", ["demo-slow"], When(batches=5))], []),
])
def test_the_demo_injects_its_faults_when_it_is_told(monkeypatch, options, faults, lines):
    bed = DemoBed()
    said = run_on(monkeypatch, bed, options)
    assert bed.faults[:len(faults)] == faults
    assert [line for line in lines if line not in said] == []


def test_a_when_is_seconds_or_batches_into_a_run():
    assert When(seconds=0.25).describe() == "0.25 s into the run"
    assert When(batches=1).describe("run 7") == "1 batch into run 7"
    assert When(batches=30, paused=True).describe("it") == "30 batches into it, once it is paused"
    wrongs: list[dict[str, Any]] = [{}, {"seconds": 1.0, "batches": 2},
                                    {"seconds": 1.0, "paused": True}]
    for wrong in wrongs:
        with pytest.raises(ValueError):
            When(**wrong)


def update(run: Any, microbatch: int, *, kind: str = "update") -> None:
    TimelineEvent.objects.create(run=run, device="uid-a", stage=0, kind=kind,
                                 microbatch=microbatch, version=microbatch, start=0.0, end=0.1)


def test_a_batch_is_trained_once_some_stage_applied_its_last_microbatchs_update():
    run = RunFactory(microbatches=4, state="running")
    assert run_progress(run.pk) == ("running", 0)
    for m in range(7):
        update(run, m)
    update(run, 11, kind="forward")  # forwarded, not yet applied
    update(RunFactory(microbatches=4), 11)  # another run's
    assert run_progress(run.pk) == ("running", 1)
    update(run, 7)
    assert run_progress(run.pk) == ("running", 2)


class Progress:
    """What the testbed's batch triggers read of run 7: its state and the batches it trained.
    A test changes them, and waits for the triggers to look again."""

    def __init__(self, state: str = "running", batches: int = 0) -> None:
        self.state, self.batches, self.looks = state, batches, 0
        self.looked = threading.Condition()

    def __call__(self, run_id: int) -> tuple[str, int]:
        assert run_id == 7
        with self.looked:
            self.looks += 1
            self.looked.notify_all()
            return self.state, self.batches

    def set(self, state: str, batches: int) -> None:
        with self.looked:
            self.state, self.batches = state, batches

    def wait_looks(self, more: int) -> None:
        with self.looked:
            target = self.looks + more
            assert self.looked.wait_for(lambda: self.looks >= target, timeout=10)


def batch_testbed(group: ProcessGroup, progress: Progress, said: list[str] | None = None
                  ) -> tuple[LocalTestbed, subprocess.Popen[bytes]]:
    """A testbed reading ``progress``, and demo-slow's agent (a process to kill)."""
    bed = fake_testbed(group, FakeApi(started_s_ago=0, stages=[["uid-demo-slow"]]))
    bed.progress = progress
    if said is not None:
        bed.say = said.append
    slow = group.start("agent-demo-slow", SLEEP).process
    assert slow is not None
    return bed, slow


def test_a_kill_after_batches_comes_once_the_run_has_trained_them(group: ProcessGroup):
    progress = Progress(batches=2)
    bed, slow = batch_testbed(group, progress)
    trigger = bed.kill_agent_at(7, [DEFAULT_AGENTS[1]], When(batches=3))
    progress.wait_looks(3)
    assert slow.poll() is None and trigger.is_alive()
    progress.set("running", 3)
    trigger.join(timeout=10)
    assert slow.wait(timeout=10) == -9 and not trigger.is_alive()


def test_a_kill_at_the_pauses_batch_waits_for_the_run_to_be_paused(group: ProcessGroup):
    # a pause takes effect a moment after it is asked for: killed at once, the device was
    # lost before the run was paused
    assert (DemoOptions(kill_agent_at_batch=4, pause_at_batch=4).kill_when()
            == When(batches=4, paused=True))
    progress = Progress(batches=4)
    bed, slow = batch_testbed(group, progress)
    trigger = bed.kill_agent_at(7, [DEFAULT_AGENTS[1]], When(batches=4, paused=True))
    progress.wait_looks(3)
    progress.set("recovering", 5)
    progress.wait_looks(3)
    assert slow.poll() is None
    progress.set("paused", 5)
    trigger.join(timeout=10)
    assert slow.wait(timeout=10) == -9


def test_a_batch_trigger_gives_up_when_the_run_ends_first(group: ProcessGroup):
    said: list[str] = []
    progress = Progress(batches=1)
    bed, slow = batch_testbed(group, progress, said)
    trigger = bed.kill_agent_at(7, [DEFAULT_AGENTS[1]], When(batches=2, paused=True))
    progress.wait_looks(1)
    progress.set("failed", 1)
    trigger.join(timeout=10)
    assert not trigger.is_alive() and slow.poll() is None
    assert said == ["run 7 ended (failed): nothing comes 2 batches into the run, once it is "
                    "paused"]


def test_the_testbed_stops_its_batch_triggers_when_it_stops(group: ProcessGroup):
    progress = Progress(batches=0)
    bed, _ = batch_testbed(group, progress)
    trigger = bed.pause_at(7, When(batches=1), 1.0)  # FakeApi cannot pause: it must not
    progress.wait_looks(1)
    bed.__exit__(None, None, None)
    trigger.join(timeout=10)
    assert not trigger.is_alive()
    looks = progress.looks
    progress.set("running", 1)
    time.sleep(0.3)
    assert progress.looks == looks


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
