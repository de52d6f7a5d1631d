"""bench/pipelearn_runtime.py at its quick size (a server and two devices, the MLP on digits,
two epochs of three iterations a method) on real agent processes: a table row per method and
a JSON line with every figure. No timing is asserted (CI machines are loaded): only that
every method trained every epoch and that every figure is there."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys

import pytest

from bench.pipelearn_runtime import METHODS, QUICK
from tests.conftest import ROOT
from tests.webapp.integration.stack import child_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_quick_run_trains_and_reports_every_method() -> None:
    # Execute: the quick testbed, the three methods one after the other
    bench = subprocess.Popen([sys.executable, str(ROOT / "bench" / "pipelearn_runtime.py"),
                              "--quick"], cwd=ROOT, env=child_env(), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = bench.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        bench.send_signal(signal.SIGINT)  # the testbed stops its processes
        out, err = bench.communicate(timeout=120)
        pytest.fail(f"bench/pipelearn_runtime.py --quick took over 10 minutes:\n{err[-3000:]}")

    # Assert: a table row per method, then one JSON line
    assert bench.returncode == 0, err[-4000:]
    lines = out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["bench"] == "pipelearn_runtime" and summary["warm"] is True
    assert (summary["devices"], summary["epochs"]) == (QUICK["devices"], QUICK["epochs"])
    rows = {row["method"]: row for row in summary["methods"]}
    assert list(rows) == list(METHODS)
    for method, row in rows.items():
        assert any(line.startswith(method) for line in lines[:-1]), method
        assert row["state"] == "finished" and row["epochs"] == QUICK["epochs"], row
        assert len(row["test_accuracy"]) == QUICK["epochs"]  # each epoch's, held out
        assert 0 <= row["final_accuracy"] <= 1
        for key in ("epoch_s_median", "epoch_s_predicted", "ratio"):
            assert math.isfinite(row[key]) and row[key] > 0, (method, key)
        assert len(row["device_idle"]) == QUICK["devices"]
        assert all(0 <= f <= 1 for f in row["device_idle"].values())
        assert len(row["plan"]) == QUICK["devices"]
        assert isinstance(row["unaveraged"], list)  # FL and SFL: every part in a FedAvg
        assert method == "pipelearn" or row["unaveraged"] == []
    assert rows["fl"]["server_idle"] is None  # the server trains nothing under FL
    assert 0 <= rows["pipelearn"]["server_idle"] <= 1
    assert all(d["parallel_batches"] == 1 for d in rows["sfl"]["plan"].values())
    assert set(summary["speedup"]) == {"sfl", "fl"}
    for gain in summary["speedup"].values():
        assert math.isfinite(gain["measured"]) and gain["measured"] > 0
    left = subprocess.run(["pgrep", "-af", summary["var_dir"]], capture_output=True,
                          text=True)
    assert left.stdout.strip() == "", f"processes left running: {left.stdout}"
