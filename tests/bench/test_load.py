"""bench/load.py at a tiny size on this machine's real servers (PostgreSQL, Redis): simulated
agents over the gateway's WebSocket, a run page's socket, and the JSON line it ends with. No
timing is asserted (CI machines are loaded): only that everything sent was answered and
delivered, and that every figure is there."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.webapp.integration.stack import child_env, listening

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROW_KEYS = {"agents", "webs", "pages", "heartbeats_sent", "heartbeats_answered",
            "heartbeat_p50_ms", "heartbeat_p95_ms", "heartbeat_max_ms", "events_sent",
            "events_stored", "events_expected", "events_delivered", "event_p50_ms",
            "event_p95_ms", "stored_p95_ms", "client_lag_p95_ms", "sockets_closed",
            "cpu_cores", "errors"}


def test_a_tiny_load_is_answered_and_delivered() -> None:
    # Prepare: the bench needs the real servers
    missing = [name for name, port in (("Redis", 6379), ("PostgreSQL", 5432))
               if not listening(port)]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not reachable (.ci/run starts them)",
                    pytrace=False)

    # Execute: five agents on one web process for 3 s, four of them one run's devices
    # streaming events to its page; generous deadlines for a loaded machine
    command = [sys.executable, str(ROOT / "bench" / "load.py"), "--agents", "5", "--webs", "1",
               "--seconds", "3", "--events-per-s", "40", "--runs", "1", "--run-devices", "4",
               "--drain-s", "120"]
    bench = subprocess.Popen(command, cwd=ROOT, env=child_env(), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = bench.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        bench.send_signal(signal.SIGTERM)  # it stops its servers and drops its database
        out, err = bench.communicate(timeout=120)
        pytest.fail(f"bench/load.py took over 15 minutes:\n{err[-3000:]}")

    # Assert: a table, then one JSON line with a row whose every heartbeat was answered and
    # every event stored and delivered to the page
    assert bench.returncode == 0, err[-4000:]
    lines = out.strip().splitlines()
    assert lines[0].split()[:2] == ["webs", "agents"] and len(lines) == 3, out
    summary = json.loads(lines[-1])
    assert summary["bench"] == "load" and summary["events_per_s"] == 40
    [row] = summary["rows"]
    assert set(row) == ROW_KEYS
    assert (row["agents"], row["webs"], row["pages"]) == (5, 1, 1)
    assert row["heartbeats_sent"] >= 5  # each agent's first one at least
    assert row["heartbeats_answered"] == row["heartbeats_sent"]
    assert row["events_sent"] > 0
    assert row["events_stored"] == row["events_expected"] == row["events_sent"]
    assert row["events_delivered"] == row["events_sent"]
    assert row["errors"] == {} and row["sockets_closed"] == 0
    assert set(row["cpu_cores"]) == {"webs", "postgres", "redis", "clients", "other"}
    assert row["cpu_cores"]["webs"] >= 0 and row["heartbeat_p95_ms"] >= 0
