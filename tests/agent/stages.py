"""What the executor's and the weights' tests share: stages run on threads, as a pipeline."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

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


def connected_planes(devices: Sequence[str]) -> dict[str, DataPlane]:
    """A data plane for each device on loopback, each knowing every other's address."""
    planes = {d: DataPlane(bind="tcp://127.0.0.1:0") for d in devices}
    for d in devices:
        for peer in devices:
            if peer != d:
                planes[d].connect(peer, planes[peer].address, planes[peer].public_key)
    return planes
