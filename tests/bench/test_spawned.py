"""bench/spawned.py: the spawned jobs of bench/bound.py and bench/torchpipe.py are waited for,
and a job that fails or outlives the deadline is said, by name."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from bench.spawned import run_spawned


def write(path: str, text: str) -> None:
    Path(path).write_text(text)


def fail(code: int) -> None:
    sys.exit(code)


def hang() -> None:
    time.sleep(600)


def test_every_job_runs_to_the_end(tmp_path: Path) -> None:
    run_spawned([(f"job-{k}", write, (str(tmp_path / f"{k}.txt"), str(k))) for k in range(3)],
                timeout_s=120, what="writing")
    assert [(tmp_path / f"{k}.txt").read_text() for k in range(3)] == ["0", "1", "2"]


def test_a_job_that_fails_is_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"writing failed: job-1 \(exit 3\)"):
        run_spawned([("job-0", write, (str(tmp_path / "0.txt"), "0")), ("job-1", fail, (3,))],
                    timeout_s=120, what="writing")


def test_a_job_past_the_deadline_is_killed() -> None:
    begun = time.monotonic()
    with pytest.raises(RuntimeError, match="hanging did not finish in 3 s"):
        run_spawned([("job-0", hang, ())], timeout_s=3, what="hanging")
    assert time.monotonic() - begun < 300  # killed, not waited for
