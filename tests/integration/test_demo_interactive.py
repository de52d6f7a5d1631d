"""The README's first command, as a user runs it: `manage.py demo` without --headless or
--batches trains until Ctrl-C. Its run once asked for a million batches, whose schedule each
agent built whole on deploy: the agents grew to 7 GB each and the run never left "starting",
while every test ran the headless demo's 100 batches. Here the MLP on digits, real agents:
the run trains, and Ctrl-C (SIGINT to the demo's process group, as a terminal sends it) stops
the run, then every process the demo started."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.webapp.integration.stack import child_env, free_port, listening, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def stored(var: Path, query: str) -> list[tuple]:
    if not (var / "db.sqlite3").exists():
        return []
    try:
        with sqlite3.connect(var / "db.sqlite3", timeout=10) as db:
            return db.execute(query).fetchall()
    except sqlite3.OperationalError:  # not migrated yet, or locked for a moment
        return []


def test_the_interactive_demo_trains_until_ctrl_c(tmp_path: Path) -> None:
    # Prepare: the demo as the README starts it, on a small model
    port = free_port()
    env = child_env(EDGEPIPE_VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="webapp.settings.local")
    out = open(tmp_path / "demo.out", "wb")  # noqa: SIM115  (closed below)
    demo = subprocess.Popen(
        [sys.executable, "manage.py", "demo", "--port", str(port), "--model", "mlp",
         "--dataset", "digits"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        start_new_session=True)
    printed = (tmp_path / "demo.out").read_text
    try:
        # Execute: wait until its run has trained some micro-batches, then Ctrl-C
        def updates() -> int:
            if demo.poll() is not None:
                raise AssertionError(f"the demo exited with {demo.returncode}:\n"
                                     f"{printed()[-3000:]}")
            [(count,)] = stored(tmp_path, "SELECT COUNT(*) FROM runs_timelineevent WHERE "
                                          "kind = 'update'") or [(0,)]
            return int(count) >= 3 * 40  # each of the 3 stages updated 40 times

        wait_until(updates, timeout=600, what="the demo's run to train", interval=1.0)
        [(run, total)] = stored(tmp_path, "SELECT id, batches * microbatches FROM runs_run")
        os.killpg(demo.pid, signal.SIGINT)
        demo.wait(timeout=180)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
        out.close()

    # Assert: the run was the most a run may train, and Ctrl-C stopped it and then everything
    from orchestrator.schedule import MAX_MICROBATCHES

    log = printed()
    assert total == MAX_MICROBATCHES, log[-2000:]
    assert "it trains 6,250 batches, or until Ctrl-C" in log
    assert f"run {run} stopped" in log, log[-2000:]
    assert stored(tmp_path, f"SELECT state FROM runs_run WHERE id = {run}") == [("cancelled",)]
    assert not listening(port)
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"processes left running: {left.stdout}"
