"""What the benchmarks that drive a real local testbed share: Django on the embedded default with
a var dir of their own, a free port for its web server, and the testbed's agents stopped and
started afresh between runs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def setup_django(var_dir: str) -> None:
    """Django with ``var_dir`` as its var dir, on the embedded default (REDIS_URL and
    DATABASE_URL unset, whatever this shell has), from the checkout's root, with DEBUG off as
    a deployed server runs (in debug mode Django's cursor wrapper records every query, which
    cost the web process while agents report their events)."""
    for name in ("REDIS_URL", "DATABASE_URL"):
        os.environ.pop(name, None)
    os.environ["DEBUG"] = "false"
    os.environ["EDGEPIPE_VAR_DIR"] = var_dir
    os.environ["DJANGO_SETTINGS_MODULE"] = "webapp.settings.local"
    os.chdir(ROOT)
    import django

    django.setup()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def agent_command(testbed: Any, agent: Any) -> list[str]:
    """The command LocalTestbed starts ``agent`` with, for an agent already enrolled."""
    command = [sys.executable, "-m", "agent", "run", "--config",
               str(testbed.agent_config(agent)), "--server", testbed.url,
               "--name", agent.name, "--threads", "1",
               "--slowdown", str(agent.slowdown), "--latency-ms", str(agent.latency_ms)]
    if agent.bandwidth_mbps is not None:
        command += ["--bandwidth-mbps", str(agent.bandwidth_mbps)]
    return command


def stop_agents(testbed: Any, *, grace_s: float = 15.0) -> None:
    """Stop every agent's process as Ctrl-C would (SIGTERM to each process group, all at once;
    SIGKILL after ``grace_s``); their exits are expected (ProcessGroup.exited skips them)."""
    children = [testbed.processes.children[testbed.agent_process(a)] for a in testbed.agents]
    running = []
    for child in children:
        child.killed = True
        if child.process is not None and child.process.poll() is None:
            os.killpg(child.process.pid, signal.SIGTERM)
            running.append(child.process)
    deadline = time.monotonic() + grace_s
    for process in running:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def restart_agents(testbed: Any) -> None:
    """Start every agent afresh (the killed ones again, the survivors after stopping them) and
    wait until all their devices are online, with a heartbeat sent after the restart.

    Survivors are restarted too because an agent's data plane keeps its socket to a peer for
    as long as it runs (agent.transport.DataPlane: one PUSH socket per peer uid, opened at the
    first send and never re-opened when ``connect`` gives the peer a new address). A killed
    agent comes back on a new data port, so a survivor that ever sent to it (its predecessor
    in a plan, or a link measurement) would keep sending to the dead port: the next run that
    needs that link never starts training."""
    from django.utils.dateparse import parse_datetime

    from webapp.demo.client import wait_for

    since = time.time()
    stop_agents(testbed)
    for agent in testbed.agents:
        testbed.processes.start(testbed.agent_process(agent), agent_command(testbed, agent))
    wanted = {d["uid"] for d in testbed.devices}

    def online() -> bool:
        testbed.check_children()
        ready = [d for d in testbed.api.get("/api/devices/") if d["uid"] in wanted
                 and d["status"] in ("online", "busy") and d["last_heartbeat_at"]
                 and parse_datetime(d["last_heartbeat_at"]).timestamp() > since]
        return len(ready) == len(wanted)

    wait_for(online, timeout_s=120, what="the restarted agents to come back online")
    print(f"  restarted the agents ({time.time() - since:.1f} s to come back online)",
          file=sys.stderr, flush=True)
