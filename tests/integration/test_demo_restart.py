"""The demo as a place to experiment (issue: fault injection ended the demo): *Stop agent*
through the API the run page uses, the testbed survives, the run recovers without the agent;
*Restart agent* starts it again and its device rejoins the run, which finishes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.webapp.integration.stack import child_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_the_demo_survives_stop_agent_and_restart_agent_brings_the_device_back(
        tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "integration" / "stop_restart.py"),
         str(tmp_path)], cwd=ROOT, env=child_env(), capture_output=True, text=True,
        timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["summary"]["state"] == "finished", out["summary"]
    assert out["stop"]["sent"] == "exit" and out["restart"]["device"] == out["uid"]
    assert out["restarted"], "the restarted agent's process is not running"
    lost = [(kind, device) for kind, _, device in out["faults"]
            if kind in ("device_lost", "device_joined")]
    assert lost[:2] == [("device_lost", out["uid"]), ("device_joined", out["uid"])], lost
    # the survivors trained without it after the stop
    _, _, stages = next(g for g in out["generations"] if g[1] == "failure")
    assert out["uid"] not in {d for s in stages for d in s["devices"]}
