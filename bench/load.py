"""Load benchmark of the agents' gateway: many simulated agents on one or several web processes.

    .venv/bin/python bench/load.py [--agents 100,200,500] [--webs 1,2] [--seconds 30]
                                   [--events-per-s 1000] [--runs 4] [--run-devices 4]

Each scenario (a number of web processes, a number of agents) starts that many daphne processes
on a throwaway PostgreSQL database and the Redis channel layer (a key prefix of its own; both
dropped at the end). Agents enrol over REST with a token (once; later scenarios reuse their
keys) and open the agents' WebSocket (``ws/agent/``, ``Authorization: Device uid:key``) on the
web processes in turn, then ``hello``, ``welcome``, ``link`` as agent/connection.py does: asyncio
coroutines on ``websockets`` in this process, so that hundreds fit.

For ``--seconds`` each agent sends a ``heartbeat`` every ``--heartbeat-s`` (phases spread
evenly), then a ``ping``: the server answers nothing to a heartbeat but handles a connection's
messages in order, so the ``pong`` answers the heartbeat (latency: from sending it to the pong;
real agents ping only when they connect). The first ``--runs`` x ``--run-devices`` agents are
the devices of running runs and stream timeline events, ``--events-per-s`` in all, in numbered
``events`` batches every 0.1 s as agents flush them (each answered with ``stored``). Each run's
page has ``--pages`` logged-in browser sockets (``ws/runs/<id>/``, spread over the web
processes); an event's latency is from its batch leaving the agent to its arrival there.

Then it waits (``--drain-s``) for every answer and every event on every page: what never came
was dropped. CPU (cores over the window, from /proc): the web processes, PostgreSQL's and Redis's
(other users' too), this process, and ``other``: the machine's busy time less those. Prints a
table, then one JSON line; exits 1 if anything was dropped or refused, keeping the servers' logs.
"""
from __future__ import annotations

import abc
import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.live import percentile  # noqa: E402  (the path above makes it importable)
from bench.testbed import free_port  # noqa: E402
from orchestrator.protocol import PROTOCOL  # noqa: E402

POSTGRES_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
CONNECT_CONCURRENCY = 16  # WebSocket handshakes in flight
FLUSH_S = 0.1  # how often an agent sends its events (agent.config.AgentConfig.flush_s)
DATA_KEY = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"  # any 40 Z85 characters will do
TICK_S = os.sysconf("SC_CLK_TCK")

# ----------------------------------------------------------------------------- the clients


class Socket(abc.ABC):
    """A WebSocket of the bench's, read until it closes: ``closed`` if the server closed it (or
    it broke) before the bench did."""

    ws: Any
    closed = leaving = False

    async def opened(self, url: str, first: str, **options: Any) -> dict[str, Any]:
        """Connect; the first message, which must be of type ``first``."""
        from websockets.asyncio.client import connect

        self.ws = await connect(url, proxy=None, open_timeout=120, max_size=2**26, **options)
        await self.greet()
        reply: dict[str, Any] = json.loads(await asyncio.wait_for(self.ws.recv(), 120))
        if reply.get("type") != first:
            raise RuntimeError(f"{url}: the first message was {reply}, not {first}")
        return reply

    async def read(self) -> None:
        with contextlib.suppress(Exception):
            async for raw in self.ws:
                self.received(time.time(), json.loads(raw))
        self.closed = not self.leaving

    async def greet(self) -> None:  # noqa: B027  (a page says nothing first)
        """What this socket says first: nothing, unless a kind of socket says otherwise."""

    @abc.abstractmethod
    def received(self, now: float, message: dict[str, Any]) -> None:
        """Take a message that arrived at ``now`` (wall clock)."""

    async def close(self) -> None:
        self.leaving = True
        with contextlib.suppress(Exception):
            await self.ws.close()


class SimAgent(Socket):
    """One simulated agent: its heartbeats and, when in a run, its events."""

    def __init__(self, spec: dict[str, Any], conf: dict[str, Any]) -> None:
        self.spec, self.conf = spec, conf
        self.heartbeats: dict[int, float] = {}  # unanswered: id -> sent at
        self.batches: dict[int, float] = {}  # unstored: seq -> sent at
        self.hb_ms: list[float] = []  # from a heartbeat to its answer
        self.ack_ms: list[float] = []  # from an events batch to its stored
        self.lag_ms: list[float] = []  # how late a heartbeat left (the bench's own load)
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()

    async def connect(self) -> None:
        await self.opened(self.spec["url"], "welcome", additional_headers={
            "Authorization": f"Device {self.spec['uid']}:{self.spec['key']}"})
        await self.ws.send(json.dumps({"type": "link", "latency_s": 0.001,
                                       "bandwidth_bps": 1.25e8}))
        self.reader = asyncio.create_task(self.read())

    async def greet(self) -> None:
        await self.ws.send(json.dumps({
            "type": "hello", "protocol": PROTOCOL,
            "data_address": f"tcp://127.0.0.1:{self.spec['port']}",
            "data_key": DATA_KEY, "hardware": {"system": "Linux", "cpus": 4}}))

    def received(self, now: float, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "pong" and message.get("id") in self.heartbeats:
            self.hb_ms.append(1e3 * (now - self.heartbeats.pop(message["id"])))
        elif kind == "stored" and message.get("seq") in self.batches:
            self.ack_ms.append(1e3 * (now - self.batches.pop(message["seq"])))
            self.counts["stored"] += message["timeline"]
        elif kind == "error":
            self.errors[f"{message.get('in_reply_to')}: {message.get('detail')}"[:160]] += 1
            if message.get("in_reply_to") == "events" and self.batches:  # the oldest, refused
                self.batches.pop(min(self.batches))

    async def heartbeat(self, t0: float, end: float) -> None:
        period, k = self.conf["heartbeat_s"], 0
        beat = json.dumps({"type": "heartbeat", "status": "busy" if self.spec["run"] else
                           "online", "load": {"loadavg_1m": os.getloadavg()[0]}})
        while (at := t0 + (self.spec["phase"] + k) * period) < end:
            await asyncio.sleep(max(0.0, at - time.time()))
            self.heartbeats[k] = sent = time.time()
            self.lag_ms.append(1e3 * (sent - at))
            self.counts["heartbeats"] += 1
            await self.ws.send(beat)
            await self.ws.send(json.dumps({"type": "ping", "id": k}))
            k += 1

    async def stream(self, t0: float, end: float) -> None:
        spec, rate = self.spec, self.conf["events_per_agent_s"]
        stream, seq, k, owed, microbatch = secrets.token_hex(8), 0, 0, 0.0, 0
        while spec["run"] and (at := t0 + (spec["phase"] + k) * FLUSH_S) < end:
            await asyncio.sleep(max(0.0, at - time.time()))
            owed, k = owed + rate * FLUSH_S, k + 1
            if (count := int(owed)) == 0:
                continue
            owed, seq, now = owed - count, seq + 1, time.time()
            clock = now - spec["started_at"]  # the run's clock: seconds since it started
            # in columns, as agents send them (orchestrator.eventcolumns)
            columns = {"stage": [spec["stage"]] * count,
                       "kind": [("forward", "backward")[(microbatch + j) % 2]
                                for j in range(count)],
                       "microbatch": list(range(microbatch, microbatch + count)),
                       "version": [0] * count, "start": [clock - 1e-4] * count,
                       "end": [clock] * count}
            microbatch += count
            self.batches[seq] = now
            self.counts["events"] += count
            await self.ws.send(json.dumps({"type": "events", "run": spec["run"],
                                           "timeline_columns": columns, "stream": stream,
                                           "seq": seq}))


class Page(Socket):
    """A run page's socket, as a logged-in browser opens it: counts each timeline event once."""

    def __init__(self, spec: dict[str, Any], conf: dict[str, Any]) -> None:
        self.spec, self.conf = spec, conf
        self.seen: set[tuple[str, int]] = set()
        self.latency_ms: list[float] = []

    async def connect(self) -> None:
        await self.opened(self.spec["url"], "snapshot", origin=self.conf["origin"],
                          additional_headers={"Cookie": self.conf["cookie"]})
        self.reader = asyncio.create_task(self.read())

    def expected(self, agents: list[SimAgent]) -> int:
        return sum(a.counts["events"] for a in agents if a.spec["run"] == self.spec["run"])

    def received(self, now: float, message: dict[str, Any]) -> None:
        for event in message["events"] if message.get("type") == "timeline" else ():
            key = (event["device"], event["microbatch"])
            if key not in self.seen:
                self.seen.add(key)
                self.latency_ms.append(1e3 * (now - self.spec["started_at"] - event["end"]))


async def simulate(name: str, agents: list[SimAgent], pages: list[Page], *, seconds: float,
                   drain_s: float, window: CpuWindow, finish: Callable[[], object]
                   ) -> dict[str, float]:
    """Connect the pages, then the agents; drive the agents for ``seconds`` (the CPU window);
    wait for every answer, then for the pages to see every event; ``finish`` (the runs, so
    that disconnecting fails none), and close. Returns the cores used in the window."""
    from tqdm import tqdm

    async def until(done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + drain_s
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    with tqdm(total=len(agents) + len(pages), desc=f"{name}: connecting",
              file=sys.stderr) as bar:
        async def connect(who: SimAgent | Page) -> None:
            async with gate:
                await who.connect()
            bar.update()

        await asyncio.gather(*(connect(p) for p in pages))  # first: they see every event
        await asyncio.gather(*(connect(a) for a in agents))
    t0 = time.time() + 1.0
    end = t0 + seconds

    async def measure() -> dict[str, float]:
        await asyncio.sleep(t0 - time.time())
        window.start()
        for _ in tqdm(range(math.ceil(seconds)), desc=f"{name}: measuring", file=sys.stderr):
            await asyncio.sleep(max(0.0, min(1.0, end - time.time())))
        return window.stop()

    cores, *_ = await asyncio.gather(measure(), *(a.heartbeat(t0, end) for a in agents),
                                     *(a.stream(t0, end) for a in agents))
    print(f"{name}: waiting up to {drain_s:.0f} s for the answers, then as long for the pages'"
          " events", file=sys.stderr, flush=True)
    await until(lambda: not any(a.heartbeats or a.batches for a in agents))
    await until(lambda: all(len(p.seen) >= p.expected(agents) for p in pages))
    await asyncio.to_thread(finish)
    await asyncio.gather(*(who.close() for who in [*agents, *pages]))
    return cast(dict[str, float], cores)


# ----------------------------------------------------------------------------- CPU from /proc


def cpu_by_pid(pids: list[int]) -> dict[int, float]:
    """User + system CPU seconds of each of ``pids`` still running."""
    used = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            used[pid] = (int(fields[11]) + int(fields[12])) / TICK_S
    return used


def pids_named(name: str) -> list[int]:
    def named(entry: Path) -> bool:
        with contextlib.suppress(OSError):
            return entry.name.isdigit() and (entry / "comm").read_text().strip() == name
        return False

    return [int(entry.name) for entry in Path("/proc").iterdir() if named(entry)]


def machine_busy_s() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat: all but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / TICK_S


class CpuWindow:
    """Cores each group of processes used between ``start`` and ``stop``: a process that
    started or ended meanwhile (a PostgreSQL backend) counts for what /proc saw of it."""

    def __init__(self, groups: dict[str, Callable[[], list[int]]]) -> None:
        self.groups = groups

    def start(self) -> None:
        self.at, self.busy = time.monotonic(), machine_busy_s()
        self.before = {g: cpu_by_pid(pids()) for g, pids in self.groups.items()}

    def stop(self) -> dict[str, float]:
        wall, busy = time.monotonic() - self.at, machine_busy_s() - self.busy
        cores = {g: sum(s - self.before[g].get(p, 0.0) for p, s in cpu_by_pid(
            [*self.before[g], *pids()]).items()) / wall for g, pids in self.groups.items()}
        cores["other"] = busy / wall - sum(cores.values())
        return {g: round(c, 2) for g, c in cores.items()}


# ----------------------------------------------------------------------------- the server side


@contextlib.contextmanager
def shared_topology(redis_url: str, var_dir: Path) -> Iterator[str]:
    """Django on a throwaway PostgreSQL database and a Redis key prefix of its own, set in
    this process's environment (the web processes inherit it); dropped and deleted after."""
    import psycopg
    import redis

    name = f"edgepipe_load_{secrets.token_hex(5)}"
    prefix = f"edgepipe-load-{name[-10:]}"
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    os.environ.update(
        DJANGO_SETTINGS_MODULE="webapp.settings.production", SECRET_KEY=secrets.token_hex(32),
        DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{name}", REDIS_URL=redis_url,
        REDIS_KEY_PREFIX=prefix, CELERY_TASK_DEFAULT_QUEUE=prefix, DEBUG="false",
        EDGEPIPE_VAR_DIR=str(var_dir), PYTHONUNBUFFERED="1")
    try:
        import django

        os.chdir(ROOT)
        django.setup()
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per enrolment
        yield name
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)


def enrol(count: int, urls: list[str], have: list[dict[str, Any]]) -> None:
    """Enrol devices over REST (``POST /api/agent/enrol/`` with a token) until ``have`` holds
    ``count``, on the web processes in turn: one at a time (Django under ASGI keeps a database
    connection per request thread for CONN_MAX_AGE: 8 enrolments at once reached PostgreSQL's
    100 connections)."""
    import httpx
    from tqdm import tqdm

    from webapp.devices.services import enrollment_token_create

    if count <= len(have):
        return
    _, token = enrollment_token_create(created_by=None, label="bench/load.py",
                                       max_uses=count - len(have))
    with httpx.Client(timeout=60, trust_env=False) as http:
        for k in tqdm(range(len(have), count), desc="enrolling", file=sys.stderr):
            answer = http.post(f"{urls[k % len(urls)]}/api/agent/enrol/", json={
                "token": token, "name": f"load-{k}", "memory_bytes": 2**30,
                "bandwidth_bps": 1.25e8})
            if answer.status_code != 201:
                raise RuntimeError(f"enrolment answered {answer.status_code}: {answer.text[:300]}")
            have.append(answer.json())


def running_runs(devices: list[dict[str, Any]], size: int) -> list[tuple[int, float]]:
    """Runs of ``size`` devices each, as a deployment leaves them running (no agent trains:
    the simulated ones report events); (id, start in epoch seconds) of each."""
    from django.utils import timezone

    from webapp.devices.models import Device
    from webapp.devices.services import model_spec_get_or_create
    from webapp.runs.models import Run, RunDevice
    from webapp.runs.services import run_create

    spec, _ = model_spec_get_or_create(model="mlp", dataset="digits", batch_size=32)
    by_uid = {d.uid: d for d in Device.objects.filter(uid__in=[d["uid"] for d in devices])}
    runs = []
    for first in range(0, len(devices), size):
        members = [by_uid[d["uid"]] for d in devices[first:first + size]]
        run = run_create(name=f"bench/load.py {first // size}", model_spec=spec,
                         devices=members, algorithms=["ftpipehd"], repartition_every=0)
        for k, device in enumerate(members):
            RunDevice.objects.filter(run=run, device=device).update(
                stage=k, stage_state=RunDevice.StageState.RUNNING)
        started = timezone.now()
        Run.objects.filter(pk=run.pk).update(state=Run.State.RUNNING, started_at=started)
        runs.append((run.pk, started.timestamp()))
    return runs


def scenario(args: argparse.Namespace, webs: int, count: int, devices: list[dict[str, Any]],
             var_dir: Path, password: str) -> dict[str, Any]:
    """Start ``webs`` web processes, connect ``count`` agents and the pages, measure."""
    from webapp.demo.client import ApiClient
    from webapp.demo.processes import ProcessGroup
    from webapp.runs.models import Run

    name = f"{webs}w-{count}a"
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(webs)]
    processes = ProcessGroup(log_dir=var_dir / "logs" / name)
    try:
        for k, url in enumerate(urls):
            processes.start(f"web-{k + 1}", [sys.executable, "-m", "daphne", "-b", "127.0.0.1",
                                             "-p", url.rsplit(":", 1)[1],
                                             "webapp.asgi:application"])
        for url in urls:
            ApiClient(url).wait_until_up()
        webs_pids = [c.process.pid for c in processes.children.values() if c.process]
        print(f"{name}: web processes {webs_pids}", file=sys.stderr)
        enrol(count, urls, devices)
        streaming = min(count, args.runs * args.run_devices)
        runs = running_runs(devices[:streaming], args.run_devices)
        api = ApiClient(urls[0])
        api.login("admin", password)
        conf = {"heartbeat_s": args.heartbeat_s, "events_per_agent_s":
                args.events_per_s / streaming, "origin": urls[0],
                "cookie": f"sessionid={api.http.cookies['sessionid']}"}
        ws = [url.replace("http", "ws") for url in urls]
        agents = [SimAgent({"uid": d["uid"], "key": d["key"], "port": 20000 + i,
                            "run": runs[i // args.run_devices][0] if i < streaming else None,
                            "started_at": runs[i // args.run_devices][1] if i < streaming else 0,
                            "stage": i % args.run_devices, "phase": i / count,
                            "url": f"{ws[i % webs]}/ws/agent/"}, conf)
                  for i, d in enumerate(devices[:count])]
        pages = [Page({"run": run, "started_at": started,
                       "url": f"{ws[(r + p) % webs]}/ws/runs/{run}/"}, conf)
                 for r, (run, started) in enumerate(runs) for p in range(args.pages)]
        window = CpuWindow({"webs": lambda: webs_pids, "postgres": lambda: pids_named(
            "postgres"), "redis": lambda: pids_named("redis-server"),
            "clients": lambda: [os.getpid()]})
        cores = asyncio.run(simulate(
            name, agents, pages, seconds=args.seconds, drain_s=args.drain_s, window=window,
            finish=lambda: Run.objects.filter(pk__in=[r for r, _ in runs]).update(
                state=Run.State.FINISHED)))
    finally:
        processes.stop_all()
    return summary(webs, agents, pages, cores)


def summary(webs: int, agents: list[SimAgent], pages: list[Page], cores: dict[str, float]
            ) -> dict[str, Any]:
    """One row: what was sent, answered and delivered, the latencies and the cores used."""
    def ms(values: list[float], q: float) -> float:
        return round(percentile(values, q), 1)

    hb = [x for a in agents for x in a.hb_ms]
    events = [x for p in pages for x in p.latency_ms]
    acks, lags = [x for a in agents for x in a.ack_ms], [x for a in agents for x in a.lag_ms]
    errors: Counter[str] = sum((a.errors for a in agents), Counter())
    return {
        "agents": len(agents), "webs": webs, "pages": len(pages),
        "heartbeats_sent": sum(a.counts["heartbeats"] for a in agents),
        "heartbeats_answered": len(hb), "heartbeat_p50_ms": ms(hb, 0.5),
        "heartbeat_p95_ms": ms(hb, 0.95), "heartbeat_max_ms": ms(hb, 1.0),
        "events_sent": sum(a.counts["events"] for a in agents),
        "events_stored": sum(a.counts["stored"] for a in agents),
        "events_expected": sum(p.expected(agents) for p in pages),
        "events_delivered": sum(len(p.seen) for p in pages),
        "event_p50_ms": ms(events, 0.5), "event_p95_ms": ms(events, 0.95),
        "stored_p95_ms": ms(acks, 0.95), "client_lag_p95_ms": ms(lags, 0.95),
        "sockets_closed": sum(w.closed for w in [*agents, *pages]), "cpu_cores": cores,
        "errors": dict(errors.most_common(5))}


COLUMNS = [("webs", "webs"), ("agents", "agents"), ("hb sent", "heartbeats_sent"),
           ("hb answered", "heartbeats_answered"), ("hb p50 ms", "heartbeat_p50_ms"),
           ("hb p95 ms", "heartbeat_p95_ms"), ("ev sent", "events_sent"),
           ("ev expected", "events_expected"), ("ev delivered", "events_delivered"),
           ("ev p50 ms", "event_p50_ms"), ("ev p95 ms", "event_p95_ms")]
CORES = ["webs", "postgres", "redis", "clients", "other"]


def table(rows: list[dict[str, Any]]) -> str:
    heads = [h for h, _ in COLUMNS] + [f"{g} cores" for g in CORES]
    cells = [[str(r[k]) for _, k in COLUMNS] + [str(r["cpu_cores"][g]) for g in CORES]
             for r in rows]
    widths = [max(len(c) for c in column) for column in zip(heads, *cells, strict=True)]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True))
                     for line in [heads, *cells])


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc.split(
        "\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--agents", type=numbers, default=[100, 200, 500], help="simulated agents, a scenario "
        "each (comma-separated; default 100,200,500)")
    add("--webs", type=numbers, default=[1, 2], help="web processes (daphne), a scenario each "
        "(comma-separated; default 1,2)")
    add("--seconds", type=float, default=30.0, help="each scenario's measured window (30)")
    add("--heartbeat-s", type=float, default=1.0, help="each agent's heartbeat period (1 s)")
    add("--events-per-s", type=float, default=1000.0, help="timeline events a second, all "
        "runs together (1000)")
    add("--runs", type=int, default=4, help="running runs whose agents stream events (4)")
    add("--run-devices", type=int, default=4, help="devices (agents) per run (4)")
    add("--pages", type=int, default=1, help="browser sockets open on each run's page (1)")
    add("--drain-s", type=float, default=30.0, help="how long to wait for the answers, then "
        "for the pages' events, after the window (30 s each)")
    add("--redis-url", default="redis://127.0.0.1:6379/9", help="the channel layer's Redis "
        "(default a spare database; keys under a prefix of their own, deleted after)")
    args = parser.parse_args(argv)
    if (not args.agents or not args.webs or min(args.agents + args.webs) < 1
            or min(args.seconds, args.heartbeat_s, args.drain_s) <= 0 or args.events_per_s < 0
            or min(args.runs, args.run_devices, args.pages) < 1):
        parser.error("--agents and --webs take positive numbers; --seconds, --heartbeat-s, "
                     "--drain-s, --runs, --run-devices and --pages must be positive")
    # a SIGTERM (a test's deadline) stops the servers and drops the database, as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    var_dir = Path(tempfile.mkdtemp(prefix="edgepipe-bench-load-"))
    print(f"var directory: {var_dir}", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    devices: list[dict[str, Any]] = []
    with shared_topology(args.redis_url, var_dir):
        from webapp.demo.scenario import ensure_demo_admin

        password = ensure_demo_admin()
        for webs in args.webs:
            for agents in args.agents:
                rows.append(scenario(args, webs, agents, devices, var_dir, password))
                print(table(rows[-1:]), file=sys.stderr, flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True).stdout.strip()
    print(table(rows))
    print(json.dumps({"bench": "load", "commit": commit, "seconds": args.seconds,
                      "heartbeat_s": args.heartbeat_s, "events_per_s": args.events_per_s,
                      "runs": args.runs, "run_devices": args.run_devices, "pages": args.pages,
                      "rows": rows}))
    if any(r["heartbeats_answered"] < r["heartbeats_sent"] or r["errors"] or r["sockets_closed"]
           or r["events_delivered"] < r["events_expected"] for r in rows):
        print(f"something was dropped or refused; the logs are in {var_dir}/logs",
              file=sys.stderr)
        return 1
    shutil.rmtree(var_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
