"""PipeLearn on real agents: `manage.py demo --pipelearn --headless` with a server and two
devices (web server, Celery worker and three agent processes on this machine, the embedded
default) trains two epochs of four iterations; every device trains every micro-batch of its
pipeline (N a iteration, the plan's), the server runs stage 1 of both pipelines, every stage
aggregates at each epoch's end, the server measures each epoch's averaged model, and the
summary has the measured epoch time against the predicted one."""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.webapp.integration.stack import child_env, free_port

DEVICES, EPOCHS, BATCHES = 2, 2, 4

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def pipelearn_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    var = tmp_path_factory.mktemp("pipelearn")
    env = child_env(EDGEPIPE_VAR_DIR=str(var), DJANGO_SETTINGS_MODULE="webapp.settings.local")
    result = subprocess.run(
        [sys.executable, "manage.py", "demo", "--pipelearn", "--headless", "--port",
         str(free_port()), "--devices", str(DEVICES), "--epochs", str(EPOCHS), "--batches",
         str(BATCHES)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted((var / "demo" / "logs").glob("*.log")))
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}\n{logs}"
    left = subprocess.run(["pgrep", "-af", str(var)], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"processes left running: {left.stdout}"
    return json.loads(result.stdout.strip().splitlines()[-1]), var / "db.sqlite3"


def query(database: Path, sql: str, *args: Any) -> list[tuple]:
    with sqlite3.connect(database) as db:
        return db.execute(sql, args).fetchall()


def layout(database: Path, run: int) -> tuple[str, list[str], list[int]]:
    """The run's server, its devices (pipeline j is the j-th's) and each one's N."""
    [(document,)] = query(database, "SELECT p.document FROM runs_plan p JOIN runs_run r ON "
                                    "r.chosen_plan_id = p.id WHERE r.id = ?", run)
    plan = json.loads(document)
    clients = plan["clients"]
    return plan["server"], clients, [plan["devices"][c]["parallel_batches"] for c in clients]


def test_the_run_finishes_with_each_epochs_accuracy_and_time(pipelearn_demo) -> None:
    summary, database = pipelearn_demo
    assert summary["state"] == "finished" and summary["kind"] == "pipelearn", summary
    assert summary["method"] == "pipelearn" and summary["clients"] == DEVICES
    evaluated = query(database, "SELECT detail FROM runs_faultevent WHERE run_id = ? AND kind "
                                "= 'round_evaluated'", summary["run"])
    assert len(evaluated) == EPOCHS, evaluated
    _, _, parallel = layout(database, summary["run"])
    # each epoch's averaged model, after pipeline 0's micro-batches of the epoch
    assert sorted(json.loads(d)["applied"] for (d,) in evaluated) == [
        (k + 1) * BATCHES * parallel[0] for k in range(EPOCHS)]
    assert len(summary["test_accuracy"]) == EPOCHS
    assert all(0 <= a <= 1 for a in summary["test_accuracy"])
    assert summary["epochs"] == len(summary["epoch_s_measured"]) == EPOCHS
    assert len(summary["epoch_s_testbed"]) == EPOCHS  # every device's, FedAvg or not
    for key in ("epoch_s_median", "epoch_s_testbed_median", "epoch_s_predicted",
                "epoch_ratio"):
        assert math.isfinite(summary[key]) and summary[key] > 0, (key, summary[key])
    server, clients, _ = layout(database, summary["run"])
    assert set(summary["idle_fraction"]) == {server, *clients}
    assert all(0 <= f <= 1 for f in summary["idle_fraction"].values())


def test_every_device_trains_every_microbatch_and_the_server_both_pipelines(pipelearn_demo
                                                                            ) -> None:
    summary, database = pipelearn_demo
    server, clients, parallel = layout(database, summary["run"])
    for j, (client, n) in enumerate(zip(clients, parallel, strict=True)):
        for stage, device in ((0, client), (1, server)):
            for kind in ("forward", "backward"):
                done = query(database, "SELECT microbatch FROM runs_timelineevent WHERE run_id "
                                       "= ? AND pipeline = ? AND stage = ? AND kind = ? AND "
                                       "device = ? ORDER BY microbatch",
                             summary["run"], j, stage, kind, device)
                assert [m for (m,) in done] == list(range(EPOCHS * BATCHES * n)), (
                    client, stage, kind)
    served = query(database, "SELECT DISTINCT pipeline, stage FROM runs_timelineevent WHERE "
                             "run_id = ? AND device = ? AND kind IN ('forward', 'backward')",
                   summary["run"], server)
    assert sorted(served) == [(j, 1) for j in range(DEVICES)]


def test_every_stage_aggregates_at_each_epochs_end(pipelearn_demo) -> None:
    summary, database = pipelearn_demo
    _, _, parallel = layout(database, summary["run"])
    for j, n in enumerate(parallel):
        per_epoch = BATCHES * n
        for stage in (0, 1):
            rows = query(database, "SELECT kind, microbatch, start, end FROM runs_timelineevent "
                                   "WHERE run_id = ? AND pipeline = ? AND stage = ? AND kind IN "
                                   "('forward', 'backward', 'aggregate')",
                         summary["run"], j, stage)
            aggregates = sorted((start, end, m) for kind, m, start, end in rows
                                if kind == "aggregate")
            assert [m for _, _, m in aggregates] == [
                (k + 1) * per_epoch - 1 for k in range(EPOCHS)], (j, stage, aggregates)
            for k, (start, end, _) in enumerate(aggregates):
                # after the epoch's last pass of this stage, before the next epoch's first
                this_epoch = [e for kind, m, _, e in rows if kind != "aggregate"
                              and m // per_epoch == k]
                next_epoch = [s for kind, m, s, _ in rows if kind != "aggregate"
                              and m // per_epoch == k + 1]
                assert start >= max(this_epoch) - 1e-6, (j, stage, k)
                assert not next_epoch or end <= min(next_epoch) + 1e-6, (j, stage, k)
