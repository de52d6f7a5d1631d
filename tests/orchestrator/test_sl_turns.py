"""A helper's turns: a preempted task's segments as runs of layers of the client's part-2."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.sl.runtime import HelperTask
from orchestrator.sl.turns import HelperTurn, helper_turns, task_layers
from tests.orchestrator.test_sl_runtime import preemptive_schedule


def test_a_task_run_whole_is_one_turn_over_all_its_layers() -> None:
    task = HelperTask(0, "forward", ((3, 7),))
    assert task_layers(task=task, layers=(2, 5), layer_s=[1.0] * 4) == ((0, (2, 5)),)


def test_a_preempted_forward_runs_its_first_layers_first_a_backward_its_last() -> None:
    # two segments of 2 slots each over four layers of equal time: two layers each
    forward = HelperTask(0, "forward", ((0, 2), (5, 7)))
    assert task_layers(task=forward, layers=(2, 5), layer_s=[1.0] * 4) == (
        (0, (2, 3)), (1, (4, 5)))
    backward = HelperTask(0, "backward", ((0, 2), (5, 7)))
    assert task_layers(task=backward, layers=(2, 5), layer_s=[1.0] * 4) == (
        (0, (4, 5)), (1, (2, 3)))
    # by the layers' time, not their count: the first layer is three quarters of the pass
    assert task_layers(task=forward, layers=(2, 5), layer_s=[3.0, 0.4, 0.3, 0.3]) == (
        (0, (2, 2)), (1, (3, 5)))


def test_a_segment_too_short_for_a_layer_runs_with_the_next_and_reloads_are_not_work(
) -> None:
    # one slot of ten over two layers of equal time: the first segment gets no layer
    task = HelperTask(1, "forward", ((0, 1), (4, 13)))
    assert task_layers(task=task, layers=(0, 1), layer_s=[1.0, 1.0]) == ((1, (0, 1)),)
    # a 3-slot segment after a 2-slot one, with 1 reload slot: 2 and 2 slots of work
    task = HelperTask(1, "forward", ((0, 2), (5, 8)))
    assert task_layers(task=task, layers=(0, 3), layer_s=[1.0] * 4,
                       switch_slots=1) == ((0, (0, 1)), (1, (2, 3)))
    with pytest.raises(ValueError, match=r"layer_s: needs one time per layer 0\.\.3"):
        task_layers(task=task, layers=(0, 3), layer_s=[1.0])


@given(segments=st.lists(st.integers(1, 5), min_size=1, max_size=6),
       times=st.lists(st.floats(0.0, 3.0), min_size=1, max_size=8),
       kind=st.sampled_from(["forward", "backward"]))
def test_the_turns_of_a_task_run_every_layer_once_in_the_passs_order(
        segments: list[int], times: list[float], kind: str) -> None:
    starts, at = [], 0
    for length in segments:
        starts.append((at, at + length))
        at += length + 1
    parts = task_layers(task=HelperTask(0, kind, tuple(starts)), layers=(3, 3 + len(times) - 1),
                        layer_s=times)
    run = [layer for _, (a, e) in parts for layer in
           (range(a, e + 1) if kind == "forward" else range(e, a - 1, -1))]
    assert run == (list(range(3, 3 + len(times))) if kind == "forward"
                   else list(range(3 + len(times) - 1, 2, -1)))
    assert [k for k, _ in parts] == sorted({k for k, _ in parts})  # in segment order


def test_a_helpers_turns_follow_its_segments_starts() -> None:
    inst, schedule = preemptive_schedule()
    # helper 0: client 0's forward preempted by client 1's (slots 0-1 then 2-4), over part-2
    # layers 1..4 of equal time: one slot of three for the first segment, one layer of four
    turns = helper_turns(instance=inst, schedule=schedule, helper=0,
                         parts2=[(1, 4), (1, 4), (1, 4)], forward_s=[1.0] * 6,
                         backward_s=[2.0] * 6)
    assert turns == (
        HelperTurn(0, "forward", (1, 1), 0), HelperTurn(1, "forward", (1, 4), 1),
        HelperTurn(0, "forward", (2, 4), 2), HelperTurn(1, "backward", (1, 4), 4),
        HelperTurn(0, "backward", (1, 4), 6))
    with pytest.raises(ValueError, match="parts2: needs one layer range per client"):
        helper_turns(instance=inst, schedule=schedule, helper=0, parts2=[(1, 4)],
                     forward_s=[1.0] * 6, backward_s=[1.0] * 6)
