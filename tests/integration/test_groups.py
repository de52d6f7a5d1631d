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


def demo(var: Path, plan: str, *extra: str,
         batches: int = BATCHES) -> tuple[list[dict[str, Any]], list[tuple]]:
    """Run the headless demo with ``plan`` for ``batches``; its plan's stages and its timeline
    events (device, stage, kind, micro-batch, version, start)."""
    env = child_env(EDGEPIPE_VAR_DIR=str(var), DJANGO_SETTINGS_MODULE="webapp.settings.local")
    result = subprocess.run(
        [sys.executable, "manage.py", "demo", "--headless", "--port", str(free_port()),
         "--model", "mlp", "--dataset", "digits", "--plan", plan,
         "--microbatches", str(MICROBATCHES), "--batches", str(batches),
         "--repartition-every", "0",
         # the MLP learns at the runs' default rate; the demo's own for the asynchronous 1F1B
         # (0.02, for VGG-5) would take longer than these short runs to show it
         "--lr", "0.1", *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                     for p in sorted((var / "demo" / "logs").glob("*.log")))
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}\n{logs}"
    summary: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["state"] == "finished" and summary["plan"] == plan, summary
    assert summary["microbatches"] == MICROBATCHES * batches
    assert summary["loss_last"] < 0.7 * summary["loss_first"]
    run = summary["run"]
    with sqlite3.connect(var / "db.sqlite3") as db:
        [(document,)] = db.execute("SELECT document FROM runs_plan p JOIN runs_run r ON "
                                   "r.chosen_plan_id = p.id WHERE r.id = ?", (run,))
        events = db.execute("SELECT device, stage, kind, microbatch, version, start FROM "
                            "runs_timelineevent WHERE run_id = ?", (run,)).fetchall()
    return json.loads(document)["stages"], events


def passes_once(stages: list[dict[str, Any]], events: list[tuple], total: int = TOTAL) -> None:
    """Every micro-batch went forward and back once per stage, on one replica of it."""
    for k, stage in enumerate(stages):
        for kind in ("forward", "backward"):
            done = Counter(e[3] for e in events if e[1] == k and e[2] == kind)
            assert sorted(done) == list(range(total)) and set(done.values()) == {1}, (k, kind)
            assert {e[0] for e in events if e[1] == k and e[2] == kind} <= set(stage["devices"])


@pytest.mark.parametrize("plan", ["bsp", "duanwu", "pipedream"])
def test_a_plan_with_groups_trains_on_the_agents(var: Path, plan: str) -> None:
    stages, timeline = demo(var, plan)
    events = [e[:4] for e in timeline]
    passes_once(stages, timeline)
    if plan == "bsp":  # one stage, every device a replica (the others choose as they find)
        assert [len(s["devices"]) for s in stages] == [3], stages
    for k, stage in enumerate(stages):
        for device in stage["devices"]:  # every replica applies every update, once
            updates = Counter(m for d, s, kd, m in events if d == device and kd == "update")
            assert sorted(updates) == list(range(TOTAL)) and set(updates.values()) == {1}
        if len(stage["devices"]) > 1:  # the replicas shared their gradients
            shared = [m for d, s, kd, m in events if s == k and kd == "aggregate"]
            assert sorted(shared) == list(range(TOTAL))


def test_synchronous_1f1b_trains_with_a_flush_per_batch(var: Path) -> None:
    """``--schedule 1f1b-sync`` on the replicated pipedream plan (lr 0.5 and twice the batches:
    one update per batch is 8x fewer than 1F1B's, so the loss needs more to fall as far):
    1F1B's order (stage 0 starts
    a batch's first backward before its last forward, which GPipe never does), one update per
    batch on every device, and every pass of batch b on weight version b (no stale weights)."""
    batches = 2 * BATCHES
    stages, events = demo(var, "pipedream", "--schedule", "1f1b-sync", "--lr", "0.5",
                          batches=batches)
    passes_once(stages, events, MICROBATCHES * batches)
    for b in range(batches):
        batch = range(b * MICROBATCHES, (b + 1) * MICROBATCHES)
        first = [e for e in events if e[1] == 0 and e[3] in batch]
        assert (min(e[5] for e in first if e[2] == "backward")
                < max(e[5] for e in first if e[2] == "forward")), b
        assert {e[4] for e in events if e[2] in ("forward", "backward") and e[3] in batch} == {b}
    for stage in stages:
        for device in stage["devices"]:
            updates = [e for e in events if e[0] == device and e[2] == "update"]
            assert len(updates) == batches, (device, len(updates))
