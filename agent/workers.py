"""The agent's worker threads and its heap: torch work on threads that set their own torch
thread count, and what the agent holds for good left out of the garbage collector's full
collections."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

import torch


def spawn(target: Callable[[], None], name: str, *, threads: int | None) -> threading.Thread:
    """Start a daemon worker thread for torch work. torch.set_num_threads from the main thread
    does not reach other threads' OpenMP teams: a thread that does not set it runs each op on
    a team of every core, which made small layers many times slower, so each sets it
    itself."""

    def run() -> None:
        if threads:
            torch.set_num_threads(threads)
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def freeze_heap() -> None:
    """Leave what the agent holds for good (torch's and the other modules' objects, a
    deployed stage's model and data) out of the garbage collector's full collections, which
    otherwise walk it all while every thread waits: a pipeline's stages stood still for each,
    and its run fell well short of its prediction (docs/benchmarks.md, "Measurements behind
    choices in the agent")."""
    gc.collect()
    gc.freeze()
