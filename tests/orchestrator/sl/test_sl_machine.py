"""Algorithm 2 (and Jackson's rule) against a brute force over all preemptive schedules."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.sl.machine import Job, Slots, algorithm2, jackson, runs, schedule_cost


def brute_force(jobs: list[Job], blocked: frozenset[int]) -> int:
    """The least max_j C_j + tail_j over every way to fill the slots (idle allowed)."""
    horizon = max(j.release for j in jobs) + sum(j.duration for j in jobs) + len(blocked) + 1

    @functools.cache
    def best(t: int, left: tuple[int, ...]) -> float:
        if not any(left):
            return 0
        if t >= horizon:
            return math.inf
        options = [best(t + 1, left)]
        if t not in blocked:
            for k, job in enumerate(jobs):
                if left[k] and job.release <= t:
                    rest = (*left[:k], left[k] - 1, *left[k + 1:])
                    done = t + 1 + job.tail if rest[k] == 0 else -math.inf
                    options.append(max(done, best(t + 1, rest)))
        return min(options)

    return int(best(0, tuple(j.duration for j in jobs)))


def _valid(jobs: list[Job], blocked: frozenset[int], slots: dict[int, Slots]) -> None:
    used = [t for s in slots.values() for t in s]
    assert len(used) == len(set(used)), "a slot is used twice"
    assert not set(used) & blocked, "a blocked slot is used"
    for job in jobs:
        assert len(slots[job.key]) == job.duration
        assert min(slots[job.key]) >= job.release


jobs_strategy = st.lists(
    st.tuples(st.integers(0, 6), st.integers(1, 3), st.integers(0, 8)), min_size=1, max_size=4)


@pytest.mark.parametrize("scheduler", [algorithm2, jackson], ids=["algorithm2", "jackson"])
@settings(max_examples=300, deadline=None)
@given(raw=jobs_strategy, blocked=st.frozensets(st.integers(0, 10), max_size=5))
def test_optimal_against_brute_force(scheduler: Callable[..., dict[int, Slots]],
                                     raw: list[tuple[int, int, int]],
                                     blocked: frozenset[int]) -> None:
    jobs = [Job(key=k, release=r, duration=d, tail=q) for k, (r, d, q) in enumerate(raw)]
    slots = scheduler(jobs=jobs, blocked=blocked)
    _valid(jobs, blocked, slots)
    assert schedule_cost(jobs=jobs, slots=slots) == brute_force(jobs, blocked)


@settings(max_examples=100, deadline=None)
@given(raw=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 9), st.integers(0, 30)),
                    min_size=1, max_size=25))
def test_algorithm2_and_jackson_agree_on_larger_cases(raw: list[tuple[int, int, int]]) -> None:
    jobs = [Job(key=k, release=r, duration=d, tail=q) for k, (r, d, q) in enumerate(raw)]
    a = algorithm2(jobs=jobs)
    _valid(jobs, frozenset(), a)
    assert schedule_cost(jobs=jobs, slots=a) == schedule_cost(jobs=jobs, slots=jackson(jobs=jobs))


def test_the_cheapest_job_to_end_a_block_goes_last() -> None:
    # Both released at 0; finishing job 1 last costs 4 + 0, job 0 last 4 + 5: job 0 first.
    jobs = [Job(key=0, release=0, duration=2, tail=5), Job(key=1, release=0, duration=2, tail=0)]
    assert algorithm2(jobs=jobs) == {0: (0, 1), 1: (2, 3)}


def test_a_late_urgent_job_preempts() -> None:
    jobs = [Job(key=0, release=0, duration=4, tail=0), Job(key=1, release=1, duration=1, tail=9)]
    slots = algorithm2(jobs=jobs)
    assert slots[1] == (1,)
    assert runs(slots[0]) == [(0, 1), (2, 5)]


def test_blocked_slots_are_skipped() -> None:
    slots = algorithm2(jobs=[Job(key=7, release=0, duration=3)], blocked={1, 2})
    assert slots == {7: (0, 3, 4)}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"key": 0, "release": 0, "duration": 0}, "needs at least one slot"),
    ({"key": 0, "release": -1, "duration": 1}, "negative release -1"),
])
def test_bad_jobs_are_refused(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Job(**kwargs)


def test_duplicate_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="distinct"):
        algorithm2(jobs=[Job(key=1, release=0, duration=1), Job(key=1, release=0, duration=1)])
