"""The shared topology on this machine's real servers: PostgreSQL (a throwaway database),
Redis (keys under a throwaway prefix), daphne and Celery workers as separate processes.

A run is planned through the API and its plans land in PostgreSQL, with the worker's progress
reaching the run page over the Redis channel layer; a worker SIGKILLed in the middle of a slow
plan is replaced and the run still finishes planning, with nothing lost.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import redis

from tests.conftest import ROOT
from tests.webapp.integration.stack import (
    Browser,
    Processes,
    child_env,
    demo_admin_password,
    enrol,
    free_port,
    listening,
    manage,
    plan_through_a_worker_kill,
    resnet_testbed,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REDIS_URL = "redis://127.0.0.1:6379/0"
POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
VISIBILITY_TIMEOUT_S = 5


@dataclass
class Shared:
    processes: Processes
    browser: Browser
    database: str

    def plans(self, run_id: int) -> dict[str, dict[str, object]]:
        """The run's plans as PostgreSQL has them."""
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{self.database}") as db:
            rows = db.execute(
                "SELECT algorithm, status, period_s, simulated_throughput_sps, attempts, worker, "
                "memory_ok, document, error, planner_s FROM runs_plan WHERE run_id = %s", (run_id,))
            names = [c.name for c in rows.description]
            return {row[0]: dict(zip(names, row, strict=True)) for row in rows.fetchall()}


def require_servers() -> None:
    missing = [f"{name} on 127.0.0.1:{port}" for name, port in (("Redis", 6379),
                                                                 ("PostgreSQL", 5432))
               if not listening(port)]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not reachable: the integration tests need the "
                    "real servers (.ci/run installs and starts them)", pytrace=False)


@contextlib.contextmanager
def throwaway_servers(**settings: str) -> Iterator[tuple[dict[str, str], str]]:
    """The environment of the shared topology on a PostgreSQL database and Redis keys of its
    own (dropped and deleted after), with ``settings`` added; and the database's name."""
    require_servers()
    name = f"edgepipe_it_{uuid.uuid4().hex[:10]}"
    prefix = f"edgepipe-it-{name[-10:]}"
    with psycopg.connect(POSTGRES, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    env = child_env(DJANGO_SETTINGS_MODULE="webapp.settings.production",
                    SECRET_KEY=uuid.uuid4().hex * 2,
                    DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{name}",
                    REDIS_URL=REDIS_URL, REDIS_KEY_PREFIX=prefix,
                    CELERY_TASK_DEFAULT_QUEUE=prefix, **settings)
    try:
        yield env, name
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    with throwaway_servers(CELERY_VISIBILITY_TIMEOUT_S=str(VISIBILITY_TIMEOUT_S)) as (env, name):
        logs = tmp_path_factory.mktemp("shared-logs")
        processes = Processes(logs, env)
        try:
            manage(env, "migrate", "--no-input")
            password = demo_admin_password(env)
            port = free_port()
            processes.web(port)
            processes.worker("alpha")
            yield Shared(processes, Browser(f"http://127.0.0.1:{port}", "admin", password),
                         name)
        finally:
            processes.stop_all()
            print_logs(logs)


def print_logs(logs: Path) -> None:
    """Shown by pytest only when a test failed."""
    for log in sorted(logs.glob("*.log")):
        print(f"----- {log.name}\n{log.read_text(errors='replace')[-4000:]}")


def test_a_run_planned_through_the_api_has_its_plans_in_postgresql(shared: Shared):
    # Prepare: the ResNet-101 testbed enrolled and profiled by its agents, a run page open
    browser = shared.browser
    spec, devices = resnet_testbed()
    spec_id, enrolled = enrol(browser, spec, devices)
    algorithms = ["ftpipehd", "optimal", "pipedream", "bsp", "uniform", "duanwu"]
    run = browser.post("/api/runs/", {"name": "resnet-101 on the lab", "model_spec": spec_id,
                                      "devices": [d["id"] for d in enrolled],
                                      "algorithms": algorithms, "microbatches": 4}, expect=201)
    # Execute
    with browser.listen(run["id"]) as page:
        started = time.monotonic()
        browser.post(f"/api/runs/{run['id']}/plan/", {}, expect=202)
        planned = browser.wait_run(run["id"], ("planned", "failed"), timeout=120)
        elapsed = time.monotonic() - started
        wait_until(lambda: sum(p["status"] == "done" for p in page.plans()) == len(algorithms),
                   timeout=10, what="a done event per plan on the run page")
        # the run's own "planned" event follows the last plan's (a page that stopped
        # listening at the last plan's missed it once, on a loaded CI machine)
        wait_until(lambda: any(m["type"] == "run" and m["run"]["state"] == "planned"
                               for m in page.messages),
                   timeout=10, what="the run's planned event on the run page")
    # Assert: every plan computed by the worker and stored in PostgreSQL
    assert planned["state"] == "planned", planned["error"]
    stored = shared.plans(run["id"])
    assert set(stored) == set(algorithms)
    uids = {d["uid"] for d in enrolled}
    for algorithm, plan in stored.items():
        assert plan["status"] == "done", plan["error"]
        assert plan["worker"].startswith("alpha@") and plan["attempts"] == 1
        assert plan["period_s"] > 0 and plan["simulated_throughput_sps"] > 0
        assert {d for s in plan["document"]["stages"] for d in s["devices"]} <= uids
        assert plan["document"]["algorithm"] == algorithm
    compared = browser.get(f"/api/runs/{run['id']}/plans/compare/")
    assert compared["rows"][0]["algorithm"] == "optimal"
    # the worker's progress reached the page through the Redis channel layer
    assert page.messages[0]["type"] == "snapshot"
    assert any(p["status"] == "running" and p["worker"].startswith("alpha@")
               for p in page.plans())
    assert [m["run"]["state"] for m in page.messages if m["type"] == "run"] == [
        "planning", "planned"]
    print(f"planned {len(algorithms)} algorithms on the testbed in {elapsed:.2f} s")


def test_killing_the_worker_mid_planning_loses_no_plan(shared: Shared):
    # Prepare, Execute: SIGKILL the worker (and its pool) while it computes the optimal plan
    algorithms = ["optimal", "pipedream", "ftpipehd", "uniform"]
    planned, recovered_s = plan_through_a_worker_kill(
        shared.browser, shared.processes, shared.plans, algorithms=algorithms,
        worker="alpha", replacement="bravo")
    # Assert: the killed task was redelivered to the new worker and every plan is done
    assert planned["state"] == "planned", planned["error"]
    stored = shared.plans(planned["id"])
    assert {a: p["status"] for a, p in stored.items()} == {a: "done" for a in algorithms}
    assert stored["optimal"]["attempts"] == 2
    assert stored["optimal"]["worker"].startswith("bravo@")
    assert len({s["devices"][0] for s in stored["optimal"]["document"]["stages"]}) > 1
    print(f"killed the worker mid-plan; a new worker finished planning {recovered_s:.1f} s later "
          f"(visibility timeout {VISIBILITY_TIMEOUT_S} s; the optimal planner takes "
          f"{stored['optimal']['planner_s']:.1f} s)")


def test_two_web_processes_and_two_workers_recover_a_run_with_nothing_lost(
        tmp_path: Path) -> None:
    # failure detection lived in one web process's memory (a probe's answer reaching the other
    # one was dropped); the agents here are spread over two web processes on Redis and
    # PostgreSQL, an agent is killed mid-run, and the run recovers on the others
    with throwaway_servers() as (env, _):
        result = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "integration" / "two_webs.py"),
             str(tmp_path), str(free_port()), str(free_port())],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}"
                     for p in sorted((tmp_path / "demo" / "logs").glob("*.log")))
    assert result.returncode == 0, f"{result.stderr[-4000:]}\n{logs}"
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(set(out["processes"].values())) == 2, out["processes"]  # both web processes
    assert out["summary"]["state"] == "finished", out["summary"]
    lost = [f for f in out["faults"] if f[0] == "device_lost"]
    assert lost and {f[1] for f in lost} == {out["summary"]["faults"][0]["device"]}
    assert "recovered" in [f[0] for f in out["faults"]]
    assert out["updated"] == list(range(out["total"]))  # every micro-batch trained


def test_an_events_batch_and_a_stage_report_do_not_deadlock() -> None:
    # an events batch locked the device's membership of the run and then, through its rows'
    # foreign key, the run's row; a stage report locks the run, then the membership: on
    # PostgreSQL both waited a second and one failed ("deadlock detected"), and the probes
    # answered meanwhile came too late: every device of the run was declared lost
    with throwaway_servers() as (env, _):
        result = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "integration" / "lock_order.py")],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out == {"errors": [], "stored": 1}


def test_a_consumer_idle_longer_than_the_redis_read_timeout_keeps_waiting() -> None:
    # redis-py 8 reads with a 5 s socket timeout and channels_redis blocks 5 s in BZPOPMIN:
    # every consumer idle for 5 s failed ("Timeout reading") and its WebSocket closed (1011)
    require_servers()
    script = """
import asyncio, os, sys, time
sys.path.insert(0, os.getcwd())
from channels_redis.core import RedisChannelLayer
from webapp.settings import base
config = base.CHANNEL_LAYERS["default"]["CONFIG"]
async def main():
    layer = RedisChannelLayer(**{**config, "prefix": config["prefix"] + ":idle-test"})
    channel = await layer.new_channel()
    try:
        await asyncio.wait_for(layer.receive(channel), 7)
    except asyncio.TimeoutError:
        print("still waiting after 7 s")
asyncio.run(main())
"""
    env = child_env(REDIS_URL=REDIS_URL, REDIS_KEY_PREFIX=f"edgepipe-it-{uuid.uuid4().hex[:8]}")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "still waiting after 7 s" in result.stdout, (
        result.stderr[-2000:])
