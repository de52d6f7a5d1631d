"""Schedules as data: the action string form, and the shape of 1F1B and GPipe lists."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.schedule import Action, assign_replicas, build_schedule, format_schedule


def test_action_string_round_trip() -> None:
    for text in ("0F0", "3B12", "1A7", "2U41"):
        assert str(Action.parse(text)) == text
    with pytest.raises(ValueError, match="not an action: 'F3'"):
        Action.parse("F3")
    with pytest.raises(ValueError, match="unknown action kind 'X'"):
        Action(0, "X", 0)


@given(st.integers(1, 6), st.integers(1, 40), st.sampled_from(["1f1b", "gpipe"]))
def test_every_microbatch_once_per_stage_in_a_runnable_order(stages: int, microbatches: int,
                                                             name: str) -> None:
    sched = build_schedule(name=name, stage_devices=[[f"d{k}"] for k in range(stages)],
                           stage_times_s=[[1.0]] * stages, microbatches=microbatches,
                           flush_every=max(1, microbatches // 3))
    for k in range(stages):
        acts = sched.actions[f"d{k}"]
        forwards = [a.microbatch for a in acts if a.kind == "F"]
        backwards = [a.microbatch for a in acts if a.kind == "B"]
        assert sorted(forwards) == list(range(microbatches))
        assert sorted(backwards) == list(range(microbatches))
        position = {(a.kind, a.microbatch): i for i, a in enumerate(acts)}
        assert all(position[("F", m)] < position[("B", m)] for m in range(microbatches))
        if name == "1f1b":
            in_flight = peak = 0
            for a in acts:
                in_flight += {"F": 1, "B": -1}.get(a.kind, 0)
                peak = max(peak, in_flight)
            assert peak == min(stages - k, microbatches)  # PipeDream's S - k stash depth
            assert sum(a.kind == "U" for a in acts) == microbatches  # update after each backward


def test_gpipe_flushes_and_replicas_all_reduce() -> None:
    sched = build_schedule(name="gpipe", stage_devices=[["a"], ["b", "c"]],
                           stage_times_s=[[1.0], [1.0, 1.0]], microbatches=4, flush_every=2)
    assert [str(a) for a in sched.actions["a"]] == ["0F0", "0F1", "0B0", "0B1", "0U1",
                                                    "0F2", "0F3", "0B2", "0B3", "0U3"]
    for device in ("b", "c"):
        kinds = [a.kind for a in sched.actions[device]]
        assert kinds.count("A") == 2 and kinds.count("U") == 2


def test_replicas_share_microbatches_by_speed() -> None:
    owner = assign_replicas([1.0, 3.0], 40)
    assert owner.count(0) == 30 and owner.count(1) == 10
    sched = build_schedule(name="1f1b", stage_devices=[["fast", "slow"], ["z"]],
                           stage_times_s=[[1.0, 3.0], [1.0]], microbatches=8)
    assert sorted(sched.replica[0]) == sorted(["fast"] * 6 + ["slow"] * 2)
    assert "A" in {a.kind for a in sched.actions["slow"]}


def test_inflight_override_and_validation() -> None:
    sched = build_schedule(name="1f1b", stage_devices=[["a"], ["b"]], stage_times_s=[[1], [1]],
                           microbatches=10, inflight=[4, 1])
    assert [a.kind for a in sched.actions["a"][:5]] == ["F", "F", "F", "F", "B"]
    with pytest.raises(ValueError, match="one positive depth per stage"):
        build_schedule(name="1f1b", stage_devices=[["a"]], stage_times_s=[[1]],
                       microbatches=2, inflight=[0])
    with pytest.raises(ValueError, match="schedule must be one of"):
        build_schedule(name="zb-h1", stage_devices=[["a"]], stage_times_s=[[1]], microbatches=2)
    table = format_schedule(sched)
    assert table.splitlines()[1].split() == ["0", "0F0", "1F0"]
