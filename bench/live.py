"""Benchmark of the live path: timeline events from agents to a run page in a real browser.

    .venv/bin/python bench/live.py [--rates 500,1000,2000,4000,8000] [--seconds 5] [--agents 3]
    .venv/bin/python bench/live.py --rates 2000 --seconds 3     # a short run
    .venv/bin/python bench/live.py --flush-s 0.05               # agents flushing every 50 ms

Starts the web server (daphne) on the Redis channel layer (``REDIS_URL``, default
redis://127.0.0.1:6379/0, under a key prefix of its own) and a real Chromium on a run's page,
then real agent runtimes (``agent.runtime.AgentRuntime``, each with its own authenticated
WebSocket, batching as it does while training) emit timeline events at each rate in turn. The
path measured is the product's: the agent's batch, the server's validation and storage, the
run's Channels group over Redis, the page's WebSocket, the page's live Gantt. The latency is
from the moment the agent emitted an event to the end of the page's Gantt frame that drew it
(``page``); ``socket`` is to its arrival on the page's WebSocket (stamped in a listener added
before the page's own).

Where the time goes, per event, stage by stage (each stage's p50, p95 and mean; the means add
up to the whole): ``agent`` from the emit to the agent's batch written to its WebSocket (its
flush interval), ``gateway`` from there to the server starting to store it (the network, and
the batches before it on that agent's connection), ``ingest`` storing it (parse, check,
insert, commit) until its delta is handed to the channel layer, ``channel`` from there to the
run page's consumer (Redis), ``browser`` from there to the page's WebSocket listener (daphne's
send, and the page's main thread when busy), ``page`` from there to the end of the Gantt
frame that drew it (the message's handling, the wait for the next animation frame, the
frame). The server's stamps come from a daphne of the bench's own (this file,
``--serve-probed``: the product's ASGI application, with three functions wrapped to stamp
each delta); the agent's from its WebSocket.

For each rate it prints the events emitted, delivered (on the page's WebSocket), held by the
page's Gantt at the end (its event store, any that came by a fresh snapshot instead of a delta
too), and lost (not held), the latencies, the Gantt's frames (how many, their mean and p95
time, and the main thread's long tasks, over 50 ms, during the rate); then the breakdown; last,
one JSON line with the highest rate delivered without loss and each rate's figures (there also:
the frames that drew the bars only, moved the axis too, or redrew Plotly's whole skeleton, and
the page's other charts' redraws). The database is SQLite in a fresh
var directory unless ``DATABASE_URL`` is set. ``--bare``: a bare WebSocket in the browser
instead of the run page (no page stage, nothing drawn).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.testbed import free_port  # noqa: E402  (the path above makes it importable)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

# Added before the page's scripts: every message of the run's WebSocket is stamped on arrival,
# before the page's own handler runs: each timeline message's number (the page counts them
# alike), its events as "device:microbatch" and the server's stamps (``bench``); and each frame
# of the page's live Gantt (EdgePipe.runPage.onFrame): when it ended, how long it took, and how
# many timeline messages it had had. Also the main thread's long tasks, and Plotly's redraws of
# the page's other charts.
RECORDER = """
(() => {
  const Native = window.WebSocket;
  const now = () => performance.timeOrigin + performance.now();
  window.__epMessages = [];  // [arrival ms, number, keys, server stamps]
  window.__epTimeline = 0;   // timeline messages so far
  window.__epKeys = 0;       // events in them
  window.__epFrames = [];    // [end ms, frame ms, timeline messages received]
  window.__epLong = [];      // [start ms, duration ms] of long tasks
  window.__epCharts = [];    // ms of each Plotly.react of another chart
  window.__epSnapshot = false;
  function Recording(url, protocols) {
    const ws = protocols === undefined ? new Native(url) : new Native(url, protocols);
    if (String(url).includes("/ws/runs/")) {
      ws.addEventListener("message", (e) => {
        const at = now();
        const msg = JSON.parse(e.data);
        if (msg.type === "snapshot") window.__epSnapshot = true;
        if (msg.type === "timeline") {
          const keys = msg.events.map((x) => x.device + ":" + x.microbatch);
          window.__epMessages.push([at, window.__epTimeline, keys, msg.bench || null]);
          window.__epTimeline += 1;
          window.__epKeys += keys.length;
        }
      });
    }
    return ws;
  }
  Recording.prototype = Native.prototype;
  for (const k of ["CONNECTING", "OPEN", "CLOSING", "CLOSED"]) Recording[k] = Native[k];
  window.WebSocket = Recording;
  try {
    new PerformanceObserver((list) => {
      for (const t of list.getEntries()) {
        window.__epLong.push([performance.timeOrigin + t.startTime, t.duration]);
      }
    }).observe({ entryTypes: ["longtask"] });
  } catch (e) { /* no long tasks: none recorded */ }
  document.addEventListener("DOMContentLoaded", () => {
    if (window.EdgePipe && window.EdgePipe.runPage) {
      window.EdgePipe.runPage.onFrame = (f) => {
        window.__epFrames.push([now(), f.ms, f.received, f.redrew || ""]);
      };
    }
    if (!window.Plotly) return;
    const react = window.Plotly.react;
    window.Plotly.react = function (gd) {
      const t0 = performance.now();
      const out = react.apply(this, arguments);
      if ((gd.id || gd) !== "gantt") window.__epCharts.push(performance.now() - t0);
      return out;
    };
  });
})();
"""

# the stages of an event's way, each from the previous stamp (the first from the emit)
STAGES = ("agent", "gateway", "ingest", "channel", "browser", "page")


def batch_keys(message: dict[str, Any], uid: str) -> list[str]:
    """``device:microbatch`` of each timeline event an ``events`` message of device ``uid``
    carries, as objects or in columns (what agents send: there the device is the
    connection's)."""
    keys = [f"{e['device']}:{e['microbatch']}" for e in message.get("timeline", ())]
    columns = message.get("timeline_columns") or {}
    return keys + [f"{uid}:{m}" for m in columns.get("microbatch", ())]


def stamp_parts(parts: list[dict[str, Any]], store: float | None, now: float
                ) -> list[dict[str, Any]]:
    """A commit's deltas to a run's group (``webapp.runs.events._group_send``'s ``parts``)
    with each timeline delta stamped: when the server started to store its batches
    (``store``; None: not a batch's commit, nothing stamped) and when it went to the channel
    layer (``now``)."""
    if store is None:
        return parts
    return [{**part, "bench": {"store": store, "commit": now}}
            if part.get("type") == "timeline" else part for part in parts]


def serve_probed(port: int) -> None:
    """The web server the bench measures: daphne on the product's ASGI application, with the
    gateway's store of an agent's batches, the send of a run's delta to its group and the run
    page's consumer wrapped to stamp each timeline delta (``bench``: when the server started to
    store the batches and when the delta went to the channel layer, and when the page's
    consumer took it from there). Nothing else differs."""
    import django

    django.setup()
    from daphne.cli import CommandLineInterface

    from webapp.dashboard.consumers import RunConsumer
    from webapp.gateway import services
    from webapp.runs import events

    local = threading.local()
    agent_events, group_send, run_event = (services.agent_events, events._group_send,
                                           RunConsumer.run_event)

    def stamped_agent_events(**kwargs: Any) -> Any:
        local.store = time.time()
        try:
            return agent_events(**kwargs)
        finally:
            local.store = None

    def stamped_group_send(run_id: int, parts: list[dict[str, Any]]) -> None:
        group_send(run_id, stamp_parts(parts, getattr(local, "store", None), time.time()))

    async def stamped_run_event(self: RunConsumer, message: dict[str, Any]) -> None:
        stamps = message["event"].get("bench")
        if stamps is not None:
            stamps["consumer"] = time.time()
        await run_event(self, message)

    services.agent_events = stamped_agent_events
    events._group_send = stamped_group_send
    RunConsumer.run_event = stamped_run_event  # type: ignore[method-assign]
    CommandLineInterface().run(["-b", "127.0.0.1", "-p", str(port), "webapp.asgi:application"])


def setup_django(var_dir: str, redis_url: str) -> None:
    os.environ["EDGEPIPE_VAR_DIR"] = var_dir
    os.environ["REDIS_URL"] = redis_url
    os.environ["REDIS_KEY_PREFIX"] = f"edgepipe-bench-{secrets.token_hex(4)}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "webapp.settings.local"
    os.environ["DEBUG"] = "false"
    os.chdir(ROOT)
    import django

    django.setup()


def prepare(agents: int) -> tuple[int, float, list[tuple[str, str, str]], str]:
    """A running run over ``agents`` enrolled devices, one stage each, as a deployment leaves
    it; returns the run id, its start (epoch seconds), each device's (uid, key, name) and the
    admin's password. (The database is not touched afterwards: Playwright's sync API runs an
    event loop in this thread, where Django refuses queries.)"""
    from django.core.management import call_command
    from django.utils import timezone

    from webapp.demo.scenario import ensure_demo_admin
    from webapp.devices import services as device_services
    from webapp.runs import services as run_services
    from webapp.runs.models import Run, RunDevice

    call_command("migrate", interactive=False, verbosity=0)
    password = ensure_demo_admin()
    _, token = device_services.enrollment_token_create(created_by=None, label="bench/live.py",
                                                       max_uses=agents)
    enrolled = [device_services.device_enrol(token=token, name=f"live-{k}",
                                             memory_bytes=2**30, bandwidth_bps=1.25e8)
                for k in range(agents)]
    spec, _ = device_services.model_spec_get_or_create(model="mlp", dataset="digits",
                                                       batch_size=32)
    run = run_services.run_create(name="bench/live.py", model_spec=spec,
                                  devices=[d for d, _ in enrolled], algorithms=["ftpipehd"])
    for k, (device, _) in enumerate(enrolled):
        RunDevice.objects.filter(run=run, device=device).update(
            stage=k, stage_state=RunDevice.StageState.RUNNING)
    started_at = timezone.now()
    Run.objects.filter(pk=run.pk).update(state=Run.State.RUNNING, started_at=started_at)
    return run.pk, started_at.timestamp(), [(d.uid, key, d.name) for d, key in enrolled], password


class Agent:
    """A real agent runtime connected to the server, fed timeline events at a given rate."""

    def __init__(self, server: str, uid: str, key: str, name: str,
                 flush_s: float | None = None) -> None:
        from agent.config import AgentConfig, Enrolment
        from agent.runtime import AgentRuntime

        enrolment = Enrolment(server=server, uid=uid, key=key, name=name)
        self.runtime = AgentRuntime(AgentConfig(enrolment=enrolment) if flush_s is None
                                    else AgentConfig(enrolment=enrolment, flush_s=flush_s))
        self.uid = uid
        self.emitted: dict[str, float] = {}
        self.wired: dict[str, float] = {}  # when each event's batch was written to the socket
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.runtime.serve(connect_to=self.stamped)),
            name=f"agent-{name}", daemon=True)
        self.thread.start()

    @contextlib.asynccontextmanager
    async def stamped(self, config: Any) -> AsyncIterator[Any]:
        """The agent's own WebSocket, each events batch's events stamped once it is written."""
        from agent.connection import websocket_channel

        async with websocket_channel(config) as channel:
            send = channel.send

            async def send_stamped(message: dict[str, Any]) -> None:
                await send(message)
                if message.get("type") == "events":
                    now = time.time()
                    for key in batch_keys(message, self.uid):
                        self.wired.setdefault(key, now)

            channel.send = send_stamped  # type: ignore[method-assign]
            yield channel

    def emit(self, *, run: int, stage: int, started_at: float, rate: float, seconds: float,
             first: int) -> None:
        """Emit ``rate`` events per second for ``seconds``, microbatches from ``first`` on."""
        from orchestrator.events import TimelineEvent

        begin = time.time()
        sent = 0
        total = int(rate * seconds)
        while sent < total:
            due = min(total, int((time.time() - begin) * rate) + 1)
            while sent < due:
                now = time.time()
                m = first + sent
                self.runtime._event(TimelineEvent(run, self.uid, stage, "forward", m, 0,
                                                  now - started_at - 1e-4, now - started_at))
                self.emitted[f"{self.uid}:{m}"] = now
                sent += 1
            time.sleep(0.001)

    def close(self) -> None:
        self.runtime.stop.set()
        self.thread.join(timeout=10)
        self.runtime.close()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def figures(values: list[float]) -> dict[str, float | None]:
    """p50, p95, max and mean, in ms, to 0.1 ms (None when there are none)."""
    if not values:
        return {"p50": None, "p95": None, "max": None, "mean": None}
    return {"p50": round(percentile(values, 0.5), 1), "p95": round(percentile(values, 0.95), 1),
            "max": round(max(values), 1), "mean": round(statistics.fmean(values), 1)}


def measure(rate: float, emitted: dict[str, float], wired: dict[str, float],
            messages: list[list[Any]], frames: list[list[float]], long_tasks: list[list[float]],
            charts: list[float], held: set[str], began: float) -> dict[str, Any]:
    """One rate's row: what arrived, was drawn and is held, the latencies and the stages."""
    frames = [f for f in frames if f[0] / 1000 >= began]
    received = [f[2] for f in frames]
    arrived: dict[str, float] = {}
    drawn: dict[str, float] = {}
    stamps: dict[str, dict[str, float]] = {}
    for at, number, keys, bench in messages:
        # the first frame that had had this message (the page counts timeline messages alike)
        k = bisect.bisect_left(received, number + 1)
        for key in keys:
            if key in emitted and key not in arrived:
                arrived[key] = at / 1000
                if k < len(frames):
                    drawn[key] = frames[k][0] / 1000
                if bench:
                    stamps[key] = bench
    page = [(drawn[k] - t) * 1000 for k, t in emitted.items() if k in drawn]
    socket = [(arrived[k] - t) * 1000 for k, t in emitted.items() if k in arrived]
    stages: dict[str, list[float]] = {name: [] for name in STAGES}
    for key, t in emitted.items():
        if key not in wired or key not in stamps:
            continue
        bench = stamps[key]
        points = [t, wired[key], bench["store"], bench["commit"], bench["consumer"],
                  arrived[key]] + ([drawn[key]] if key in drawn else [])  # --bare: not drawn
        for name, a, b in zip(STAGES, points, points[1:], strict=False):
            stages[name].append((b - a) * 1000)
    frame_ms = [f[1] for f in frames]
    # what each frame redrew: the bars only, the axis moved too, or the whole skeleton
    by_kind = {name: [f[1] for f in frames if (f[3] if len(f) > 3 else "") == kind]
               for name, kind in (("bars", ""), ("axis", "range"), ("skeleton", "full"))}
    long_ms = [d for start, d in long_tasks if start / 1000 >= began]
    lost = [k for k in emitted if k not in held]
    return {
        "rate": rate, "emitted": len(emitted), "delivered": len(arrived),
        "held": len(emitted) - len(lost), "lost": len(lost),
        "page_ms": figures(page), "socket_ms": figures(socket),
        "frames": len(frames), "frame_ms": figures(frame_ms),
        "frames_by_kind": {name: {"frames": len(ms), **figures(ms)}
                           for name, ms in by_kind.items()},
        "long_tasks": len(long_ms), "long_task_ms": figures(long_ms),
        "other_charts": len(charts), "other_chart_ms": figures(charts),
        "stages_ms": {name: figures(values) for name, values in stages.items()},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-probed"]:
        serve_probed(int(argv[1]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="500,1000,2000,4000,8000",
                        help="events per second, all agents together (comma-separated)")
    parser.add_argument("--seconds", type=float, default=5.0, help="emitting time per rate")
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL",
                                                              "redis://127.0.0.1:6379/0"))
    parser.add_argument("--port", type=int, default=0, help="web server port (default: free)")
    parser.add_argument("--flush-s", type=float, default=None,
                        help="the agents' flush interval (default: the agent's own)")
    parser.add_argument("--bare", action="store_true",
                        help="a bare WebSocket in the browser instead of the run page (the "
                             "server's part of the latency, without the page's drawing)")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    if (not rates or any(r <= 0 for r in rates) or args.agents < 1 or args.seconds <= 0
            or (args.flush_s is not None and args.flush_s <= 0)):
        parser.error("--rates must be positive numbers, --agents, --seconds and --flush-s "
                     "positive")

    var_dir = tempfile.mkdtemp(prefix="edgepipe-bench-live-")
    print(f"var directory: {var_dir}")
    setup_django(var_dir, args.redis_url)
    from django.conf import settings
    from playwright.sync_api import sync_playwright

    from webapp.demo.client import ApiClient, wait_for
    from webapp.demo.processes import ProcessGroup

    run_id, started_at, devices, password = prepare(args.agents)
    port = args.port or free_port()
    base = f"http://127.0.0.1:{port}"
    processes = ProcessGroup(log_dir=Path(var_dir) / "logs")
    agents: list[Agent] = []
    rows: list[dict[str, Any]] = []
    try:
        processes.start("web", [sys.executable, str(Path(__file__).resolve()), "--serve-probed",
                                str(port)])
        ApiClient(base).wait_until_up()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.add_init_script(RECORDER)
            page.goto(f"{base}/login/")
            page.fill("input[name=username]", "admin")
            page.fill("input[name=password]", password)
            page.click("button[type=submit]")
            page.wait_for_url(f"{base}/")
            if args.bare:
                page.goto(f"{base}/devices/")  # any page: the session cookie is what counts
                page.evaluate(f"window.__epBare = new WebSocket("
                              f"'ws://127.0.0.1:{port}/ws/runs/{run_id}/')")
            else:
                page.goto(f"{base}/runs/{run_id}/")
                page.locator("#gantt-card").scroll_into_view_if_needed()
            page.wait_for_function("window.__epSnapshot === true", timeout=30_000)
            agents = [Agent(base, uid, key, name, args.flush_s) for uid, key, name in devices]
            for a in agents:
                if not a.runtime.connected.wait(30):
                    raise RuntimeError(f"agent {a.uid} did not connect; see {var_dir}/logs")
            first = 0
            print(f"channel layer: {settings.CHANNEL_LAYERS['default']['BACKEND']}; "
                  f"{args.agents} agents flushing every {agents[0].runtime.config.flush_s} s; "
                  f"{'a bare socket' if args.bare else 'the run page'} in Chromium")
            print(f"{'rate/s':>8} {'emitted':>8} {'deliv.':>8} {'held':>8} {'lost':>5} "
                  f"{'p50_ms':>7} {'p95_ms':>7} {'max_ms':>7} {'sock95':>7} {'frames':>6} "
                  f"{'frame_ms':>8} {'frame95':>7} {'long':>5}")
            for rate in rates:
                for a in agents:
                    a.emitted.clear()
                    a.wired.clear()
                page.evaluate("window.__epMessages = []; window.__epCharts = []")
                began = time.time()
                threads = [threading.Thread(target=a.emit, kwargs=dict(
                    run=run_id, stage=k, started_at=started_at, rate=rate / len(agents),
                    seconds=args.seconds, first=first)) for k, a in enumerate(agents)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                first += int(rate * args.seconds) + 1
                emitted = {k: v for a in agents for k, v in a.emitted.items()}
                # every event on the page's socket (a count: the page is not asked for more
                # while the last ones come), then a frame after the last
                def all_arrived(expected: int = len(emitted)) -> bool:
                    count: int = page.evaluate(
                        "window.__epMessages.reduce((n, m) => n + m[2].length, 0)")
                    return count >= expected

                with contextlib.suppress(Exception):
                    wait_for(all_arrived, timeout_s=20, what="every event to arrive")
                time.sleep(0.5)
                # (each agent's thread stamps its batches: a copy, taken at once)
                wired = {k: v for a in agents for k, v in a.wired.copy().items()}
                messages = page.evaluate("window.__epMessages")
                frames = page.evaluate("window.__epFrames")
                long_tasks = page.evaluate("window.__epLong")
                charts = page.evaluate("window.__epCharts")
                held = set(emitted) if args.bare else set(page.evaluate(
                    "EdgePipe.runPage.ganttStore().keys().map(k => { const p = k.split('|');"
                    " return p[0] + ':' + p[2]; })"))
                if args.bare:  # what arrived is what is held
                    held = {k for _, _, keys, _ in messages for k in keys}
                row = measure(rate, emitted, wired, messages, frames, long_tasks, charts, held,
                              began)
                rows.append(row)
                page_ms = row["page_ms"] if not args.bare else row["socket_ms"]
                print(f"{rate:>8.0f} {row['emitted']:>8} {row['delivered']:>8} {row['held']:>8} "
                      f"{row['lost']:>5} {page_ms['p50']!s:>7} {page_ms['p95']!s:>7} "
                      f"{page_ms['max']!s:>7} {row['socket_ms']['p95']!s:>7} "
                      f"{row['frames']:>6} {row['frame_ms']['mean']!s:>8} "
                      f"{row['frame_ms']['p95']!s:>7} {row['long_tasks']:>5}", flush=True)
            browser.close()
    finally:
        for a in agents:
            a.close()
        processes.stop_all()
    print("\nwhere the time goes, ms from the emit (p50 / p95 / mean of each stage; the means "
          f"add up to the {'socket' if args.bare else 'page'}'s)")
    print(f"{'rate/s':>8} " + " ".join(f"{name:>17}" for name in STAGES))
    for row in rows:
        cells = [f"{s['p50']}/{s['p95']}/{s['mean']}" for s in row["stages_ms"].values()]
        print(f"{row['rate']:>8.0f} " + " ".join(f"{c:>17}" for c in cells))
    lossless = [r["rate"] for r in rows if r["lost"] == 0]
    print(json.dumps({
        "bench": "live", "agents": args.agents, "seconds_per_rate": args.seconds,
        "flush_s": agents[0].runtime.config.flush_s if agents else args.flush_s,
        "page": not args.bare, "max_lossless_rate_per_s": max(lossless, default=0),
        "p95_ms_at_lowest_rate": rows[0]["page_ms" if not args.bare else "socket_ms"]["p95"]
        if rows else None,
        "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
