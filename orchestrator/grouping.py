"""Grouping heterogeneous devices into q virtual workers (Duan and Wu, Algorithm 2).

With more devices than pipeline stages, Duan and Wu pool devices into q virtual workers and
search the grouping by local search: from a starting grouping, move one device to another group
or swap two devices of different groups while that lowers the objective, the period of the
pipeline the partitioner builds on the groups. This module holds the searches; the objective is
a callable so that the grouping stays independent of the partitioner. Groups are kept in a
canonical order (by their first device in the given device order, which is also their order in
the pipeline), so equal groupings compare equal.

- ``group_sorting``: the sorting baseline: devices by speed, dealt to the groups in snake order
  (1, 2, .., q, q, .., 1, ...) so the groups' total speeds come out close.
- ``group_local_search``: Algorithm 2, steepest descent from the sorting grouping.
- ``group_brute_force``: every partition of the devices into q non-empty groups.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence

Groups = list[list[int]]
Objective = Callable[[Groups], float]


def canonical(groups: Sequence[Sequence[int]]) -> Groups:
    return sorted((sorted(g) for g in groups), key=lambda g: g[0])


def _check(num_devices: int, q: int) -> None:
    if not 1 <= q <= num_devices:
        raise ValueError(f"the number of groups must be between 1 and the number of devices "
                         f"({num_devices}), got {q}")


def group_sorting(num_devices: int, q: int, *, speeds: Sequence[float]) -> Groups:
    _check(num_devices, q)
    if len(speeds) != num_devices:
        raise ValueError(f"need one speed per device, got {len(speeds)} for {num_devices}")
    order = sorted(range(num_devices), key=lambda d: (-speeds[d], d))
    groups: Groups = [[] for _ in range(q)]
    for rank, device in enumerate(order):
        lap, slot = divmod(rank, q)
        groups[slot if lap % 2 == 0 else q - 1 - slot].append(device)
    return canonical(groups)


def _neighbours(groups: Groups) -> Iterator[Groups]:
    q = len(groups)
    for src in range(q):
        if len(groups[src]) > 1:
            for device in groups[src]:
                for dst in range(q):
                    if dst != src:
                        moved = [list(g) for g in groups]
                        moved[src].remove(device)
                        moved[dst].append(device)
                        yield canonical(moved)
    for src, dst in itertools.combinations(range(q), 2):
        for x in groups[src]:
            for y in groups[dst]:
                swapped = [list(g) for g in groups]
                swapped[src][swapped[src].index(x)] = y
                swapped[dst][swapped[dst].index(y)] = x
                yield canonical(swapped)


def group_local_search(num_devices: int, q: int, *, objective: Objective,
                       speeds: Sequence[float], start: Groups | None = None,
                       max_rounds: int = 1000) -> Groups:
    """Steepest descent over moves and swaps from ``start`` (the sorting grouping)."""
    current = canonical(start) if start is not None else group_sorting(num_devices, q,
                                                                       speeds=speeds)
    _check(num_devices, len(current))
    seen: dict[tuple[tuple[int, ...], ...], float] = {}

    def score(groups: Groups) -> float:
        key = tuple(tuple(g) for g in groups)
        if key not in seen:
            seen[key] = objective(groups)
        return seen[key]

    value = score(current)
    for _ in range(max_rounds):
        best, best_value = current, value
        for candidate in _neighbours(current):
            v = score(candidate)
            if v < best_value * (1 - 1e-12) or (math.isinf(best_value) and v < best_value):
                best, best_value = candidate, v
        if best is current:
            break
        current, value = best, best_value
    return current


def set_partitions(num_devices: int, q: int) -> Iterator[Groups]:
    """Every partition of devices 0..n-1 into q non-empty groups (restricted growth strings)."""
    _check(num_devices, q)
    labels = [0] * num_devices

    def extend(i: int, used: int) -> Iterator[Groups]:
        if num_devices - i < q - used:
            return
        if i == num_devices:
            groups: Groups = [[] for _ in range(q)]
            for device, label in enumerate(labels):
                groups[label].append(device)
            yield groups
            return
        for label in range(min(used + 1, q)):
            labels[i] = label
            yield from extend(i + 1, max(used, label + 1))

    labels[0] = 0
    yield from extend(1, 1) if num_devices > 0 else iter(())


def group_brute_force(num_devices: int, q: int, *, objective: Objective) -> Groups:
    best: Groups | None = None
    best_value = math.inf
    for groups in set_partitions(num_devices, q):
        value = objective(groups)
        if best is None or value < best_value:
            best, best_value = groups, value
    assert best is not None
    return best
