"""A PipeLearn run on real agents losing a device, or its server: `manage.py demo
--pipelearn --headless` with three devices and a server (web server, Celery worker and four
agent processes on this machine) kills one agent with SIGKILL once a device has trained 8
micro-batches. A lost device: its epoch finishes without it and the run trains on with the
other two to the end, every epoch's averaged model measured and said to be without it. The
lost server: the run fails, saying it lost its server."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.webapp.integration.stack import child_env, free_port

EPOCHS, BATCHES, KILL_AT = 3, 6, 8

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def killed_run(tmp: Path, victim: str) -> tuple[dict[str, Any], Path]:
    var = tmp / "var"
    env = child_env(EDGEPIPE_VAR_DIR=str(var), DJANGO_SETTINGS_MODULE="webapp.settings.local")
    result = subprocess.run(
        [sys.executable, "manage.py", "demo", "--pipelearn", "--headless", "--port",
         str(free_port()), "--devices", "3", "--epochs", str(EPOCHS), "--batches",
         str(BATCHES), "--kill-agent", victim, "--kill-agent-at-batch", str(KILL_AT)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted((var / "demo" / "logs").glob("*.log")))
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}\n{logs}"
    left = subprocess.run(["pgrep", "-af", str(var)], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"processes left running: {left.stdout}"
    return json.loads(result.stdout.strip().splitlines()[-1]), var / "db.sqlite3"


def rows(database: Path, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(database) as db:
        return db.execute(query, args).fetchall()


def faults(database: Path, run: int) -> list[tuple[str, str, dict[str, Any]]]:
    return [(kind, device, json.loads(detail)) for kind, device, detail in rows(
        database, "SELECT kind, device, detail FROM runs_faultevent WHERE run_id = ? "
                  "ORDER BY at, id", run)]


def uid_of(database: Path, name: str) -> str:
    [(uid,)] = rows(database, "SELECT uid FROM devices_device WHERE name = ?", name)
    return str(uid)


def test_a_lost_devices_epoch_finishes_without_it(tmp_path: Path) -> None:
    summary, database = killed_run(tmp_path, "pl-device-2")
    run, lost = summary["run"], uid_of(database, "pl-device-2")
    assert summary["state"] == "finished" and summary["error"] is None, summary
    [gone] = [d for kind, device, d in faults(database, run)
              if kind == "device_lost" and device == lost]
    assert gone["goes_on_without"] is True
    # the two others trained every micro-batch of their pipelines: N x the iterations
    [(document,)] = rows(database, "SELECT p.document FROM runs_plan p JOIN runs_run r ON "
                                   "r.chosen_plan_id = p.id WHERE r.id = ?", run)
    plan = json.loads(document)
    for name in ("pl-device-1", "pl-device-3"):
        uid = uid_of(database, name)
        n = plan["devices"][uid]["parallel_batches"]
        done = {m for (m,) in rows(database, "SELECT microbatch FROM runs_timelineevent WHERE "
                                             "run_id = ? AND device = ? AND kind = 'backward'",
                                   run, uid)}
        assert done == set(range(n * BATCHES * EPOCHS)), name
    # every epoch's averaged model measured, without the lost device
    evaluated = [d for kind, _, d in faults(database, run) if kind == "round_evaluated"]
    assert sorted(d["round"] for d in evaluated) == list(range(1, EPOCHS + 1))
    assert all(d.get("without") == [lost] for d in evaluated)


def test_a_lost_server_fails_the_run_saying_so(tmp_path: Path) -> None:
    summary, database = killed_run(tmp_path, "pl-server")
    assert summary["state"] == "failed", summary
    assert "lost its server" in summary["error"], summary
    [(state,)] = rows(database, "SELECT state FROM runs_run WHERE id = ?", summary["run"])
    assert state == "failed"
