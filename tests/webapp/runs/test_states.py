"""Every transition of the run state machine, legal or not, through the service."""

import itertools

import pytest

from tests.webapp.factories import RunFactory
from webapp.common.exceptions import IllegalTransition
from webapp.runs import services
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db

STATES = ["draft", "planning", "planned", "starting", "running", "recovering", "paused",
          "finished", "failed", "cancelled"]

# Spelled out here, independently of webapp.runs.states, so that a change there shows.
LEGAL = {
    ("draft", "planning"), ("draft", "cancelled"),
    ("planning", "planned"), ("planning", "failed"), ("planning", "cancelled"),
    ("planned", "planning"), ("planned", "starting"), ("planned", "cancelled"),
    ("starting", "running"), ("starting", "recovering"), ("starting", "failed"),
    ("starting", "cancelled"),
    ("running", "recovering"), ("running", "paused"), ("running", "finished"),
    ("running", "failed"), ("running", "cancelled"),
    ("recovering", "running"), ("recovering", "paused"), ("recovering", "failed"),
    ("recovering", "cancelled"),
    ("paused", "running"), ("paused", "recovering"), ("paused", "failed"), ("paused", "cancelled"),
    ("failed", "planning"),
}


def test_the_states_are_the_runs_states():
    assert sorted(STATES) == sorted(Run.State.values)


@pytest.mark.parametrize(("state", "target"), sorted(LEGAL))
def test_legal_transition_is_made(state, target):
    run = RunFactory(state=state)
    services.run_transition(run=run, target=target)
    run.refresh_from_db()
    assert run.state == target


@pytest.mark.parametrize(("state", "target"), [
    pair for pair in itertools.product(STATES, STATES) if pair not in LEGAL])
def test_illegal_transition_is_refused_and_changes_nothing(state, target):
    run = RunFactory(state=state)
    with pytest.raises(IllegalTransition) as caught:
        services.run_transition(run=run, target=target, action="test")
    assert caught.value.state == state and caught.value.transition == f"{state} -> {target}"
    run.refresh_from_db()
    assert run.state == state


def test_a_transition_checks_the_state_in_the_database_not_the_stale_object():
    run = RunFactory(state="draft")
    Run.objects.filter(pk=run.pk).update(state="cancelled")
    with pytest.raises(IllegalTransition, match="cancelled"):
        services.run_transition(run=run, target="planning")
