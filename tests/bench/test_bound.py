"""bench/bound.py: the batch-time bound no runtime beats. Checked against the schedules'
own action lists run with free sends (each action as soon as its device is free and what it
needs has happened): never faster than the bound, and exactly it where the bound is tight."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.bound import StageTimes, batch_bound_s, stage_times
from orchestrator.schedule import build_schedule


def steady_batch_s(times: list[StageTimes], *, schedule: str, microbatches: int,
                   batches: int = 4) -> float:
    """The time between the last two batches' ends on stage 0, each device running its
    action list in order with nothing to wait for but the passes it needs."""
    count = len(times)
    plan = build_schedule(name=schedule, stage_devices=[[f"d{s}"] for s in range(count)],
                          stage_times_s=[[t.forward_s + t.backward_s] for t in times],
                          microbatches=microbatches * batches, flush_every=microbatches)
    lists = [list(plan.actions[f"d{s}"]) for s in range(count)]
    done: dict[tuple[int, str, int], float] = {}
    free = [0.0] * count
    position = [0] * count
    while any(position[s] < len(lists[s]) for s in range(count)):
        moved = False
        for s in range(count):
            if position[s] == len(lists[s]):
                continue
            action = lists[s][position[s]]
            m = action.microbatch
            needs = {"F": [(s - 1, "F", m)] if s else [],
                     "B": [(s + 1, "B", m)] if s < count - 1 else [(s, "F", m)],
                     "U": []}[action.kind]
            if any(n not in done for n in needs):
                continue
            cost = {"F": times[s].forward_s, "B": times[s].backward_s,
                    "U": times[s].update_s}[action.kind]
            start = max([free[s], *(done[n] for n in needs)])
            free[s] = done[(s, action.kind, m)] = start + cost
            position[s] += 1
            moved = True
        assert moved, "the action lists wait for each other"
    ends = [done[(0, "U", b * microbatches + microbatches - 1)] for b in range(batches)]
    return ends[-1] - ends[-2]


stage = st.builds(StageTimes, st.floats(0.01, 2.0), st.floats(0.01, 2.0), st.floats(0.0, 1.0))


@settings(max_examples=150, deadline=None)
@given(times=st.lists(stage, min_size=2, max_size=4), microbatches=st.integers(1, 8),
       schedule=st.sampled_from(["gpipe", "1f1b-sync"]))
def test_no_synchronous_schedule_runs_a_batch_faster_than_the_bound(times, microbatches,
                                                                    schedule):
    bound = batch_bound_s(times, microbatches=microbatches, cores=len(times),
                          synchronous=True)
    assert steady_batch_s(times, schedule=schedule, microbatches=microbatches) >= bound - 1e-9


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b-sync"])
def test_the_bound_is_what_balanced_stages_take_with_free_sends(schedule):
    times = [StageTimes(0.3, 0.5, 0.2)] * 3
    bound = batch_bound_s(times, microbatches=8, cores=3, synchronous=True)
    assert bound == pytest.approx(2 * 0.8 + 8 * 0.8 + 0.2)
    assert steady_batch_s(times, schedule=schedule, microbatches=8) == pytest.approx(bound)


def test_the_cores_bound_a_pipeline_with_more_stages_than_cores():
    times = [StageTimes(1.0, 1.0, 0.0)] * 3
    assert batch_bound_s(times, microbatches=8, cores=2, synchronous=True) == 24.0
    assert batch_bound_s(times, microbatches=8, cores=2, synchronous=False) == 24.0
    assert batch_bound_s(times, microbatches=8, cores=3, synchronous=False) == 16.0


def test_stage_times_time_each_stage_of_the_cuts():
    times = stage_times(model="mlp", dataset="digits", cuts=[(0, 1), (2, 3)], microbatches=2,
                        batch_size=8, repetitions=3, warmup=1, processes=2)
    assert len(times) == 2
    assert all(t.forward_s > 0 and t.backward_s > 0 and t.update_s > 0 for t in times)
