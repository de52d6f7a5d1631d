"""A local testbed and the demo on it (USER_JOURNEYS.md, journey 1).

:class:`LocalTestbed` starts the real parts on this machine: the web server (daphne), a Celery
worker and a few `python -m agent run` processes emulating a heterogeneous testbed (slower
compute, slower links). It drives the server through its REST API like a browser would (in the
embedded setup only the web process can reach the agents' connections): the agents enrol with a
token, profile the model on command, runs are planned on the worker, started and watched. The
demo, the runtime benchmark and the integration tests all use it.

Agents keep their enrolment under ``<var>/demo/agents/``, so the next testbed with the same
agent names reuses the same devices.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from webapp.demo.client import ApiClient, DemoError, wait_for
from webapp.demo.processes import ProcessGroup
from webapp.demo.triggers import BatchTrigger, When, run_progress
from webapp.devices import services as device_services
from webapp.devices import supervision
from webapp.runs.models import Run
from webapp.runs.summaries import run_summary

FINAL_STATES = (Run.State.FINISHED, Run.State.FAILED, Run.State.CANCELLED)
SERVER_START_S = 90.0  # how long the agents wait for the web server they start beside
SUPERVISE_EVERY_S = 1.0  # how often the testbed looks after its agents (below SUPERVISOR_SILENT_S)


@dataclass(frozen=True)
class DemoAgent:
    """A local agent and the device it emulates."""

    name: str
    slowdown: float = 1.0
    bandwidth_mbps: float | None = None
    latency_ms: float = 0.0
    resources: str | None = None  # emulated compute resources (the agent's --resources)

    def describe(self) -> str:
        parts = [f"{self.slowdown:g}x slower" if self.slowdown > 1 else "fast"]
        if self.bandwidth_mbps is not None:
            parts.append(f"{self.bandwidth_mbps:g} Mbit/s link, {self.latency_ms:g} ms")
        if self.resources:
            parts.append(f"resources {self.resources}")
        return ", ".join(parts)


DEFAULT_AGENTS = (DemoAgent("demo-fast"), DemoAgent("demo-slow", slowdown=4.0),
                  DemoAgent("demo-slowlink", bandwidth_mbps=20.0, latency_ms=5.0))
DEFAULT_ALGORITHMS = ("ftpipehd", "optimal", "pipedream", "uniform", "pipetorch")


def ensure_demo_admin(*, username: str = "admin", email: str = "admin@localhost") -> str:
    """Create the demo superuser, or give it a new password; returns the password."""
    password = secrets.token_urlsafe(12)
    user, _ = get_user_model().objects.get_or_create(username=username,
                                                     defaults={"email": email})
    user.is_staff = user.is_superuser = user.is_active = True
    user.set_password(password)
    user.save()
    return password


# how much lower the CPU priority of the testbed's web servers and workers is than its agents':
# on one machine the agents' training comes first, and the server takes the time they leave
# (on two cores, at the agents' priority the web server slowed the first stage of a two-stage
# VGG-5 by 13-16% and its throughput by 15-20%: docs/benchmarks.md, "The server's priority")
SERVER_NICE = 10


class LocalTestbed:
    """The web server, a planning worker and local agents, for as long as the ``with`` lasts."""

    def __init__(self, *, agents: Sequence[DemoAgent] = DEFAULT_AGENTS,
                 host: str = "127.0.0.1", port: int = 8000,
                 say: Callable[[str], None] = print, more_web_ports: Sequence[int] = (),
                 workers: int = 1, server_nice: int = SERVER_NICE) -> None:
        """``more_web_ports``: web processes beside the one on ``port`` (the agents connect to
        them in turn; a shared channel layer and database make them one server), and
        ``workers`` Celery workers (one runs beat); ``server_nice``: how much lower than the
        agents' the web servers' and workers' CPU priority is (0: the same)."""
        self.agents = tuple(agents)
        self.url = f"http://{host}:{port}"
        self.host, self.port, self.say = host, port, say
        self.web_ports = (port, *more_web_ports)
        self.workers = workers
        if server_nice < 0:
            raise DemoError(f"server_nice must be at least 0, got {server_nice}")
        self.server_nice = server_nice
        self.dir = Path(settings.VAR_DIR) / "demo"
        self.processes = ProcessGroup(log_dir=self.dir / "logs")
        self.api = ApiClient(self.url)
        self.username = "admin"
        self.password = ""
        self.devices: list[dict[str, Any]] = []
        self.triggers: list[threading.Timer | BatchTrigger] = []  # stopped when it stops
        self.progress: Callable[[int], tuple[str, int]] = run_progress  # what triggers read
        self.supervisor = f"manage.py demo (pid {os.getpid()}) on {socket.gethostname()}"
        self._supervised_at = -math.inf
        self._stopped: set[str] = set()  # agents whose stop was said

    def __enter__(self) -> LocalTestbed:
        call_command("migrate", interactive=False, verbosity=0)
        self.password = ensure_demo_admin(username=self.username)
        try:
            # the agents start once the web server answers, and start up (import torch,
            # probe their fixed costs) while the demo logs in: started with the web server
            # instead, on two cores they slowed its start-up as much as they overlapped it
            self._start_servers()
            for port in self.web_ports:
                ApiClient(f"http://{self.host}:{port}").wait_until_up()
            self._start_agents()
            self.api.login(self.username, self.password)
            self.say(f"EdgePipe dashboard on {self.url}/ (log in as {self.username} / "
                     f"{self.password})")
            self.say("starting agents: " + "; ".join(f"{a.name} ({a.describe()})"
                                                      for a in self.agents))
            self.devices = self._devices_online(self._enrolled_uids())
        except BaseException:
            self.processes.stop_all()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        for trigger in self.triggers:
            trigger.cancel()
        self.processes.stop_all()

    # ---- processes

    def _start_servers(self) -> None:
        with socket.socket() as probe:
            if probe.connect_ex((self.host, self.port)) == 0:
                raise DemoError(f"{self.host}:{self.port} is taken: another server (an earlier "
                                "demo?) listens there; stop it, or choose another --port")
        python = sys.executable
        # beat keeps its schedule there (the embedded settings make the directory; with Redis
        # nothing did, and beat stopped with FileNotFoundError)
        Path(settings.CELERY_BEAT_SCHEDULE_FILENAME).parent.mkdir(parents=True, exist_ok=True)
        for k, port in enumerate(self.web_ports):
            self.processes.start("web" if k == 0 else f"web-{k + 1}", [
                python, "-m", "daphne", "-b", self.host, "-p", str(port),
                "webapp.asgi:application"], nice=self.server_nice)
        for k in range(self.workers):
            self.processes.start("worker" if k == 0 else f"worker-{k + 1}", [
                python, "-m", "celery", "-A", "webapp", "worker", "--loglevel", "INFO",
                "--concurrency", "1", "--hostname", f"worker{k + 1}@%h",
                *(["--beat", "--schedule", settings.CELERY_BEAT_SCHEDULE_FILENAME]
                  if k == 0 else [])], nice=self.server_nice)

    def agent_config(self, agent: DemoAgent) -> Path:
        return self.dir / "agents" / f"{agent.name}.json"

    def agent_process(self, agent: DemoAgent) -> str:
        return f"agent-{agent.name}"

    def _start_agents(self) -> None:
        """Start every agent (enrolling those without an enrolment)."""
        missing = [a for a in self.agents if not self.agent_config(a).exists()]
        token = None
        if missing:
            admin = get_user_model().objects.get(username=self.username)
            _, token = device_services.enrollment_token_create(
                created_by=admin, label="local testbed agents", max_uses=len(missing))
        for agent in self.agents:
            self._start_agent(agent, token=token if agent in missing else None)

    def _enrolled_uids(self) -> list[str]:
        return [wait_for(lambda a=a: self._enrolled_uid(a), timeout_s=60,
                         what=f"agent {a.name} to enrol") for a in self.agents]

    def _start_agent(self, agent: DemoAgent, *, token: str | None) -> None:
        """Start the agent's process (again: it keeps its enrolment in its config file); the
        agents connect to the web processes in turn."""
        k = self.agents.index(agent)
        server = f"http://{self.host}:{self.web_ports[k % len(self.web_ports)]}"
        command = [sys.executable, "-m", "agent", "run", "--config",
                   str(self.agent_config(agent)), "--server", server,
                   "--name", agent.name, "--threads", "1",
                   "--wait-for-server", str(SERVER_START_S),
                   "--slowdown", str(agent.slowdown), "--latency-ms", str(agent.latency_ms)]
        if token is not None:
            command += ["--token", token]
        if agent.bandwidth_mbps is not None:
            command += ["--bandwidth-mbps", str(agent.bandwidth_mbps)]
        if agent.resources:
            command += ["--resources", agent.resources]
        self.processes.start(self.agent_process(agent), command)

    def _enrolled_uid(self, agent: DemoAgent) -> str | None:
        self.check_children()
        try:
            return str(json.loads(self.agent_config(agent).read_text())["uid"])
        except (OSError, ValueError, KeyError):
            return None

    def check_children(self) -> None:
        """The servers must keep running; an agent may stop (*Stop agent* on the run page, a
        crash): the testbed says so once, and starts it again when asked from the browser
        (*Restart agent*), its device rejoining the run at the next re-partition."""
        exited = self.processes.exited(among=lambda name: not name.startswith("agent-"))
        if exited is not None:
            raise DemoError(f"{exited.name} stopped unexpectedly; its log ends with:\n"
                            f"{self.processes.tail(exited.name)}")
        if self.devices:
            self._supervise()

    def _supervise(self) -> None:
        """Say which agents stopped, mark the devices supervised, take restarts asked for;
        at most every SUPERVISE_EVERY_S."""
        now = time.monotonic()
        if now - self._supervised_at < SUPERVISE_EVERY_S:
            return
        self._supervised_at = now
        for agent in self.agents:
            name = self.agent_process(agent)
            if self.processes.running(name):
                self._stopped.discard(agent.name)
            elif agent.name not in self._stopped:
                self._stopped.add(agent.name)
                self.say(f"agent {agent.name} stopped; Restart agent on its row of the run "
                         "page starts it again")
        uids = {d["uid"]: d["name"] for d in self.devices}
        supervision.devices_supervise(uids=list(uids), supervisor=self.supervisor)
        for uid in supervision.restarts_take(uids=list(uids)):
            agent = self.agent_named(uids[uid])
            if self.processes.running(self.agent_process(agent)):
                continue
            self.say(f"restarting agent {agent.name}, as asked from the browser")
            self._start_agent(agent, token=None)

    def _devices_online(self, uids: Sequence[str]) -> list[dict[str, Any]]:
        """The agents' devices once each has sent a heartbeat to this server (a status left
        from an earlier server is not enough)."""
        since = timezone.now()

        def online() -> list[dict[str, Any]] | None:
            self.check_children()
            by_uid = {d["uid"]: d for d in self.api.get("/api/devices/")}
            ready = [by_uid.get(uid) for uid in uids]
            if all(d is not None and d["status"] in ("online", "busy")
                   and d["last_heartbeat_at"] is not None
                   and parse_datetime(d["last_heartbeat_at"]) > since for d in ready):
                return [d for d in ready if d is not None]
            return None

        found: list[dict[str, Any]] = wait_for(online, timeout_s=90,
                                               what="the agents to connect")
        return found

    # ---- what a user does

    def measure_links(self, devices: Sequence[dict[str, Any]] | None = None) -> list[Any]:
        """Have the agents measure the links among them; the measured links."""
        chosen = list(devices or self.devices)
        started = timezone.now()
        asked = self.api.post("/api/links/", {"devices": [d["id"] for d in chosen]})["devices"]
        pairs = len(asked) * (len(asked) - 1)

        def measured() -> list[Any] | None:
            self.check_children()
            links = [li for li in self.api.get("/api/links/")
                     if li["source"] in asked and li["target"] in asked
                     and parse_datetime(li["measured_at"]) > started]
            return links if len(links) >= pairs else None

        found: list[Any] = wait_for(measured, timeout_s=120, what="the links to be measured")
        return found

    def model_spec(self, *, model: str, dataset: str, batch_size: int,
                   devices: Sequence[dict[str, Any]] | None = None) -> int:
        """The model spec, with a profile from every device (asking those that lack one). The
        emulated devices share this machine's processors, so they profile one at a time, each
        measured alone as it would be on its own hardware."""
        spec = int(self.api.post("/api/model-specs/", {
            "model": model, "dataset": dataset, "batch_size": batch_size})["id"])
        for device in devices or self.devices:
            query = f"/api/profiles/?device={device['id']}&model_spec={spec}"
            if self.api.get(query):
                continue
            self.say(f"  {device['name']} profiles {model} ...")
            self.api.post(f"/api/devices/{device['id']}/profile/", {"model_spec": spec})
            wait_for(lambda q=query: self.check_children() or self.api.get(q), timeout_s=300,
                     what=f"{device['name']}'s profile of {model}")
        return spec

    def plan(self, spec: int, *, devices: Sequence[dict[str, Any]], name: str,
             algorithms: Sequence[str], schedule: str, microbatches: int,
             batches: int, repartition_every: int | None = None,
             repartition_after: int | None = None,
             chain_every: int | None = None, global_every: int | None = None,
             lr: float | None = None, momentum: float | None = None,
             vertical_sync: bool | None = None,
             aggregate_every: int | None = None) -> dict[str, Any]:
        """Create a run and plan it with every algorithm; returns the plans' comparison.
        ``repartition_every``, ``chain_every`` and ``global_every`` (batches; 0: off),
        ``repartition_after`` (batches before the first re-partition check), ``lr`` and
        ``momentum`` (SGD's), ``vertical_sync`` and ``aggregate_every`` (1F1B's) override the
        run's defaults."""
        payload: dict[str, Any] = {
            "name": name, "model_spec": spec, "devices": [d["id"] for d in devices],
            "algorithms": list(algorithms), "schedule": schedule,
            "microbatches": microbatches, "batches": batches, "epochs": 1}
        for setting, value in (("repartition_every", repartition_every),
                               ("repartition_after", repartition_after),
                               ("chain_every", chain_every), ("global_every", global_every),
                               ("lr", lr), ("momentum", momentum),
                               ("vertical_sync", vertical_sync),
                               ("aggregate_every", aggregate_every)):
            if value is not None:
                payload[setting] = value
        run = self.api.post("/api/runs/", payload)
        self.api.post(f"/api/runs/{run['id']}/plan/")
        planned = self.wait_state(run["id"], (Run.State.PLANNED, Run.State.FAILED), 300)
        if planned["state"] != Run.State.PLANNED:
            raise DemoError(f"planning failed: {planned['error']}")
        compared: dict[str, Any] = self.api.get(f"/api/runs/{run['id']}/plans/compare/")
        compared["run"] = run["id"]
        return compared

    def start(self, run_id: int, plan_id: int | None = None) -> dict[str, Any]:
        self.api.post(f"/api/runs/{run_id}/start/", {} if plan_id is None else {"plan": plan_id})
        started: dict[str, Any] = self.wait_state(run_id, (Run.State.RUNNING, *FINAL_STATES), 120)
        if started["state"] != Run.State.RUNNING:
            raise DemoError(f"run {run_id} did not start: {started['error']}")
        return started

    def agent_of_stage(self, run_id: int, plan_id: int, stage: int | None = None) -> DemoAgent:
        """The agent whose device holds ``stage`` of the run's plan (default: the middle stage,
        the first device of stage len // 2)."""
        plans = self.api.get(f"/api/runs/{run_id}/plans/")
        document = next((p["document"] for p in plans if p["id"] == plan_id), None)
        if not document or not document.get("stages"):
            raise DemoError(f"plan {plan_id} of run {run_id} has no stages")
        stages = document["stages"]
        uid = stages[len(stages) // 2 if stage is None else stage]["devices"][0]
        by_uid = {d["uid"]: a for d, a in zip(self.devices, self.agents, strict=True)}
        if uid not in by_uid:
            raise DemoError(f"device {uid} of plan {plan_id} is not one of this testbed's")
        return by_uid[uid]

    def agent_named(self, name: str) -> DemoAgent:
        found = next((a for a in self.agents if a.name == name), None)
        if found is None:
            raise DemoError(f"no agent named {name!r}; the agents: "
                            f"{', '.join(a.name for a in self.agents)}")
        return found

    def at_run_time(self, run_id: int, at_s: float, action: Callable[[], None]
                    ) -> threading.Timer:
        """Do ``action`` ``at_s`` seconds into the run (its clock starts at the run's
        ``started_at``), on a timer thread the testbed cancels when it stops."""
        run = self.api.get(f"/api/runs/{run_id}/")
        started = parse_datetime(run["started_at"]) if run.get("started_at") else None
        elapsed = (timezone.now() - started).total_seconds() if started else 0.0
        timer = threading.Timer(max(0.0, at_s - elapsed), action)
        timer.daemon = True
        timer.start()
        self.triggers.append(timer)
        return timer

    def after_batches(self, run_id: int, when: When, action: Callable[[], None]
                      ) -> BatchTrigger:
        """Do ``action`` once the run has trained ``when.batches`` batches (self.progress) and,
        with ``when.paused``, is paused, on a trigger thread the testbed stops when it stops.
        A run that ends first makes the trigger give up, and say so."""
        if when.batches is None:
            raise ValueError(f"{when} is not in batches")
        batches = when.batches

        def look() -> bool:
            state, trained = self.progress(run_id)
            if state in FINAL_STATES:
                self.say(f"run {run_id} ended ({state}): nothing comes {when.describe()}")
                return True
            if trained < batches or (when.paused and state != Run.State.PAUSED):
                return False
            action()
            return True

        trigger = BatchTrigger(look)
        self.triggers.append(trigger)
        trigger.start()
        return trigger

    def at(self, run_id: int, when: When, action: Callable[[], None]) -> threading.Thread:
        """Do ``action`` at ``when``: at_run_time or after_batches."""
        if when.seconds is not None:
            return self.at_run_time(run_id, when.seconds, action)
        return self.after_batches(run_id, when, action)

    def kill_agent_at(self, run_id: int, agents: Sequence[DemoAgent], when: When
                      ) -> threading.Thread:
        """Kill the ``agents``' processes with SIGKILL (devices that lose power) at ``when``,
        all at once. Their exit is expected: check_children does not fail the demo for it."""

        def kill() -> None:
            self.say(f"killing {', '.join(a.name for a in agents)} (SIGKILL) "
                     f"{when.describe(f'run {run_id}')}")
            for agent in agents:
                self.processes.kill(self.agent_process(agent))

        return self.at(run_id, when, kill)

    def pause_at(self, run_id: int, when: When, for_s: float) -> threading.Thread:
        """Pause the run at ``when`` and resume it ``for_s`` seconds later, as a user does on
        the run page. A recovery under way at either moment ends first (a recovering run is
        paused when its recovery ends), so the resume waits for the run to be paused."""

        def pause_then_resume() -> None:
            try:
                self.say(f"pausing run {run_id} {when.describe('it')}, for {for_s:g} s")
                self.api.post(f"/api/runs/{run_id}/pause/")
                time.sleep(for_s)
                paused = self.wait_state(run_id, (Run.State.PAUSED, *FINAL_STATES), 120)
                if paused["state"] == Run.State.PAUSED:
                    self.say(f"resuming run {run_id}")
                    self.api.post(f"/api/runs/{run_id}/start/")
            except DemoError as exc:  # the run ended first, say: the demo goes on
                self.say(f"could not pause and resume run {run_id}: {exc}")

        return self.at(run_id, when, pause_then_resume)

    def slow_agent_at(self, run_id: int, agent: DemoAgent, at_s: float, slowdown: float
                      ) -> threading.Timer:
        """``at_s`` seconds into the run, make the agent's device ``slowdown`` times slower
        than this machine (a device heating up: POST /api/devices/<id>/emulate/)."""
        device = next(d for d in self.devices if d["name"] == agent.name)

        def slow() -> None:
            self.say(f"slowing {agent.name} down to {slowdown:g}x {at_s:g} s into run {run_id}")
            self.api.post(f"/api/devices/{device['id']}/emulate/", {"slowdown": slowdown})

        return self.at_run_time(run_id, at_s, slow)

    def finish(self, run_id: int, *, timeout_s: float = 900.0) -> dict[str, Any]:
        """Wait for the run to end; its summary (runs.summaries.run_summary)."""
        final = self.wait_state(run_id, FINAL_STATES, timeout_s)
        return run_summary(run=Run.objects.get(pk=final["id"]))

    def wait_state(self, run_id: int, states: Sequence[str], timeout_s: float) -> Any:
        def reached() -> Any:
            self.check_children()
            run = self.api.get(f"/api/runs/{run_id}/")
            return run if run["state"] in states else None

        return wait_for(reached, timeout_s=timeout_s,
                        what=f"run {run_id} to become {' or '.join(states)}")


def chosen_plan(compared: dict[str, Any], plan: str) -> dict[str, Any]:
    """The comparison's row of ``plan`` ("best" or an algorithm), refusing one that does not
    fit in memory."""
    rows = compared["rows"]
    row = (next((r for r in rows if r["plan"] == compared["best"]), None) if plan == "best"
           else next((r for r in rows if r["algorithm"] == plan), None))
    if row is None:
        raise DemoError(f"no {plan} plan among {', '.join(r['algorithm'] for r in rows)}")
    if not row["memory_ok"] or row["status"] != "done":
        why = row["error"] or "it does not fit in memory"
        raise DemoError(f"the {row['algorithm']} plan cannot run: {why}")
    return dict(row)
