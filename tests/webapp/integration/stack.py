"""Real processes for the integration tests: the ASGI server (daphne), Celery workers and
``manage.py`` commands, started with subprocess and driven over HTTP and WebSocket like a
browser and agents would."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.conftest import ROOT
from tests.webapp import testbed

PYTHON = sys.executable
# settings the parent's environment must not leak into a child's topology
TOPOLOGY_VARS = ("DATABASE_URL", "REDIS_URL", "REDIS_KEY_PREFIX", "DJANGO_SETTINGS_MODULE",
                 "SECRET_KEY", "EDGEPIPE_VAR_DIR", "CELERY_TASK_DEFAULT_QUEUE",
                 "CELERY_VISIBILITY_TIMEOUT_S")


def child_env(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in TOPOLOGY_VARS}
    return {**env, "PYTHONUNBUFFERED": "1", "LOG_LEVEL": "INFO", **settings}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def wait_until(check: Callable[[], Any], *, timeout: float, what: str,
               interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Processes:
    """Child processes, each in its own process group (so that SIGKILL takes a Celery worker
    with its pool), with their output in log files."""

    def __init__(self, logs: Path, env: dict[str, str]) -> None:
        self.logs, self.env = logs, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115  (closed with the process)
        proc = subprocess.Popen(args, cwd=ROOT, env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def wait_log(self, name: str, text: str, *, timeout: float) -> None:
        def seen() -> bool:
            if self.procs[name].poll() is not None:
                raise AssertionError(f"{name} exited ({self.procs[name].returncode}):\n"
                                     f"{self.log(name)[-3000:]}")
            return text in self.log(name)
        wait_until(seen, timeout=timeout, what=f"{text!r} in the {name} log")

    def web(self, port: int) -> None:
        self.start("web", [PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                           "webapp.asgi:application"])
        wait_until(lambda: listening(port), timeout=30, what=f"daphne on port {port}")

    def serve(self, port: int) -> None:
        """``manage.py serve``: daphne and a Celery worker (with beat), both ready."""
        self.start("serve", [PYTHON, "manage.py", "serve", "--port", str(port),
                             "--concurrency", "1"])
        wait_until(lambda: listening(port), timeout=60, what="manage.py serve to listen")
        self.wait_log("serve", " ready.", timeout=60)

    def worker(self, name: str) -> None:
        self.start(name, [PYTHON, "-m", "celery", "-A", "webapp", "worker", "--loglevel",
                          "INFO", "--concurrency", "1", "--hostname", f"{name}@%h",
                          "--without-gossip", "--without-mingle"])
        self.wait_log(name, " ready.", timeout=60)

    def kill(self, name: str) -> None:
        """SIGKILL the process and everything it started."""
        os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait(timeout=10)

    def stop_all(self) -> None:
        """SIGTERM each process (a Celery worker then shuts down warmly, ``serve`` stops its
        children), SIGKILL what is left of its group after a grace period."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([PYTHON, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout


def demo_admin_password(env: dict[str, str]) -> str:
    words = manage(env, "create_demo_admin").split()
    return words[words.index("password") + 1]


class Browser:
    """A logged-in user: a Django session and its CSRF token, as a browser holds them."""

    def __init__(self, base: str, username: str, password: str) -> None:
        self.base = base
        self.http = httpx.Client(base_url=base, timeout=30, trust_env=False)
        self.http.get("/api-auth/login/")
        answer = self.http.post("/api-auth/login/", data={
            "username": username, "password": password, "next": "/api/runs/",
            "csrfmiddlewaretoken": self.http.cookies["csrftoken"]}, headers={"Referer": base})
        assert answer.status_code == 302, answer.text[:500]

    def get(self, path: str) -> Any:
        answer = self.http.get(path)
        assert answer.status_code == 200, answer.text[:500]
        return answer.json()

    def post(self, path: str, body: dict[str, Any], *, expect: int) -> Any:
        answer = self.http.post(path, json=body,
                                headers={"X-CSRFToken": self.http.cookies["csrftoken"]})
        assert answer.status_code == expect, answer.text[:500]
        return answer.json()

    def wait_run(self, run_id: int, states: tuple[str, ...], *, timeout: float) -> Any:
        def done() -> Any:
            run = self.get(f"/api/runs/{run_id}/")
            return run if run["state"] in states else None
        return wait_until(done, timeout=timeout, what=f"run {run_id} to be {'/'.join(states)}",
                          interval=0.2)

    @contextmanager
    def listen(self, run_id: int) -> Iterator[RunPage]:
        """The run page's WebSocket, open for the block; its messages keep arriving on a
        thread."""
        ws_base = self.base.replace("http://", "ws://")
        with connect(f"{ws_base}/ws/runs/{run_id}/", origin=self.base, proxy=None,
                     additional_headers={
                         "Cookie": f"sessionid={self.http.cookies['sessionid']}"}) as ws:
            page = RunPage()
            reader = threading.Thread(target=page.read, args=(ws,), daemon=True)
            reader.start()
            yield page
        reader.join(timeout=5)


class RunPage:
    """What a run page received over its WebSocket."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def read(self, ws: ClientConnection) -> None:
        try:
            for message in ws:
                self.messages.append(json.loads(message))
        except ConnectionClosed:
            return

    def plans(self) -> list[dict[str, Any]]:
        return [m["plan"] for m in self.messages if m.get("type") == "plan"]


# --------------------------------------------------------------------------- testbeds


Device = tuple[dict[str, Any], dict[str, Any]]  # (enrol body without token, profile)


def resnet_testbed() -> tuple[dict[str, Any], list[Device]]:
    """The measured ResNet-101 testbed of data/profiles."""
    return testbed.SPEC, [({k: v for k, v in testbed.enrol_body(raw, "").items() if k != "token"},
                           testbed.device_profile(raw)) for raw in testbed.DEVICES]


def generated_testbed(*, seed: int, layers: int, devices: int
                      ) -> tuple[dict[str, Any], list[Device]]:
    """A large heterogeneous testbed: a ``layers``-layer model and ``devices`` devices whose
    measured times are the reference times over a speed from 0.05 to 2, with +-25% noise."""
    rng = random.Random(seed)
    spec = {"model": f"synthetic-{layers}", "dataset": "synthetic", "batch_size": 32}
    base = [{"name": f"block{i}", "kind": "conv", "forward_s": rng.uniform(0.002, 0.02),
             "backward_s": rng.uniform(0.004, 0.04),
             "output_bytes": rng.randint(50_000, 2_000_000),
             "param_bytes": rng.randint(10_000, 3_000_000),
             "activation_bytes": rng.randint(50_000, 2_000_000)} for i in range(layers)]
    out = []
    for d in range(devices):
        speed = rng.choice([0.05, 0.1, 0.3, 0.5, 1.0, 2.0])
        enrol = {"name": f"edge-{d}", "memory_bytes": 16 * 2**30,
                 "bandwidth_bps": rng.choice([2.5e6, 1.25e7, 1.25e8]),
                 "latency_s": rng.choice([0.001, 0.005]), "speed": speed,
                 "hardware": {"generated": True}}
        profile = {**spec, "reference": f"edge-{d}", "layers": [
            {**la, "forward_s": la["forward_s"] / speed * rng.uniform(0.8, 1.25),
             "backward_s": la["backward_s"] / speed * rng.uniform(0.8, 1.25)} for la in base]}
        out.append((enrol, profile))
    return spec, out


def enrol(browser: Browser, spec: dict[str, Any], devices: list[Device]
          ) -> tuple[int, list[dict[str, Any]]]:
    """Enrol the devices with one token and upload their profiles as their agents would; the
    model spec id and the enrolment answers."""
    token = browser.post("/api/enrollment-tokens/", {"max_uses": len(devices)},
                         expect=201)["token"]
    spec_id = browser.post("/api/model-specs/", spec, expect=201)["id"]
    agent = httpx.Client(base_url=browser.base, timeout=30, trust_env=False)
    enrolled = []
    for body, profile in devices:
        answer = agent.post("/api/agent/enrol/", json={**body, "token": token})
        assert answer.status_code == 201, answer.text[:500]
        device = answer.json()
        uploaded = agent.post("/api/agent/profiles/", json={"model_spec": spec_id,
                                                            "profile": profile},
                              headers={"Authorization": device["authorization"]})
        assert uploaded.status_code == 201, uploaded.text[:500]
        enrolled.append(device)
    return spec_id, enrolled


def plan_through_a_worker_kill(browser: Browser, processes: Processes,
                               plans: Callable[[int], Mapping[str, Mapping[str, Any]]], *,
                               algorithms: list[str], worker: str, replacement: str
                               ) -> tuple[dict[str, Any], float]:
    """Plan a run on a large generated testbed (12 devices, 600 layers: ``optimal`` takes
    seconds there), SIGKILL ``worker`` with its pool while it computes the plan of
    ``algorithms[0]``, start ``replacement``; the run once planning ended (its plan names the
    killed worker among its interruptions) and the seconds from the kill. ``plans(run_id)``
    reads the run's plans from the database by algorithm."""
    spec, devices = generated_testbed(seed=1, layers=600, devices=12)
    spec_id, enrolled = enrol(browser, spec, devices)
    run = browser.post("/api/runs/", {"name": "big", "model_spec": spec_id,
                                      "devices": [d["id"] for d in enrolled],
                                      "algorithms": algorithms, "microbatches": 8}, expect=201)
    browser.post(f"/api/runs/{run['id']}/plan/", {}, expect=202)
    slow = algorithms[0]
    wait_until(lambda: plans(run["id"])[slow]["status"] == "running", timeout=60,
               what=f"the worker to start the {slow} plan", interval=0.05)
    processes.kill(worker)
    killed_at = time.monotonic()
    time.sleep(0.5)
    interrupted = plans(run["id"])[slow]
    assert interrupted["status"] == "running" and interrupted["attempts"] == 1, (
        f"the {slow} plan finished before the worker was killed: make planning slower")
    assert browser.get(f"/api/runs/{run['id']}/")["state"] == "planning"
    processes.worker(replacement)
    planned = browser.wait_run(run["id"], ("planned", "failed"), timeout=180)
    # the run page's plans say which worker stopped on which attempt
    shown = {p["algorithm"]: p for p in browser.get(f"/api/runs/{run['id']}/plans/")}[slow]
    assert [(i["worker"].split("@")[0], i["attempt"]) for i in shown["interruptions"]] == [
        (worker, 1)], shown["interruptions"]
    return planned, time.monotonic() - killed_at
