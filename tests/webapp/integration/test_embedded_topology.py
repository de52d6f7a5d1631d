"""The embedded topology, with no Redis and no PostgreSQL: SQLite, the filesystem broker and
file results under a throwaway var/ directory, daphne and a real Celery worker process.

``manage.py serve`` (the laptop's one command) plans a run end to end over HTTP; and a worker
SIGKILLed mid-plan is replaced by one that finishes the plan (the filesystem broker forgets
taken messages, so a starting worker queues unfinished plans again).
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.webapp.integration.stack import (
    Browser,
    Processes,
    child_env,
    demo_admin_password,
    enrol,
    free_port,
    manage,
    plan_through_a_worker_kill,
    resnet_testbed,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def embedded_env(var: Path) -> dict[str, str]:
    return child_env(DJANGO_SETTINGS_MODULE="webapp.settings.local", EDGEPIPE_VAR_DIR=str(var),
                     DEBUG="false")


def sqlite_plans(var: Path, run_id: int) -> dict[str, sqlite3.Row]:
    with sqlite3.connect(var / "db.sqlite3") as db:
        db.row_factory = sqlite3.Row
        rows = db.execute("SELECT * FROM runs_plan WHERE run_id = ?", (run_id,)).fetchall()
    return {row["algorithm"]: row for row in rows}


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "logs"
    folder.mkdir()
    yield folder
    for log in sorted(folder.glob("*.log")):  # shown by pytest only when a test failed
        print(f"----- {log.name}\n{log.read_text(errors='replace')[-4000:]}")


def test_one_command_serves_and_plans_a_run_end_to_end(tmp_path: Path, logs: Path):
    # Prepare: `manage.py serve` with no server around, state under a throwaway var/
    var = tmp_path / "var"
    env = embedded_env(var)
    port = free_port()
    processes = Processes(logs, env)
    try:
        processes.serve(port)
        browser = Browser(f"http://127.0.0.1:{port}", "admin", demo_admin_password(env))
        spec, devices = resnet_testbed()
        spec_id, enrolled = enrol(browser, spec, devices)
        algorithms = ["ftpipehd", "optimal", "bsp"]
        run = browser.post("/api/runs/", {"name": "laptop", "model_spec": spec_id,
                                          "devices": [d["id"] for d in enrolled],
                                          "algorithms": algorithms}, expect=201)
        # Execute
        started = time.monotonic()
        browser.post(f"/api/runs/{run['id']}/plan/", {}, expect=202)
        planned = browser.wait_run(run["id"], ("planned", "failed"), timeout=120)
        elapsed = time.monotonic() - started
        # Assert: plans computed by the worker process, in the SQLite file under var/
        assert planned["state"] == "planned", planned["error"]
        stored = sqlite_plans(var, run["id"])
        assert set(stored) == set(algorithms)
        for plan in stored.values():
            assert plan["status"] == "done" and plan["worker"].startswith("celery@")
            assert json.loads(plan["document"])["stages"]
        assert (var / "celery" / "queue").is_dir()
        # the run page: a snapshot with the plans (the worker's events stay in its process)
        with browser.listen(run["id"]) as page:
            wait_until(lambda: page.messages, timeout=10, what="the run page's snapshot")
        snapshot = page.messages[0]
        assert snapshot["type"] == "snapshot" and snapshot["run"]["state"] == "planned"
        assert {p["algorithm"] for p in snapshot["plans"]} == set(algorithms)
        # the API documentation comes with its scripts and styles, from this server
        html = browser.http.get("/api/docs/").text
        assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', html)
        assert len(assets) >= 3
        for asset in assets:
            assert browser.http.get(asset).status_code == 200, asset
        print(f"embedded: planned {len(algorithms)} algorithms in {elapsed:.2f} s")
    finally:
        processes.stop_all()
    assert processes.procs["serve"].returncode == 0, processes.log("serve")[-3000:]


def test_a_worker_killed_mid_plan_is_replaced_without_losing_the_plan(tmp_path: Path,
                                                                      logs: Path):
    # Prepare: daphne and a worker as separate processes
    var = tmp_path / "var"
    env = embedded_env(var)
    manage(env, "migrate", "--no-input")
    port = free_port()
    processes = Processes(logs, env)
    try:
        processes.web(port)
        processes.worker("alpha")
        browser = Browser(f"http://127.0.0.1:{port}", "admin", demo_admin_password(env))
        # Execute
        planned, recovered_s = plan_through_a_worker_kill(
            browser, processes, lambda run_id: sqlite_plans(var, run_id),
            algorithms=["optimal", "ftpipehd"], worker="alpha", replacement="bravo")
        # Assert
        assert planned["state"] == "planned", planned["error"]
        stored = sqlite_plans(var, planned["id"])
        assert {a: p["status"] for a, p in stored.items()} == {"optimal": "done",
                                                               "ftpipehd": "done"}
        assert stored["optimal"]["attempts"] == 2
        assert stored["optimal"]["worker"].startswith("bravo@")
        print(f"embedded: a new worker finished the killed plan {recovered_s:.1f} s later (the "
              f"optimal planner takes {stored['optimal']['planner_s']:.1f} s)")
    finally:
        processes.stop_all()
