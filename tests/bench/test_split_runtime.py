"""bench/split_runtime.py: every split-learning method's schedule trained by real stage
executors, its measured makespan per batch set against its plan. The structure of what it
reports, not its timing (speed targets live in the bench's own output)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import pytest
import torch

from bench.split_runtime import METHODS, STEPS, main


@pytest.fixture(autouse=True)
def _torch_threads() -> Iterator[None]:
    # each stage's thread sets torch's threads to one: give the suite back its own
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_a_quick_run_trains_and_reports_every_method(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    # Execute: the quick testbed (four clients, two helpers), five batches a method
    assert main(["--quick", "--batches", "5", "--exact-limit", "3"]) == 0
    out = capsys.readouterr().out.strip().splitlines()

    # Assert: a table row per method and a last JSON line with its figures
    summary = json.loads(out[-1])
    assert summary["bench"] == "split_runtime" and summary["batches"] == 5
    rows = {row["method"]: row for row in summary["methods"]}
    assert set(rows) | set(summary["skipped"]) == set(METHODS)
    assert {"random-fcfs", "balanced-greedy", "admm", "auto"} <= set(rows)
    for method, row in rows.items():
        assert any(line.startswith(method) for line in out[:-1]), method
        assert row["batches_trained"] == 5, method  # every batch, on every client
        assert len(row["measured_s"]) == 5 - summary["warmup"]
        for key in ("planned_s", "replayed_s", "measured_median_s", "ratio"):
            assert math.isfinite(row[key]) and row[key] > 0, (method, key)
        assert row["measured_min_s"] <= row["measured_median_s"] <= row["measured_max_s"]
        assert row["planned_s"] == pytest.approx(row["makespan_slots"] * summary["slot_ms"]
                                                 / 1000)
        assert set(row["excess_ms"]) == set(STEPS) and 0 <= row["release_skew_ms"] < 1000
        # each helper took its clients' passes in the schedule's order, and the labels
        # never left the clients
        assert row["orders_kept"], method
        assert row["messages_to_helpers"] > 0 and row["labels_sent_to_helpers"] == 0
    assert sorted(summary["ranking_planned"]) == sorted(summary["ranking_measured"]) == sorted(
        rows)
    assert summary["instance"]["clients"] == len(summary["clients"]) == 4
