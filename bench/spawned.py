"""Run functions in fresh spawned processes and wait for them: what bench/bound.py (one
process timing the stages) and bench/torchpipe.py (one process per rank) both do."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from typing import Any


def run_spawned(jobs: Sequence[tuple[str, Callable[..., None], tuple[Any, ...]]], *,
                timeout_s: float, what: str) -> None:
    """Start each ``(name, target, args)`` in a spawned process and wait for all of them,
    ``timeout_s`` in all. RuntimeError naming ``what``: when one is still running at the
    deadline (every one is killed then), or when one exited non-zero (naming it)."""
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=target, args=args, name=name)
                 for name, target, args in jobs]
    for process in processes:
        process.start()
    deadline = time.monotonic() + timeout_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    if any(p.is_alive() for p in processes):
        for process in processes:
            process.kill()
            process.join(5)
        raise RuntimeError(f"{what} did not finish in {timeout_s:.0f} s")
    failed = [f"{p.name} (exit {p.exitcode})" for p in processes if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"{what} failed: {', '.join(failed)}")
