"""The feasibility checker rejects each kind of infeasible schedule and says why."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from orchestrator.errors import PlanningError
from orchestrator.sl.check import CONSTRAINTS, check_schedule, first_violation
from orchestrator.sl.formats import Instance, Schedule, Segment


def test_the_hand_made_schedule_is_feasible(tiny: Instance, tiny_schedule: Schedule) -> None:
    assert first_violation(instance=tiny, schedule=tiny_schedule) is None
    check_schedule(instance=tiny, schedule=tiny_schedule)


def _violation(tiny: Instance, schedule: Schedule, constraint: str) -> str:
    found = first_violation(instance=tiny, schedule=schedule)
    assert found is not None
    assert found.constraint == constraint
    return found.message


F, B = "forward", "backward"
# One case per kind of constraint: the change to the feasible schedule of ``tiny_schedule``
# (both clients on helper 0: forwards [0,2) and [2,4), backwards [4,6) and [6,7)) and the
# sentence that must explain it.
CASES: list[tuple[str, dict[str, Any], str]] = [
    ("assignment", {"assignment": (0, 5)},
     "client 1 is assigned to helper 5, which does not exist (helpers are 0..1)"),
    ("helper", {B: (Segment(0, 0, 4, 6), Segment(1, 1, 6, 7))},
     "the backward of client 1 runs on helper 1 in slot 6 but the client is assigned to "
     "helper 0"),
    ("memory", {"assignment": (1, 1), F: (Segment(1, 0, 0, 2), Segment(1, 1, 2, 4)),
                B: (Segment(1, 0, 4, 6), Segment(1, 1, 6, 7))},
     "helper 1 serves clients [0, 1] whose memory demand 2 MB exceeds its capacity 1 MB"),
    ("overlap", {F: (Segment(0, 0, 0, 2), Segment(0, 1, 1, 3))},
     "helper 0 runs two tasks in slot 1: the forward of client 0 and the forward of client 1 "
     "(one task per helper per slot)"),
    ("release", {F: (Segment(0, 1, 0, 2), Segment(0, 0, 2, 4))},
     "the forward of client 1 starts on helper 0 in slot 0, before its release r[1][0] = 1"),
    ("forward", {F: (Segment(0, 0, 0, 1), Segment(0, 1, 2, 4))},
     "the forward of client 0 gets 1 slots on helper 0 but needs 2 (p[0][0] = 2)"),
    ("backward-release", {B: (Segment(0, 0, 7, 9), Segment(0, 1, 5, 6))},
     "the backward of client 1 starts on helper 0 in slot 5, before slot 6 = forward end 4 + "
     "l[1][0] 1 + lp[1][0] 1"),
    ("backward", {B: (Segment(0, 0, 4, 6), Segment(0, 1, 6, 8))},
     "the backward of client 1 gets 2 slots on helper 0 but needs 1 (pp[1][0] = 1)"),
    ("completion", {"completion": (7, 10), "makespan": 10},
     "client 1 completes in slot 9 (backward end 7 + rp[1][0] 2) but the schedule says 10"),
    ("makespan", {"makespan": 8},
     "the makespan is 9 (client 1 completes last) but the schedule says 8"),
]


@pytest.mark.parametrize(("constraint", "change", "message"), CASES, ids=[c[0] for c in CASES])
def test_each_kind_of_violation_is_explained(tiny: Instance, tiny_schedule: Schedule,
                                             constraint: str, change: dict[str, Any],
                                             message: str) -> None:
    assert _violation(tiny, replace(tiny_schedule, **change), constraint) == message


def test_the_overlap_names_helper_and_slot(tiny: Instance, tiny_schedule: Schedule) -> None:
    forward = (Segment(0, 0, 0, 2), Segment(0, 1, 1, 3))
    found = first_violation(instance=tiny, schedule=replace(tiny_schedule, forward=forward))
    assert found is not None and (found.helper, found.client, found.slot) == (0, 1, 1)


def test_assignment_of_the_wrong_length(tiny: Instance, tiny_schedule: Schedule) -> None:
    message = _violation(tiny, replace(tiny_schedule, assignment=(0,)), "assignment")
    assert "names 1 helpers but the instance has 2 clients" in message


def test_missing_backward(tiny: Instance, tiny_schedule: Schedule) -> None:
    backward = (Segment(0, 0, 4, 6),)
    message = _violation(tiny, replace(tiny_schedule, backward=backward), "backward")
    assert "the backward of client 1 gets 0 slots on helper 0 but needs 1" in message


def test_every_constraint_kind_has_a_case() -> None:
    assert [c[0] for c in CASES] == list(CONSTRAINTS)


def test_the_first_violation_in_constraint_order_is_reported(
        tiny: Instance, tiny_schedule: Schedule) -> None:
    # Client 1 before its release and both completions wrong: the release is explained.
    forward = (Segment(0, 1, 0, 2), Segment(0, 0, 2, 4))
    broken = replace(tiny_schedule, forward=forward, completion=(1, 1), makespan=1)
    assert _violation(tiny, broken, "release").startswith("the forward of client 1")


def test_switching_cost_counts_reload_slots(tiny: Instance, tiny_schedule: Schedule) -> None:
    # Client 0's forward cut in two: [0,1) + [3,5) is 3 slots = p 2 + 1 reload slot.
    split = replace(tiny_schedule,
                    forward=(Segment(0, 0, 0, 1), Segment(0, 1, 1, 3), Segment(0, 0, 3, 5)),
                    backward=(Segment(0, 0, 7, 9), Segment(0, 1, 9, 10)),
                    completion=(10, 12), makespan=12)
    assert first_violation(instance=tiny, schedule=replace(split, switch_slots=(1, 1))) is None
    message = _violation(tiny, split, "forward")
    assert message == "the forward of client 0 gets 3 slots on helper 0 but needs 2 (p[0][0] = 2)"
    message = _violation(tiny, replace(split, switch_slots=(2, 0)), "forward")
    assert message == ("the forward of client 0 gets 3 slots on helper 0 but needs 4 (p[0][0] = "
                       "2 + 1 resumptions x 2 reload slots)")


def test_adjacent_segments_are_one_piece(tiny: Instance, tiny_schedule: Schedule) -> None:
    forward = (Segment(0, 0, 0, 1), Segment(0, 0, 1, 2), Segment(0, 1, 2, 4))
    schedule = replace(tiny_schedule, forward=forward, switch_slots=(3, 3))
    assert first_violation(instance=tiny, schedule=schedule) is None


def test_check_schedule_raises_with_the_explanation(tiny: Instance,
                                                    tiny_schedule: Schedule) -> None:
    with pytest.raises(PlanningError, match=r"infeasible schedule for tiny: the makespan is 9"):
        check_schedule(instance=tiny, schedule=replace(tiny_schedule, makespan=8))
