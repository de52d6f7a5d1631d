"""Brute force over every plan of a small instance: the oracle the planners are tested against.

``brute_force_ordered`` tries every way to cut the layers over all devices in the given order
(what FTPipeHD's programme optimises); ``brute_force_any`` also tries every subset and order of
the devices (what ``optimal`` optimises). Only memory-feasible plans count. The number of plans
grows as C(L-1, N-1) and N!, so callers keep instances small.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from orchestrator.cost import CostModel, evaluate
from orchestrator.partition.common import RawStage, to_stages


def compositions(num_layers: int, parts: int) -> Iterator[list[tuple[int, int]]]:
    """Every split of layers 0..num_layers-1 into ``parts`` non-empty contiguous ranges."""
    for cuts in itertools.combinations(range(1, num_layers), parts - 1):
        bounds = (0, *cuts, num_layers)
        yield [(bounds[k], bounds[k + 1] - 1) for k in range(parts)]


def _best(cm: CostModel, orders: Iterator[Sequence[int]]) -> tuple[list[RawStage], float] | None:
    best: tuple[list[RawStage], float] | None = None
    for order in orders:
        if len(order) > cm.num_layers:
            continue
        for ranges in compositions(cm.num_layers, len(order)):
            raw: list[RawStage] = [(a, e, (d,)) for (a, e), d in zip(ranges, order, strict=True)]
            prediction = evaluate(cm, to_stages(cm, raw))
            if prediction.memory_ok and (best is None or prediction.period_s < best[1]):
                best = (raw, prediction.period_s)
    return best


def brute_force_ordered(cm: CostModel, order: Sequence[int]) -> tuple[list[RawStage], float] | None:
    return _best(cm, iter([order]))


def brute_force_any(cm: CostModel) -> tuple[list[RawStage], float] | None:
    n = cm.num_devices
    orders = (perm for size in range(1, n + 1)
              for perm in itertools.permutations(range(n), size))
    return _best(cm, orders)
