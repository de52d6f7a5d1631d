"""Schedules as data: the action string form, and the shape of 1F1B and GPipe lists."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.schedule import (
    Action,
    ForwardGate,
    assign_replicas,
    build_schedule,
    format_schedule,
    forward_gates,
    reference_version,
)


def test_action_string_round_trip() -> None:
    for text in ("0F0", "3B12", "1A7", "2U41"):
        assert str(Action.parse(text)) == text
    with pytest.raises(ValueError, match="not an action: 'F3'"):
        Action.parse("F3")
    with pytest.raises(ValueError, match="unknown action kind 'X'"):
        Action(0, "X", 0)


@given(st.integers(1, 6), st.integers(1, 40), st.sampled_from(["1f1b", "1f1b-sync", "gpipe"]))
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
        else:  # one update per batch, after its every backward (the flush)
            flush = max(1, microbatches // 3)
            updates = [i for i, a in enumerate(acts) if a.kind == "U"]
            assert len(updates) == -(-microbatches // flush)
            for m in range(microbatches):
                assert position[("B", m)] < updates[m // flush]
                assert m < flush or position[("F", m)] > updates[m // flush - 1]
        if name == "1f1b-sync":  # 1F1B's depth within each batch
            in_flight = peak = 0
            for a in acts:
                in_flight += {"F": 1, "B": -1}.get(a.kind, 0)
                peak = max(peak, in_flight)
            assert peak == min(stages - k, flush)


def test_gpipe_flushes_and_replicas_all_reduce() -> None:
    sched = build_schedule(name="gpipe", stage_devices=[["a"], ["b", "c"]],
                           stage_times_s=[[1.0], [1.0, 1.0]], microbatches=4, flush_every=2)
    assert [str(a) for a in sched.actions["a"]] == ["0F0", "0F1", "0B0", "0B1", "0U1",
                                                    "0F2", "0F3", "0B2", "0B3", "0U3"]
    for device in ("b", "c"):
        kinds = [a.kind for a in sched.actions[device]]
        assert kinds.count("A") == 2 and kinds.count("U") == 2


def test_synchronous_1f1b_is_1f1b_order_with_a_flush_per_batch() -> None:
    sched = build_schedule(name="1f1b-sync", stage_devices=[["a"], ["b"], ["c"]],
                           stage_times_s=[[1.0]] * 3, microbatches=8, flush_every=4)
    # torch's Schedule1F1B order on stage 0 of 3 (Megatron's PipeDream-flush)
    assert " ".join(map(str, sched.actions["a"])) == (
        "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3 0U3 0F4 0F5 0F6 0B4 0F7 0B5 0B6 0B7 0U7")
    assert " ".join(map(str, sched.actions["c"][:9])) == "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3 2U3"
    replicated = build_schedule(name="1f1b-sync", stage_devices=[["a", "b"], ["c"]],
                                stage_times_s=[[1.0, 1.0], [1.0]], microbatches=4)
    # a replica keeps the span of the pipeline one device would (depth 2: micro-batches 1
    # and 2, not its own 1 and 3)
    assert " ".join(map(str, replicated.actions["b"])) == "0F1 0B1 0F3 0B3 0A3 0U3"
    # two lanes: a forward runs beside the backward before it within a batch, on the batch's
    # weights; the first forward after a flush waits for its update
    gates = forward_gates(sched.actions["a"], name="1f1b-sync", two_lanes=True)
    assert gates[4] == ForwardGate(started=1, finished=0, updates=0)  # 0F3 beside 0B0
    assert gates[9] == ForwardGate(started=5, finished=5, updates=1)  # 0F4 after 0U3
    assert gates[13] == ForwardGate(started=6, finished=5, updates=1)  # 0F7 beside 0B4


def test_replicas_share_microbatches_by_speed() -> None:
    owner = assign_replicas([1.0, 3.0], 40)
    assert owner.count(0) == 30 and owner.count(1) == 10
    sched = build_schedule(name="1f1b", stage_devices=[["fast", "slow"], ["z"]],
                           stage_times_s=[[1.0, 3.0], [1.0]], microbatches=8)
    assert sorted(sched.replica[0]) == sorted(["fast"] * 6 + ["slow"] * 2)
    assert "A" in {a.kind for a in sched.actions["slow"]}


def test_a_pipelines_actions_carry_its_number_and_nothing_else_changes() -> None:
    # each action of a pipeline other than 0 is made anew with its number (not copied with
    # dataclasses.replace, which took half of building a schedule of 50,000 micro-batches)
    kw = dict(name="1f1b-sync", stage_devices=[["a"], ["b"]], stage_times_s=[[1.0], [1.0]],
              microbatches=8, flush_every=4)
    zero, third = build_schedule(**kw), build_schedule(**kw, pipeline=3)  # type: ignore[arg-type]
    for device in ("a", "b"):
        assert all(a.pipeline == 0 for a in zero.actions[device])
        assert all(a.pipeline == 3 for a in third.actions[device])
        assert [(a.stage, a.kind, a.microbatch) for a in third.actions[device]] == [
            (a.stage, a.kind, a.microbatch) for a in zero.actions[device]]
    assert str(third.actions["b"][0]) == "p3:1F0"
    with pytest.raises(ValueError, match="must not be negative"):
        Action(0, "F", 0, pipeline=-1)


@given(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=4), st.integers(0, 60))
def test_one_replica_takes_every_microbatch_as_the_general_rule_gives(
        times: list[float], microbatches: int) -> None:
    # a stage of one device skips the search; the search gives it every micro-batch too
    owner = assign_replicas(times, microbatches)
    assert len(owner) == microbatches and set(owner) <= set(range(len(times)))
    if len(times) == 1:
        assert owner == [0] * microbatches == assign_replicas([*times, 1e9], microbatches)


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


@given(st.lists(st.integers(1, 3), min_size=1, max_size=4), st.integers(1, 30),
       st.integers(1, 6), st.lists(st.floats(0.2, 5.0), min_size=12, max_size=12))
def test_replicas_forward_their_own_and_apply_every_update_in_order(
        groups: list[int], microbatches: int, extra_depth: int, times: list[float]) -> None:
    stage_devices = [[f"s{k}r{r}" for r in range(n)] for k, n in enumerate(groups)]
    stage_times = [[times[(3 * k + r) % 12] for r in range(n)] for k, n in enumerate(groups)]
    depths = [len(groups) - k + extra_depth - 1 for k in range(len(groups))]
    lags = [d + extra_depth % 3 for d in depths]
    sched = build_schedule(name="1f1b", stage_devices=stage_devices, stage_times_s=stage_times,
                           microbatches=microbatches, inflight=depths, lag=lags)
    for k, devices in enumerate(stage_devices):
        forwarded: list[int] = []
        for device in devices:
            acts = sched.actions[device]
            own = [m for m in range(microbatches) if sched.device_for(k, m) == device]
            assert sorted(a.microbatch for a in acts if a.kind == "F") == own
            assert [a.microbatch for a in acts if a.kind == "B"] == own  # in order
            updates = [a.microbatch for a in acts if a.kind == "U"]
            forwarded += [a.microbatch for a in acts if a.kind == "F"]
            if len(devices) == 1:
                assert updates == own
                continue
            assert updates == list(range(microbatches))  # every update, in order, everywhere
            for i, a in enumerate(acts):
                if a.kind == "B":  # each own backward shares its gradient at once
                    assert acts[i + 1] == Action(k, "A", a.microbatch)
            gates = sched.gates(device)
            for position, gate in gates.items():
                m = acts[position].microbatch
                assert gate.updates == reference_version(m, lags[k])  # as one device would
                applied = sum(1 for a in acts[:position] if a.kind == "U")
                assert gate.updates <= applied
        assert sorted(forwarded) == list(range(microbatches))


def test_a_replica_applies_the_updates_its_next_forward_needs_just_before_it() -> None:
    # one stage (in-flight depth 1) on two replicas whose forwards lag 3 micro-batches behind
    sched = build_schedule(name="1f1b", stage_devices=[["a", "b"]], stage_times_s=[[1.0, 1.0]],
                           microbatches=6, inflight=[1], lag=[3])
    assert " ".join(map(str, sched.actions["a"])) == \
        "0F0 0B0 0A0 0F2 0B2 0A2 0U0 0U1 0F4 0B4 0A4 0U2 0U3 0U4 0U5"
    assert " ".join(map(str, sched.actions["b"])) == \
        "0F1 0B1 0A1 0U0 0F3 0B3 0A3 0U1 0U2 0F5 0B5 0A5 0U3 0U4 0U5"
    # b forwards 3 on version 1 (the update of 0, which a sends), as one device keeping 3 in
    # flight would: every replica applies every update, in order, and no backward waits
    position = sched.actions["b"].index(Action(0, "F", 3))
    assert sched.gates("b")[position] == ForwardGate(started=3, finished=3, updates=1)


def test_two_lanes_overlap_a_forward_with_the_backward_before_it() -> None:
    acts = build_schedule(name="1f1b", stage_devices=[["a"], ["b"]], stage_times_s=[[1], [1]],
                          microbatches=4, two_lanes=["a"]).actions["a"]
    assert " ".join(map(str, acts)) == "0F0 0F1 0B0 0U0 0F2 0B1 0U1 0F3 0B2 0U2 0B3 0U3"
    gates = forward_gates(acts, name="1f1b", two_lanes=True)
    # 0F2 may start once 0B0 has started, on the weights before 0U0: version 0, not 1
    assert gates[4] == ForwardGate(started=1, finished=0, updates=0)
    assert gates[7] == ForwardGate(started=3, finished=2, updates=1)
    one_lane = forward_gates(acts, name="1f1b", two_lanes=False)
    assert one_lane[4] == ForwardGate(started=2, finished=2, updates=1)
    # under GPipe a forward of the next batch waits for the flush's update, on either lane
    gpipe = build_schedule(name="gpipe", stage_devices=[["a"]], stage_times_s=[[1]],
                           microbatches=4, flush_every=2).actions["a"]
    assert forward_gates(gpipe, name="gpipe", two_lanes=True)[5] == ForwardGate(3, 3, 1)
