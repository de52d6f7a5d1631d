"""Benchmark of the live path: timeline events from agents to a run page in a real browser.

    .venv/bin/python bench/live.py [--rates 500,1000,2000,4000,8000] [--seconds 5] [--agents 3]

Starts the web server (daphne) on the Redis channel layer (``REDIS_URL``, default
redis://127.0.0.1:6379/0, under a key prefix of its own) and a real Chromium on a run's page,
then real agent runtimes (``agent.runtime.AgentRuntime``, each with its own authenticated
WebSocket, batching as it does while training) emit timeline events at each rate in turn. The
path measured is the product's: the agent's batch, the server's validation and storage, the
run's Channels group over Redis, the page's WebSocket. The page records when each event
arrives (``Date.now()`` in a listener added before the page's own), so the latency is from the
moment the agent emitted the event to its arrival in the browser, agent batching included.

For each rate it prints the events emitted and delivered, the loss, and the latency's p50, p95
and maximum; last, one JSON line with the highest rate delivered without loss. The database is
SQLite in a fresh var directory unless ``DATABASE_URL`` is set.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.testbed import free_port  # noqa: E402  (the path above makes it importable)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

# Added before the page's scripts: every message of the run's WebSocket is stamped on arrival,
# before the page's own handler runs, and each timeline event is kept as "device:microbatch".
RECORDER = """
(() => {
  const Native = window.WebSocket;
  window.__epFrames = [];
  window.__epSnapshot = false;
  function Recording(url, protocols) {
    const ws = protocols === undefined ? new Native(url) : new Native(url, protocols);
    if (String(url).includes("/ws/runs/")) {
      ws.addEventListener("message", (e) => {
        const at = performance.timeOrigin + performance.now();
        const msg = JSON.parse(e.data);
        if (msg.type === "snapshot") window.__epSnapshot = true;
        if (msg.type === "timeline") {
          window.__epFrames.push([at, msg.events.map((x) => x.device + ":" + x.microbatch)]);
        }
      });
    }
    return ws;
  }
  // how long the page's chart updates hold the main thread (messages wait meanwhile)
  window.__epDraws = [];
  document.addEventListener("DOMContentLoaded", () => {
    if (!window.Plotly) return;
    const react = window.Plotly.react;
    window.Plotly.react = function () {
      const t0 = performance.now();
      const out = react.apply(this, arguments);
      window.__epDraws.push(performance.now() - t0);
      return out;
    };
  });
  Recording.prototype = Native.prototype;
  for (const k of ["CONNECTING", "OPEN", "CLOSING", "CLOSED"]) Recording[k] = Native[k];
  window.WebSocket = Recording;
})();
"""


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

    def __init__(self, server: str, uid: str, key: str, name: str) -> None:
        from agent.config import AgentConfig, Enrolment
        from agent.runtime import AgentRuntime

        self.runtime = AgentRuntime(AgentConfig(
            enrolment=Enrolment(server=server, uid=uid, key=key, name=name)))
        self.uid = uid
        self.thread = threading.Thread(target=lambda: asyncio.run(self.runtime.serve()),
                                       name=f"agent-{name}", daemon=True)
        self.thread.start()
        self.emitted: dict[str, float] = {}

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="500,1000,2000,4000,8000",
                        help="events per second, all agents together (comma-separated)")
    parser.add_argument("--seconds", type=float, default=5.0, help="emitting time per rate")
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL",
                                                              "redis://127.0.0.1:6379/0"))
    parser.add_argument("--port", type=int, default=0, help="web server port (default: free)")
    parser.add_argument("--bare", action="store_true",
                        help="a bare WebSocket in the browser instead of the run page (the "
                             "server's part of the latency, without the page's drawing)")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    if not rates or any(r <= 0 for r in rates) or args.agents < 1 or args.seconds <= 0:
        parser.error("--rates must be positive numbers, --agents and --seconds positive")

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
        processes.start("web", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p",
                                str(port), "webapp.asgi:application"])
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
            page.wait_for_function("window.__epSnapshot === true", timeout=30_000)
            agents = [Agent(base, uid, key, name) for uid, key, name in devices]
            for a in agents:
                if not a.runtime.connected.wait(30):
                    raise RuntimeError(f"agent {a.uid} did not connect; see {var_dir}/logs")
            first = 0
            print(f"channel layer: {settings.CHANNEL_LAYERS['default']['BACKEND']}; "
                  f"{args.agents} agents flushing every {agents[0].runtime.config.flush_s} s")
            print(f"{'rate/s':>8} {'emitted':>8} {'delivered':>9} {'lost':>6} "
                  f"{'p50_ms':>8} {'p95_ms':>8} {'max_ms':>8} {'draws':>6} {'draw_ms':>8}")
            for rate in rates:
                for a in agents:
                    a.emitted.clear()
                page.evaluate("window.__epFrames = []; window.__epDraws = []")
                threads = [threading.Thread(target=a.emit, kwargs=dict(
                    run=run_id, stage=k, started_at=started_at, rate=rate / len(agents),
                    seconds=args.seconds, first=first)) for k, a in enumerate(agents)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                first += int(rate * args.seconds) + 1
                emitted = {k: v for a in agents for k, v in a.emitted.items()}

                def arrived(emitted: dict[str, float] = emitted) -> dict[str, float] | None:
                    frames = page.evaluate("window.__epFrames")
                    seen = {key: at / 1000 for at, keys in frames for key in keys}
                    return seen if set(emitted) <= set(seen) else None

                try:
                    seen = wait_for(arrived, timeout_s=20, what="every event to arrive")
                except Exception:
                    frames = page.evaluate("window.__epFrames")
                    seen = {key: at / 1000 for at, keys in frames for key in keys}
                latencies = [(seen[k] - t) * 1000 for k, t in emitted.items() if k in seen]
                draws = page.evaluate("window.__epDraws")
                row = {"rate": rate, "emitted": len(emitted),
                       "delivered": sum(1 for k in emitted if k in seen),
                       "lost": sum(1 for k in emitted if k not in seen),
                       "p50_ms": round(percentile(latencies, 0.5), 1),
                       "p95_ms": round(percentile(latencies, 0.95), 1),
                       "max_ms": round(max(latencies, default=float("nan")), 1),
                       "mean_ms": round(statistics.fmean(latencies), 1) if latencies else None,
                       "draws": len(draws),
                       "draw_ms_mean": round(statistics.fmean(draws), 1) if draws else None}
                rows.append(row)
                print(f"{rate:>8.0f} {row['emitted']:>8} {row['delivered']:>9} "
                      f"{row['lost']:>6} {row['p50_ms']:>8} {row['p95_ms']:>8} "
                      f"{row['max_ms']:>8} {row['draws']:>6} {row['draw_ms_mean'] or 0:>8}",
                      flush=True)
            browser.close()
    finally:
        for a in agents:
            a.close()
        processes.stop_all()
    lossless = [r["rate"] for r in rows if r["lost"] == 0]
    print(json.dumps({
        "bench": "live", "agents": args.agents, "seconds_per_rate": args.seconds,
        "max_lossless_rate_per_s": max(lossless, default=0),
        "p95_ms_at_lowest_rate": rows[0]["p95_ms"] if rows else None,
        "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
