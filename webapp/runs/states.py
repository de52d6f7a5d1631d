"""The run state machine: which state may follow which. Pure data and one check."""

from __future__ import annotations

from django.db import models

from webapp.common.exceptions import IllegalTransition


class RunState(models.TextChoices):
    DRAFT = "draft"
    PLANNING = "planning"
    PLANNED = "planned"
    STARTING = "starting"
    RUNNING = "running"
    RECOVERING = "recovering"
    PAUSED = "paused"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


S = RunState

TRANSITIONS: dict[str, frozenset[str]] = {
    S.DRAFT: frozenset({S.PLANNING, S.CANCELLED}),
    # planning ends when every plan is computed: planned if one fits, failed otherwise
    S.PLANNING: frozenset({S.PLANNED, S.FAILED, S.CANCELLED}),
    # planned: plan again (other algorithms, new profiles) or start the chosen plan
    S.PLANNED: frozenset({S.PLANNING, S.STARTING, S.CANCELLED}),
    # starting: a device lost while the stages deploy makes the run start on the others
    S.STARTING: frozenset({S.RUNNING, S.RECOVERING, S.FAILED, S.CANCELLED}),
    S.RUNNING: frozenset({S.RECOVERING, S.PAUSED, S.FINISHED, S.FAILED, S.CANCELLED}),
    # a recovery ends running, or paused when the run was paused before or during it
    S.RECOVERING: frozenset({S.RUNNING, S.PAUSED, S.FAILED, S.CANCELLED}),
    # a paused run that loses a device recovers, and ends its recovery paused
    S.PAUSED: frozenset({S.RUNNING, S.RECOVERING, S.FAILED, S.CANCELLED}),
    S.FINISHED: frozenset(),
    # a failed run may be planned again (after a planning error is fixed, say)
    S.FAILED: frozenset({S.PLANNING}),
    S.CANCELLED: frozenset(),
}

ACTIVE = frozenset({S.STARTING, S.RUNNING, S.RECOVERING, S.PAUSED})


def check_transition(*, entity: str, state: str, target: str, action: str) -> None:
    """Raise IllegalTransition unless ``state -> target`` is allowed."""
    if target not in TRANSITIONS[state]:
        raise IllegalTransition(entity=entity, state=state, target=target, action=action)
