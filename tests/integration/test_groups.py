"""Plans that serve a stage with a group of devices train on real agents: `manage.py demo
--headless --plan bsp|duanwu|pipedream` on the demo testbed (three agent processes, one 4x
slower, one on a slow link), the MLP on digits. Every micro-batch goes forward and back once per
stage (on one replica of it), and every replica of a stage applies every micro-batch's update
once, in order: the replicas train what one device would (docs/architecture.md, "Replicated
stages and two lanes")."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.webapp.integration.stack import child_env, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MICROBATCHES, BATCHES = 8, 30
TOTAL = MICROBATCHES * BATCHES


@pytest.fixture(scope="module")
def var(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("groups")  # shared: later runs reuse the profiles


@pytest.mark.parametrize("plan", ["bsp", "duanwu", "pipedream"])
def test_a_plan_with_groups_trains_on_the_agents(var: Path, plan: str) -> None:
    env = child_env(EDGEPIPE_VAR_DIR=str(var), DJANGO_SETTINGS_MODULE="webapp.settings.local")
    result = subprocess.run(
        [sys.executable, "manage.py", "demo", "--headless", "--port", str(free_port()),
         "--model", "mlp", "--dataset", "digits", "--plan", plan,
         "--microbatches", str(MICROBATCHES), "--batches", str(BATCHES),
         "--repartition-every", "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                     for p in sorted((var / "demo" / "logs").glob("*.log")))
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}\n{logs}"
    summary: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["state"] == "finished" and summary["plan"] == plan, summary
    assert summary["microbatches"] == TOTAL
    assert summary["loss_last"] < 0.7 * summary["loss_first"]
    run = summary["run"]
    with sqlite3.connect(var / "db.sqlite3") as db:
        [(document,)] = db.execute("SELECT document FROM runs_plan p JOIN runs_run r ON "
                                   "r.chosen_plan_id = p.id WHERE r.id = ?", (run,))
        events = db.execute("SELECT device, stage, kind, microbatch FROM runs_timelineevent "
                            "WHERE run_id = ?", (run,)).fetchall()
    stages = json.loads(document)["stages"]
    if plan == "bsp":  # one stage, every device a replica (the others choose as they find)
        assert [len(s["devices"]) for s in stages] == [3], stages
    for k, stage in enumerate(stages):
        for kind in ("forward", "backward"):
            done = Counter(m for d, s, kd, m in events if s == k and kd == kind)
            assert sorted(done) == list(range(TOTAL)) and set(done.values()) == {1}, (k, kind)
            assert {d for d, s, kd, _ in events if s == k and kd == kind} <= set(stage["devices"])
        for device in stage["devices"]:  # every replica applies every update, once
            updates = Counter(m for d, s, kd, m in events if d == device and kd == "update")
            assert sorted(updates) == list(range(TOTAL)) and set(updates.values()) == {1}
        if len(stage["devices"]) > 1:  # the replicas shared their gradients
            shared = [m for d, s, kd, m in events if s == k and kd == "aggregate"]
            assert sorted(shared) == list(range(TOTAL))
