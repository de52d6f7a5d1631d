"""One helper as a single machine: preemptive scheduling with release dates, min-max cost.

Tirana et al., "Workflow Optimization for Parallel Split Learning" (INFOCOM 2024), Section IV-B:
once the assignment and the forward schedule are fixed, the backward problem P_b splits into
one problem per helper, 1 | r_j, pmtn | max_j f_j(C_j), solved optimally by their Algorithm 2.
Here every cost is ``f_j(C) = C + tail_j`` (for the backward tasks the tail is r'_ij, the
gradient download and client part-1 backward), and some slots may be ``blocked`` (taken by the
forward tasks already scheduled on the helper). A preemptive schedule never needs a blocked
slot, so the problem is solved on the free slots only, renumbered 0, 1, 2, ..., and mapped back.

- :func:`algorithm2` is the paper's Algorithm 2, Baker, Lawler, Lenstra and Rinnooy Kan's block
  method (Oper. Res. 31(2), 1983): schedule in release order to find the blocks (maximal busy
  periods); in each block the task that is cheapest to finish at the block's end goes last,
  the others are scheduled recursively the same way inside the block, and the last task fills
  the slots they leave free. O(n^2) recursion over the block's slots.
- :func:`jackson` is the preemptive largest-tail-first rule (Jackson / Horn), which is optimal
  for the same problem when every cost is ``C + tail`` and runs in O(n log n); the local search
  of ``auto`` calls it thousands of times. Tests check both reach the same optimum, equal to a
  brute force over all preemptive schedules.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

Slots = tuple[int, ...]


@dataclass(frozen=True)
class Job:
    """A task of ``duration`` slots, released at slot ``release``; finishing at C costs
    ``C + tail`` (C is the end of the task's last slot)."""

    key: int
    release: int
    duration: int
    tail: int = 0

    def __post_init__(self) -> None:
        if self.duration < 1:
            raise ValueError(f"a job needs at least one slot, job {self.key} has "
                             f"duration {self.duration}")
        if self.release < 0:
            raise ValueError(f"job {self.key} has a negative release {self.release}")


@dataclass(frozen=True)
class _Free:
    """The free slots of the machine, in order, long enough for every job to finish."""

    slots: Slots

    @staticmethod
    def of(jobs: Sequence[Job], blocked: Iterable[int]) -> _Free:
        taken = frozenset(blocked)
        horizon = max(j.release for j in jobs) + sum(j.duration for j in jobs) + len(taken) + 1
        return _Free(tuple(t for t in range(horizon) if t not in taken))

    def index(self, slot: int) -> int:
        """The position of the first free slot at or after ``slot``."""
        return bisect.bisect_left(self.slots, slot)


def schedule_cost(*, jobs: Sequence[Job], slots: Mapping[int, Slots]) -> int:
    """The largest ``C_j + tail_j`` of a schedule (0 without jobs)."""
    return max((slots[j.key][-1] + 1 + j.tail for j in jobs), default=0)


def _check_keys(jobs: Sequence[Job]) -> None:
    keys = [j.key for j in jobs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"job keys must be distinct, got {sorted(keys)}")


def algorithm2(*, jobs: Sequence[Job], blocked: Iterable[int] = ()) -> dict[int, Slots]:
    """Optimal preemptive schedule minimising ``max_j C_j + tail_j`` (the paper's Algorithm 2).

    Returns the slots of each job, by key, in increasing order.
    """
    if not jobs:
        return {}
    _check_keys(jobs)
    free = _Free.of(jobs, blocked)
    indexed = [(free.index(j.release), j) for j in jobs]
    out: dict[int, list[int]] = {}
    _blocks_recursive(indexed, free, out)
    return {key: tuple(free.slots[k] for k in idx) for key, idx in out.items()}


def _blocks(indexed: list[tuple[int, Job]]) -> list[tuple[int, int, list[tuple[int, Job]]]]:
    """Step 1 of Algorithm 2: serve in release order; the maximal busy periods are the blocks."""
    blocks: list[tuple[int, int, list[tuple[int, Job]]]] = []
    end = -1
    for rel, job in sorted(indexed, key=lambda rj: (rj[0], rj[1].key)):
        if rel > end or not blocks:
            blocks.append((rel, rel, []))
            end = rel
        start, _, members = blocks[-1]
        end += job.duration
        members.append((rel, job))
        blocks[-1] = (start, end, members)
    return blocks


def _blocks_recursive(indexed: list[tuple[int, Job]], free: _Free,
                      out: dict[int, list[int]]) -> None:
    for start, end, members in _blocks(indexed):
        finish = free.slots[end - 1] + 1
        # Steps 2-3: the task cheapest to complete at the end of the block goes last
        # (ties: the latest released, which it is natural to run last).
        last_rel, last = min(members, key=lambda rj: (finish + rj[1].tail, -rj[0], rj[1].key))
        others = [rj for rj in members if rj[1] is not last]
        # Step 4: the others, recursively, inside the block; the last task takes what is left.
        _blocks_recursive(others, free, out)
        used = {k for _, job in others for k in out[job.key]}
        left = [k for k in range(max(start, last_rel), end) if k not in used]
        if len(left) < last.duration:
            raise AssertionError(f"block [{start}, {end}) leaves {len(left)} slots for job "
                                 f"{last.key} of duration {last.duration}")
        out[last.key] = left[: last.duration]


def jackson(*, jobs: Sequence[Job], blocked: Iterable[int] = ()) -> dict[int, Slots]:
    """Preemptive largest-tail-first: at every free slot run the released unfinished job with
    the largest tail (ties: earliest release, then key). Optimal for ``C + tail`` costs."""
    if not jobs:
        return {}
    _check_keys(jobs)
    free = _Free.of(jobs, blocked)
    order = sorted(((free.index(j.release), j) for j in jobs), key=lambda rj: (rj[0], rj[1].key))
    left = {j.key: j.duration for j in jobs}
    out: dict[int, list[int]] = {j.key: [] for j in jobs}
    ready: list[tuple[int, int, int]] = []
    k = 0
    nxt = 0
    while nxt < len(order) or ready:
        if not ready:
            k = max(k, order[nxt][0])
        while nxt < len(order) and order[nxt][0] <= k:
            rel, job = order[nxt]
            heapq.heappush(ready, (-job.tail, rel, job.key))
            nxt += 1
        _, _, key = ready[0]
        # Run the top job until it finishes or the next release may preempt it.
        until = k + left[key]
        if nxt < len(order):
            until = min(until, order[nxt][0])
        out[key].extend(range(k, until))
        left[key] -= until - k
        k = until
        if left[key] == 0:
            heapq.heappop(ready)
    return {key: tuple(free.slots[i] for i in idx) for key, idx in out.items()}


def runs(slots: Slots) -> list[tuple[int, int]]:
    """Consecutive slots as half-open ranges: (3, 4, 5, 8) -> [(3, 6), (8, 9)]."""
    out: list[tuple[int, int]] = []
    for t in slots:
        if out and out[-1][1] == t:
            out[-1] = (out[-1][0], t + 1)
        else:
            out.append((t, t + 1))
    return out
