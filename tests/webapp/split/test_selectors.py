"""Reading split-learning studies: the comparison ranks the computed schedules by makespan with
their gaps, and a schedule's Gantt has a row per helper and per client with the right bars."""

from __future__ import annotations

import pytest

from orchestrator.sl import parse_instance, parse_schedule
from orchestrator.sl.exact import simple_lower_bound
from tests.webapp.split.factories import SplitScheduleFactory, SplitStudyFactory
from webapp.split import selectors

pytestmark = pytest.mark.django_db


def bound_of(study) -> int:
    return simple_lower_bound(instance=parse_instance(study.instance))


def test_compare_ranks_done_schedules_by_makespan_with_gaps_then_the_rest():
    study = SplitStudyFactory()
    lb = bound_of(study)
    exact = SplitScheduleFactory(study=study, method="exact", status="pending", makespan=None,
                                 solver_s=None)
    fcfs = SplitScheduleFactory(study=study, method="random-fcfs", makespan=2 * lb)
    admm = SplitScheduleFactory(study=study, method="admm", status="failed", makespan=None,
                                error="no assignment fits")
    greedy = SplitScheduleFactory(study=study, method="balanced-greedy", makespan=lb + 1)
    auto = SplitScheduleFactory(study=study, method="auto", makespan=lb, lower_bound=lb)
    compare = selectors.split_compare(study=study)
    rows = compare["rows"]
    assert [r["schedule"] for r in rows] == [auto.pk, greedy.pk, fcfs.pk, exact.pk, admm.pk]
    assert compare["best"] == auto.pk
    assert compare["lower_bound"] == lb and compare["lower_bound_from"] == "simple"
    assert [r["gap_to_best"] for r in rows[:3]] == [0.0, pytest.approx(1 / lb), 1.0]
    assert [r["gap_to_bound"] for r in rows[:3]] == [0.0, pytest.approx(1 / lb), 1.0]
    assert rows[0]["makespan_s"] == pytest.approx(lb * 0.1)
    assert rows[3]["gap_to_best"] is None and rows[3]["status"] == "pending"
    assert rows[4]["error"] == "no assignment fits"
    assert compare["reason"] == (f"auto has the shortest makespan ({lb} slots, {lb * 0.1:.1f} s)"
                                 f", 50% shorter than random-fcfs ({2 * lb} slots); it is "
                                 "optimal (it meets the lower bound)")


def test_compare_uses_the_bound_the_exact_method_proved_and_names_ties():
    study = SplitStudyFactory()
    lb = bound_of(study)
    a = SplitScheduleFactory(study=study, method="exact", makespan=lb + 4, lower_bound=lb + 2,
                             solver_s=0.5)
    b = SplitScheduleFactory(study=study, method="balanced-greedy", makespan=lb + 4,
                             solver_s=0.001)
    compare = selectors.split_compare(study=study)
    assert [r["schedule"] for r in compare["rows"]] == [b.pk, a.pk]  # ties: the faster first
    assert compare["lower_bound"] == lb + 2 and compare["lower_bound_from"] == "exact"
    assert compare["rows"][0]["gap_to_bound"] == pytest.approx(2 / (lb + 2))
    assert compare["reason"].startswith(
        f"balanced-greedy and exact share the shortest makespan ({lb + 4} slots")
    assert lb == 10  # the tiny instance's: so the gap is 2 / 12
    assert compare["reason"].endswith("; it is at most 17% above the optimum (lower bound 12 "
                                      "slots)")


def test_compare_of_a_study_with_nothing_computed_has_no_best():
    study = SplitStudyFactory()
    SplitScheduleFactory(study=study, status="running", makespan=None)
    compare = selectors.split_compare(study=study)
    assert compare["best"] is None and compare["reason"] == ""
    assert selectors.split_study_status(study=study) == "running"


def test_a_gantt_has_each_helper_then_each_client_with_every_slot_of_the_schedule(solved):
    study = solved(["random-fcfs"], seed=2)
    row = study.schedules.get()
    gantt = selectors.split_schedule_gantt(schedule=row)
    inst = parse_instance(study.instance)
    sch = parse_schedule(row.schedule)
    assert [r["label"] for r in gantt["rows"]] == [
        "helper 0", "helper 1", *(f"client {j} (h{sch.assignment[j]})" for j in range(3))]
    assert gantt["makespan"] == row.makespan and gantt["slot_ms"] == 100.0
    bars = gantt["bars"]
    for j in range(3):
        i = sch.assignment[j]
        on_helper = [b for b in bars if b["row"] == i and b["client"] == j]
        assert sum(b["end"] - b["start"] for b in on_helper if b["kind"] == "forward") == \
            inst.p[j][i]
        assert sum(b["end"] - b["start"] for b in on_helper if b["kind"] == "backward") == \
            inst.pp[j][i]
        own = {b["kind"]: b for b in bars if b["row"] == 2 + j}
        assert (own["client-forward"]["start"], own["client-forward"]["end"]) == (0, inst.r[j][i])
        forward_end = max(s.end for s in sch.forward if s.client == j)
        assert own["client-loss"]["start"] == forward_end
        assert own["client-backward"]["end"] == forward_end + inst.l[j][i] + inst.lp[j][i]
        assert own["client-finish"]["end"] == sch.completion[j]
    assert {b["kind"] for b in bars} == {*selectors.HELPER_KINDS, *selectors.CLIENT_KINDS}


def test_the_shared_instances_are_offered_with_their_sizes():
    choices = selectors.shared_instance_choices()
    files = selectors.shared_instance_files()
    assert files == ["data/sl/resnet101_cifar10.jsonl", "data/sl/resnet101_mnist.jsonl"]
    assert len(choices) == 72
    first = next(c for c in choices if c.file == files[1] and c.index == 0)
    assert (first.clients, first.helpers, first.source) == (5, 2, f"{files[1]}#0")
