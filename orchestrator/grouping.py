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
- ``group_local_search``: Algorithm 2, steepest descent from the sorting grouping and from a few
  seeded random groupings, keeping the best. A grouping that does not fit in memory scores
  infinity, which gives a descent nowhere to go, so among such groupings an ``overflow``
  measure (how far from fitting) leads the way.
- ``group_brute_force``: every partition of the devices into q non-empty groups.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterator, Sequence

Groups = list[list[int]]
Objective = Callable[[Groups], float]
Score = tuple[float, float]


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


def _better(a: Score, b: Score) -> bool:
    if a[0] != b[0]:
        return a[0] < b[0] * (1 - 1e-12) or math.isinf(b[0])
    return a[1] < b[1] * (1 - 1e-12)


def _descend(current: Groups, score: Callable[[Groups], Score], max_rounds: int
             ) -> tuple[Groups, Score]:
    value = score(current)
    for _ in range(max_rounds):
        best, best_value = current, value
        for candidate in _neighbours(current):
            v = score(candidate)
            if _better(v, best_value):
                best, best_value = candidate, v
        if best is current:
            break
        current, value = best, best_value
    return current, value


def random_grouping(num_devices: int, q: int, rng: random.Random) -> Groups:
    """A uniformly shuffled grouping with every group non-empty."""
    _check(num_devices, q)
    labels = list(range(q)) + [rng.randrange(q) for _ in range(num_devices - q)]
    rng.shuffle(labels)
    return canonical([[d for d in range(num_devices) if labels[d] == g] for g in range(q)])


def group_local_search(num_devices: int, q: int, *, objective: Objective,
                       speeds: Sequence[float], overflow: Objective | None = None,
                       restarts: int = 3, seed: int = 0, max_rounds: int = 1000) -> Groups:
    """Steepest descent over moves and swaps from the sorting grouping and from ``restarts``
    seeded random groupings; the best local optimum. ``overflow`` ranks groupings whose
    objective is infinite (it is not called for the others)."""
    _check(num_devices, q)
    seen: dict[tuple[tuple[int, ...], ...], Score] = {}

    def score(groups: Groups) -> Score:
        key = tuple(tuple(g) for g in groups)
        if key not in seen:
            value = objective(groups)
            repair = overflow(groups) if overflow is not None and math.isinf(value) else 0.0
            seen[key] = (value, repair)
        return seen[key]

    rng = random.Random(seed)
    starts = [group_sorting(num_devices, q, speeds=speeds)]
    starts += [random_grouping(num_devices, q, rng) for _ in range(restarts)]
    best, best_value = _descend(starts[0], score, max_rounds)
    for start in starts[1:]:
        found, value = _descend(start, score, max_rounds)
        if _better(value, best_value):
            best, best_value = found, value
    return best


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
