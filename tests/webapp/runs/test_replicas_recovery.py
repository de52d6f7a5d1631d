"""Global replicas while a recovery resumes from a chosen point: the replicas there are what the
next generation restores from, so a halted stage's late uploads past it are refused (409) and
none at it is deleted to keep a range's two newest (webapp.runs.replicas)."""

from __future__ import annotations

import pytest

from tests.webapp.runs.test_replicas import plan_document, put, staged_run, url, weights
from webapp.runs.models import Run, WeightReplica

pytestmark = pytest.mark.django_db


def recovering(run: Run, *, resume: int, next_plan: dict) -> None:
    """The run re-planned: its next generation resumes at ``resume``."""
    run.state = Run.State.RECOVERING
    run.recovery = {"generation": 1, "lost": [], "next_plan": next_plan, "resume": resume}
    run.save(update_fields=["state", "recovery"])


def applied(first: int, last: int) -> list[int]:
    return sorted(WeightReplica.objects.filter(first=first, last=last)
                  .values_list("applied", flat=True))


def test_late_uploads_past_the_resume_point_neither_land_nor_evict_it(agent) -> None:
    # a stage far ahead of the others (its uploads queued behind the training) sent layers
    # 0..2 at 160 and 240 after the recovery had planned to restore them from 80: the server
    # kept the two newest of the range, deleted 80, and the new stage's download was a 404
    run, (a, _) = staged_run()
    assert put(agent(a), run, 0, 2, 80, weights(0, 2)).status_code == 201
    recovering(run, resume=80, next_plan=plan_document((0, 5, [a])))
    for late in (160, 240):
        answer = put(agent(a), run, 0, 2, late, weights(0, 2))
        assert answer.status_code == 409, answer.content
        assert "recovering from applied 80" in answer.json()["detail"]
    assert applied(0, 2) == [80]
    assert agent(a).get(url(run, 0, 2, 80)).status_code == 200


def test_a_new_stage_s_resume_point_is_taken_past_replicas_of_the_abandoned_training(
        agent) -> None:
    # uploads past the resume point that landed before the re-plan are training the recovery
    # does again: they neither refuse the resume point's replica nor outlast it
    run, (a, b) = staged_run()
    for late in (160, 240):
        assert put(agent(a), run, 0, 2, late, weights(0, 2)).status_code == 201
    recovering(run, resume=80, next_plan=plan_document((0, 2, [a]), (3, 5, [b])))
    assert put(agent(a), run, 0, 2, 80, weights(0, 2)).status_code == 201  # the resume point
    assert put(agent(a), run, 0, 2, 40, weights(0, 2)).status_code == 201
    assert put(agent(a), run, 0, 2, 60, weights(0, 2)).status_code == 201  # 40 goes
    assert applied(0, 2) == [60, 80, 160, 240]
