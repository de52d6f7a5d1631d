"""What the executor's and the weights' tests share: stages run on threads, as a pipeline."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from agent.transport import DataPlane


def run_stages(run: Callable[[int], None], count: int, planes: Iterable[DataPlane]) -> None:
    """``run(k)`` for each stage k < ``count``, each on its own thread, to its end (at most
    120 s); then close the stages' data planes."""
    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for plane in planes:
        plane.close()
