"""The agent's command handling and configuration (no server needed: the commands are the
messages the server would send)."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from agent.config import (
    AgentConfig,
    ConfigError,
    Enrolment,
    load_enrolment,
    local_address_towards,
    normalise_server,
    parse_resources,
    save_enrolment,
    websocket_url,
)
from agent.deployments import Deployment
from agent.runtime import AgentRuntime
from tests.conftest import ROOT

ENROLMENT = Enrolment(server="http://127.0.0.1:1", uid="edge-abc123", key="dk_secret",
                      name="edge")

KEY = 'Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID'  # a peer's CURVE public key (Z85)


@pytest.fixture
def runtime() -> Any:
    agent = AgentRuntime(AgentConfig(enrolment=ENROLMENT), stop=threading.Event())
    yield agent
    agent.close()


def spec(**overrides: Any) -> dict[str, Any]:
    base = {"run": 7, "device": ENROLMENT.uid, "stage": 0, "layers": [0, 1], "model": "mlp",
            "dataset": "digits", "batch_size": 8, "schedule": "1f1b",
            "stage_devices": [[ENROLMENT.uid], ["edge-other"]],
            "stage_times_s": [[1.0], [1.0]], "microbatches": 4}
    base.update(overrides)
    return base


def command(name: str, **fields: Any) -> dict[str, Any]:
    return {"type": "command", "id": "c1", "command": name, **fields}


def held(runtime: AgentRuntime, run: int) -> Deployment:
    """The run's one stage held by ``runtime``."""
    [deployment] = runtime.deployments.of_run(run)
    return deployment


def posted(runtime: AgentRuntime, kind: str) -> list[dict[str, Any]]:
    """The messages of type ``kind`` waiting in the runtime's outbox."""
    return [m for m in runtime.connection.pending() if m["type"] == kind]


@pytest.mark.parametrize(("message", "error"), [
    (command("start", run=7, started_at=0.0), "no stage of run 7 is deployed here"),
    (command("pause", run=3), "no stage of run 3 is deployed here"),
    (command("deploy", run=7, peers={},
             spec=spec(device="edge-zzz", stage_devices=[["edge-zzz"], ["edge-other"]])),
     "this agent is device edge-abc123; the stage is for edge-zzz"),
    (command("deploy", run=7, spec=spec(), peers={}),
     "no data-plane address for neighbour edge-other"),
    (command("deploy", run=7, spec=spec(model="resnet999"), peers={"edge-other": "tcp://x:1"},
             keys={"edge-other": KEY}),
     "unknown model 'resnet999'"),
    (command("deploy", run=7, spec={"run": 7}, peers={}),
     "malformed deploy: spec.device: is missing from the stage spec"),
    (command("teleport"), "unknown command 'teleport'"),
])
def test_commands_it_cannot_carry_out_are_refused_and_change_nothing(
        runtime: AgentRuntime, message: dict[str, Any], error: str) -> None:
    ack = runtime.handle_command(message).to_json()
    assert ack["ok"] is False and ack["id"] == "c1" and error in ack["error"]
    assert len(runtime.deployments) == 0


def test_a_deployed_stage_is_held_until_stopped(runtime: AgentRuntime) -> None:
    ack = runtime.handle_command(command("deploy", run=7, spec=spec(),
                                         peers={"edge-other": "tcp://127.0.0.1:9"},
                                   keys={"edge-other": KEY}))
    assert ack.to_json() == {"type": "ack", "id": "c1", "command": "deploy", "run": 7,
                             "ok": True, "generation": 0, "pipeline": 0, "stage": 0}
    assert 7 in runtime.deployments
    again = runtime.handle_command(command("deploy", run=7, spec=spec(),
                                           peers={"edge-other": "tcp://127.0.0.1:9"},
                                   keys={"edge-other": KEY}))
    assert again.ok is False and again.error and "already deployed" in again.error
    assert runtime.handle_command(command("pause", run=7)).ok
    assert not held(runtime, 7).running.is_set()
    assert runtime.handle_command(command("resume", run=7)).ok
    assert runtime.handle_command(command("stop", run=7)).ok
    assert 7 not in runtime.deployments
    assert runtime.handle_command(command("stop", run=7)).ok  # stopping twice is harmless


def test_a_deployed_stage_s_model_and_data_are_left_out_of_full_collections(
        runtime: AgentRuntime) -> None:
    import gc

    gc.unfreeze()
    try:
        ack = runtime.handle_command(command("deploy", run=7, spec=spec(),
                                             peers={"edge-other": "tcp://127.0.0.1:9"},
                                   keys={"edge-other": KEY}))
        assert ack.ok
        module = held(runtime, 7).executor.module
        assert gc.get_freeze_count() > 0
        assert not any(o is module for o in gc.get_objects())  # frozen: not walked
    finally:
        runtime.handle_command(command("stop", run=7))
        gc.unfreeze()


def test_an_ended_deployment_s_model_is_freed_though_the_heap_is_frozen(
        runtime: AgentRuntime) -> None:
    import gc
    import weakref

    gc.unfreeze()
    try:
        alone = spec(stage_devices=[[ENROLMENT.uid]], stage_times_s=[[1.0]], layers=[0, 3],
                     microbatches=8)
        models = []
        for run, ends in ((7, "finishing"), (8, "stopped before it started")):
            assert runtime.handle_command(command("deploy", run=run, spec={**alone, "run": run},
                                                  peers={})).ok, ends
            models.append(weakref.ref(held(runtime, run).executor.module))
            if run == 7:
                assert runtime.handle_command(command("start", run=7,
                                                      started_at=time.time())).ok
                thread = held(runtime, 7).thread
                assert thread is not None
                thread.join(timeout=60)
            else:
                assert runtime.handle_command(command("stop", run=8)).ok
        assert gc.get_freeze_count() > 0  # each deployment froze the heap
        gc.collect()  # frozen objects are not collected: only references going frees them
        # the executor was a reference cycle (its bound methods), and every deployment's
        # model stayed in memory for good
        assert [m() for m in models] == [None, None]
    finally:
        gc.unfreeze()


def test_a_finished_stage_reports_the_overhead_it_measured(runtime: AgentRuntime) -> None:
    runtime.overhead_s = 1.0  # what the probe said: hellos go on reporting it
    alone = spec(stage_devices=[[ENROLMENT.uid]], stage_times_s=[[1.0]], layers=[0, 3],
                 microbatches=40)
    assert runtime.handle_command(command("deploy", run=7, spec=alone, peers={})).ok
    assert runtime.handle_command(command("start", run=7, started_at=time.time())).ok
    thread = held(runtime, 7).thread
    assert thread is not None
    thread.join(timeout=60)
    done = posted(runtime, "stage_done")
    assert len(done) == 1 and done[0]["backwards"] == 40
    assert 0 <= done[0]["overhead_s"] < 0.1
    assert 0 <= done[0]["pass_overhead_s"] <= done[0]["overhead_s"]
    assert "message_s" not in done[0]  # alone: nothing sent
    assert runtime.overhead_s == 1.0


def test_a_convolutional_stage_runs_in_the_layout_timed_faster_at_its_first_deployment(
        runtime: AgentRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    timed: list[tuple[int, ...]] = []

    def faster(module: torch.nn.Module, example: torch.Tensor) -> str:
        timed.append(tuple(example.shape))
        return "channels_last"

    monkeypatch.setattr("agent.launch.faster_format", faster)
    conv = spec(model="vgg5", layers=[1, 2], stage=1,
                stage_devices=[["edge-other"], [ENROLMENT.uid]])
    for run in (7, 8):  # the same stage shape twice: timed once
        assert runtime.handle_command(command("deploy", run=run, spec={**conv, "run": run},
                                              peers={"edge-other": "tcp://127.0.0.1:9"},
                                              keys={"edge-other": KEY})).ok
        weights = [p for p in held(runtime, run).executor.params if p.dim() == 4]
        assert weights and all(w.is_contiguous(memory_format=torch.channels_last)
                               and not w.is_contiguous() for w in weights)
    assert timed == [(8, 32, 4, 4)]  # layer 1's input: conv1's output, 8 samples
    mlp = spec(run=9, stage_devices=[[ENROLMENT.uid]], stage_times_s=[[1.0]], layers=[0, 3])
    assert runtime.handle_command(command("deploy", run=9, spec=mlp, peers={})).ok
    assert timed == [(8, 32, 4, 4)]  # no convolution: nothing timed
    for run in (7, 8, 9):
        assert runtime.handle_command(command("stop", run=run)).ok


def test_a_stage_started_paused_trains_only_once_resumed(runtime: AgentRuntime) -> None:
    alone = spec(stage_devices=[[ENROLMENT.uid]], stage_times_s=[[1.0]], layers=[0, 3],
                 microbatches=8)
    assert runtime.handle_command(command("deploy", run=7, spec=alone, peers={})).ok
    # a paused run's recovery starts its new generation this way
    assert runtime.handle_command(command("start", run=7, started_at=time.time(),
                                          paused=True)).ok
    deployment = held(runtime, 7)
    time.sleep(0.5)
    assert deployment.thread is not None and deployment.thread.is_alive()
    assert deployment.executor.applied == 0  # waiting, not training
    assert runtime.handle_command(command("resume", run=7)).ok
    deployment.thread.join(timeout=60)
    done = posted(runtime, "stage_done")
    assert len(done) == 1 and done[0]["backwards"] == 8


def test_profiling_on_command_reports_progress_then_the_profile(runtime: AgentRuntime) -> None:
    ack = runtime.handle_command(command("profile", model="mlp", dataset="digits",
                                         batch_size=8))
    assert ack.ok is True
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if posted(runtime, "profile_result"):
            break
        time.sleep(0.1)
    messages = runtime.connection.pending()
    progress = [(m["done"], m["total"]) for m in messages if m["type"] == "profile_progress"]
    # the first step at once, at most one every half second after it, and the last
    assert progress[0] == (1, 4 + 5) and progress[-1][0] == progress[-1][1]
    assert [d for d, _ in progress] == sorted({d for d, _ in progress})
    result = next(m for m in messages if m["type"] == "profile_result")
    assert result["model_spec"] == {"model": "mlp", "dataset": "digits", "batch_size": 8}
    assert len(result["profile"]["layers"]) == 4


def test_warm_times_outlive_the_agent_process(tmp_path: Path) -> None:
    # an emulated device paces by the warm times its profile was taken with: a restarted agent
    # must find them, not measure new ones that disagree with the profile the server plans by
    from orchestrator.formats import LayerTimes

    path = tmp_path / "edge.warm-times.json"
    config = AgentConfig(enrolment=ENROLMENT, slowdown=4.0, warm_times_path=path)
    first = AgentRuntime(config, stop=threading.Event())
    try:
        assert first.handle_command(command("profile", model="mlp", dataset="digits",
                                            batch_size=8)).ok
        deadline = time.monotonic() + 60
        while not posted(first, "profile_result") and time.monotonic() < deadline:
            time.sleep(0.05)
        kept = first.warm.times[("mlp", "digits", 8)]
    finally:
        first.close()
    [result] = posted(first, "profile_result")
    # what the server was told is the device's: 4x the warm times kept
    assert [la["forward_s"] for la in result["profile"]["layers"]] == pytest.approx(
        [4 * t for t in kept.forward_s])
    second = AgentRuntime(config, stop=threading.Event())
    try:
        assert second.warm.times == {("mlp", "digits", 8): kept}
        fresh = second.warm.get("mlp", "digits", 8)  # no measuring: the kept ones
        assert fresh == kept
    finally:
        second.close()
    path.write_text("{not json", encoding="utf-8")
    third = AgentRuntime(config, stop=threading.Event())
    try:
        assert third.warm.times == {}  # measured again at the next deployment
        assert isinstance(third.warm.get("mlp", "digits", 8), LayerTimes)
        assert json.loads(path.read_text(encoding="utf-8"))[0]["model"] == "mlp"
    finally:
        third.close()
    document = json.loads(path.read_text(encoding="utf-8"))
    document[0]["layer_times"]["forward_s"][0] = -1.0  # validated as a device's layer_times
    path.write_text(json.dumps(document), encoding="utf-8")
    fourth = AgentRuntime(config, stop=threading.Event())
    try:
        assert fourth.warm.times == {}
    finally:
        fourth.close()


def test_enrolment_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "state" / "agent.json"
    save_enrolment(path, ENROLMENT)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_enrolment(path) == ENROLMENT
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="others can read it"):
        load_enrolment(path)
    with pytest.raises(ConfigError, match="no enrolment here"):
        load_enrolment(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"server": "http://x"}))
    os.chmod(broken, 0o600)
    with pytest.raises(ConfigError, match="uid is missing"):
        load_enrolment(broken)


def test_server_urls() -> None:
    assert normalise_server("http://10.0.0.2:8000/") == "http://10.0.0.2:8000"
    assert websocket_url("https://lab.example/edge") == "wss://lab.example/edge/ws/agent/"
    with pytest.raises(ConfigError, match="must be an http"):
        normalise_server("10.0.0.2:8000")
    with pytest.raises(ConfigError, match="--slowdown must be at least 1"):
        AgentConfig(enrolment=ENROLMENT, slowdown=0.5)


def test_data_address_defaults_to_the_interface_that_reaches_the_server() -> None:
    # a server on this machine: neighbours are local too
    assert local_address_towards("http://127.0.0.1:8000") == "127.0.0.1"
    assert local_address_towards("http://localhost:8000/") == "127.0.0.1"
    # a server elsewhere: the address of the interface on the route to it, never loopback
    routed = local_address_towards("http://192.0.2.10:8000")  # TEST-NET-1: never answered
    assert ipaddress.ip_address(routed) and not ipaddress.ip_address(routed).is_loopback
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as free:
        free.bind((routed, 0))  # it is one of this machine's addresses


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def test_cli_errors_name_the_problem(tmp_path: Path) -> None:
    result = run_cli("run", "--config", str(tmp_path / "none.json"))
    assert result.returncode == 2 and "no enrolment here" in result.stderr
    result = run_cli("enrol", "--server", "http://127.0.0.1:1", "--token", "t",
                     "--config", str(tmp_path / "a.json"))
    assert result.returncode == 2 and "cannot reach http://127.0.0.1:1" in result.stderr
    result = run_cli("profile", "--model", "mlp", "--dataset", "npz:/nope.npz",
                     env={"EDGEPIPE_DATA_DIR": ""})
    assert result.returncode == 2 and "npz:/nope.npz: " in result.stderr
    assert "pass --data-dir DIR" in result.stderr
    result = run_cli("profile", "--model", "mlp", "--dataset", "npz:nope.npz",
                     "--data-dir", str(tmp_path))
    assert result.returncode == 2
    assert "npz:nope.npz: no such file in this agent's data directory" in result.stderr
    for command in ("enrol", "run", "profile"):
        assert run_cli(command, "--help").returncode == 0


def test_the_console_script_is_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["edgepipe-agent"].partition(":")
    main = getattr(importlib.import_module(module), name)
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert all(command in shown for command in ("enrol", "run", "profile"))


def test_cli_profiles_a_model(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    result = run_cli("profile", "--model", "vgg5", "--repeats", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert len(json.loads(out.read_text())["layers"]) == 5


def test_worker_threads_set_their_own_torch_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: torch.set_num_threads in the main thread does not reach a new thread's
    # OpenMP team, and profiles taken on an agent's worker thread came out 80x too slow.
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr("agent.runtime.torch.set_num_threads",
                        lambda n: calls.append((threading.current_thread().name, n)))
    agent = AgentRuntime(AgentConfig(enrolment=ENROLMENT, threads=1), stop=threading.Event())
    try:
        agent.spawn(lambda: None, "profile-mlp").join(timeout=5)
    finally:
        agent.close()
    assert ("profile-mlp", 1) in calls


def test_an_agent_that_held_a_deployment_exits_when_it_stops() -> None:
    # the deployment's expiry timer kept the interpreter alive for DEPLOYMENT_TTL_S (300 s)
    script = """
import threading
from agent.config import AgentConfig, Enrolment
from agent.deployments import Deployment
from agent.runtime import AgentRuntime
from tests.agent.test_runtime import ENROLMENT, KEY, command, spec
agent = AgentRuntime(AgentConfig(enrolment=ENROLMENT), stop=threading.Event())
ack = agent.handle_command(command("deploy", run=7, spec=spec(),
                                   peers={"edge-other": "tcp://127.0.0.1:9"},
                                   keys={"edge-other": KEY}))
assert ack.ok, ack
agent.close()
print("closed")
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=90)
    assert done.returncode == 0 and "closed" in done.stdout, done.stderr


def test_resources_are_read_from_the_flag_and_said_in_the_hello() -> None:
    resources = parse_resources("cpu=1:0.5, gpu=2:4,npu=3")
    assert [(r.kind, r.speed, r.backward_speed) for r in resources] == [
        ("cpu", 1.0, 0.5), ("gpu", 2.0, 4.0), ("npu", 3.0, 3.0)]
    agent = AgentRuntime(AgentConfig(enrolment=ENROLMENT, resources=resources),
                         stop=threading.Event())
    plain = AgentRuntime(AgentConfig(enrolment=ENROLMENT), stop=threading.Event())
    try:
        assert agent.hello().to_json()["resources"] == [
            {"kind": "cpu", "speed": 1.0, "backward_speed": 0.5},
            {"kind": "gpu", "speed": 2.0, "backward_speed": 4.0},
            {"kind": "npu", "speed": 3.0, "backward_speed": 3.0}]
        assert "resources" not in plain.hello().to_json()  # without the flag, as before
    finally:
        agent.close()
        plain.close()


@pytest.mark.parametrize(("text", "says"), [
    ("cpu", "'cpu' (resource 0) is not kind=speed:backward_speed"),
    ("cpu=1:x", "is not kind=speed:backward_speed"),
    ("cpu=0:1", "resources[0].speed: must be above 0"),
    ("cpu=1:-1", "resources[0].backward_speed: must be above 0"),
    ("cpu=inf:1", "resources[0].speed: must be a finite number"),
    ("cpu=1:1,cpu=2:2", "resources[1].kind: is repeated"),
    ("GPU 0=1:1", "resources[0].kind: must be a short identifier"),
    (",".join(f"r{i}=1:1" for i in range(9)), "resources: must be a list of 1 to 8 items"),
])
def test_bad_resources_are_refused_naming_the_problem(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        parse_resources(text)
