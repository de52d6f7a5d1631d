"""Split learning on real agents: `manage.py demo --split --headless` with two clients and one
helper (web server, Celery worker and three agent processes on this machine, the embedded
default) trains two rounds of six batches; every client trains every batch, the helper serves
both pipelines, every stage of every pipeline aggregates at each round's end, and the summary
has each round's training figures and the measured batch makespan against the plan's
(orchestrator.sl.measured, tested in tests/orchestrator/test_sl_measured.py)."""

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

CLIENTS, ROUNDS, BATCHES = 2, 2, 6
TRAINED = ROUNDS * BATCHES


@pytest.fixture(scope="module")
def split_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    var = tmp_path_factory.mktemp("split")
    env = child_env(EDGEPIPE_VAR_DIR=str(var), DJANGO_SETTINGS_MODULE="webapp.settings.local")
    result = subprocess.run(
        [sys.executable, "manage.py", "demo", "--split", "--headless", "--port",
         str(free_port()), "--clients", str(CLIENTS), "--helpers", "1", "--rounds",
         str(ROUNDS), "--batches", str(BATCHES), "--time-limit", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted((var / "demo" / "logs").glob("*.log")))
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}\n{logs}"
    left = subprocess.run(["pgrep", "-af", str(var)], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"processes left running: {left.stdout}"
    return json.loads(result.stdout.strip().splitlines()[-1]), var / "db.sqlite3"


def events(database: Path, query: str, *args: Any) -> list[tuple]:
    with sqlite3.connect(database) as db:
        return db.execute(query, args).fetchall()


def roles(database: Path, run: int) -> tuple[list[str], list[str]]:
    [(split,)] = events(database, "SELECT split FROM runs_run WHERE id = ?", run)
    settings = json.loads(split)
    return settings["clients"], settings["helpers"]


@pytest.mark.integration
@pytest.mark.slow
def test_the_split_run_finishes_with_each_rounds_figures(split_demo) -> None:
    summary, _ = split_demo
    assert summary["state"] == "finished" and summary["kind"] == "split", summary
    assert (summary["clients"], summary["helpers"]) == (CLIENTS, 1)
    assert summary["batches_trained"] == TRAINED
    assert [r["round"] for r in summary["rounds"]] == list(range(ROUNDS))
    for r in summary["rounds"]:  # every client's part-3 reported every batch of the round
        assert r["points"] == CLIENTS * BATCHES, summary["rounds"]
        assert 0 < r["loss"] < 10 and 0 <= r["accuracy"] <= 1
        assert 0 <= r["test_accuracy"] <= 1  # the aggregated model's, measured by the server
    assert summary["makespan_planned_s"] > 0
    assert math.isfinite(summary["makespan_ratio"]) and summary["makespan_ratio"] > 0
    assert math.isfinite(summary["round_batch_ratio"]) and summary["round_batch_ratio"] > 0


@pytest.mark.integration
@pytest.mark.slow
def test_every_client_trains_every_batch_and_the_helper_serves_both(split_demo) -> None:
    summary, database = split_demo
    clients, [helper] = roles(database, summary["run"])
    for j, client in enumerate(clients):
        for kind in ("forward", "backward"):
            done = events(database, "SELECT microbatch FROM runs_timelineevent WHERE run_id = ? "
                                    "AND stage = 0 AND pipeline = ? AND kind = ? AND device = ? "
                                    "ORDER BY microbatch", summary["run"], j, kind, client)
            assert [m for (m,) in done] == list(range(TRAINED)), (client, kind)
    served = events(database, "SELECT DISTINCT pipeline, stage FROM runs_timelineevent WHERE "
                              "run_id = ? AND device = ? AND kind IN ('forward', 'backward')",
                    summary["run"], helper)
    assert sorted(served) == [(j, 1) for j in range(CLIENTS)]


@pytest.mark.integration
@pytest.mark.slow
def test_every_stage_of_every_pipeline_aggregates_at_each_rounds_end(split_demo) -> None:
    summary, database = split_demo
    for j in range(CLIENTS):
        for stage in range(3):
            rows = events(database, "SELECT kind, microbatch, start, end FROM runs_timelineevent"
                                    " WHERE run_id = ? AND pipeline = ? AND stage = ? AND kind "
                                    "IN ('forward', 'backward', 'aggregate')",
                          summary["run"], j, stage)
            aggregates = sorted((start, end) for kind, _, start, end in rows
                                if kind == "aggregate")
            assert len(aggregates) == ROUNDS, (j, stage, aggregates)
            for r, (start, end) in enumerate(aggregates):
                # after the round's last pass of this stage, before the next round's first
                this_round = [e for k, m, _, e in rows if k in ("forward", "backward")
                              and m // BATCHES == r]
                next_round = [s for k, m, s, _ in rows if k in ("forward", "backward")
                              and m // BATCHES == r + 1]
                assert start >= max(this_round) - 1e-6, (j, stage, r)
                assert not next_round or end <= min(next_round) + 1e-6, (j, stage, r)
