"""A run's state: the state machine (which state may follow which, and one check), and the typed
shapes of what the run stores of its current deployment and of a recovery under way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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


# --------------------------------------------------------------------------- typed run state


def _floats(raw: Any) -> dict[str, float]:
    return {str(k): float(v) for k, v in (raw or {}).items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def _document(raw: Any) -> dict[str, Any] | None:
    return dict(raw) if isinstance(raw, Mapping) and raw else None


@dataclass(frozen=True)
class Deployment:
    """The generation a run's devices train now (``Run.deployment``): the plan they run, when
    it resumed, and what carries from one generation to the next (the devices' capacities as
    last measured, the next dynamic re-partition check). Empty before the run first runs."""

    plan: Mapping[str, Any] | None = None  # the plan document the devices run
    since_s: float = 0.0  # run clock at which this generation (re)started
    restart_s: float | None = None  # how long the last recovery took: a move's restart cost
    next_check: int | None = None  # micro-batch at which the next re-partition check is due
    capacity: Mapping[str, float] = field(default_factory=dict)  # by device uid
    estimate: Mapping[str, float] = field(default_factory=dict)  # the last check's throughputs

    @classmethod
    def from_json(cls, raw: Any) -> Deployment:
        raw = raw if isinstance(raw, Mapping) else {}
        restart, check = raw.get("restart_s"), raw.get("next_check")
        return cls(plan=_document(raw.get("plan")), since_s=float(raw.get("since_s") or 0.0),
                   restart_s=None if restart is None else float(restart),
                   next_check=None if check is None else int(check),
                   capacity=_floats(raw.get("capacity")), estimate=_floats(raw.get("estimate")))

    def to_json(self) -> dict[str, Any]:
        return {"plan": None if self.plan is None else dict(self.plan), "since_s": self.since_s,
                "restart_s": self.restart_s, "next_check": self.next_check,
                "capacity": dict(self.capacity), "estimate": dict(self.estimate)}


@dataclass(frozen=True)
class Recovery:
    """A recovery under way (``Run.recovery``, empty when none): from a failure (``cause``
    "failure") or a dynamic re-partition ("dynamic": a recovery that lost nobody), its working
    state from detection to the commit (webapp.runs.recovery). The fields from ``next_plan``
    on are set once the survivors halted and the next generation was planned."""

    generation: int  # the generation it deploys
    cause: str = "failure"
    lost: tuple[str, ...] = ()  # device uids
    detected_at: float = 0.0  # run clock
    detected_wall: float = 0.0  # wall clock: the recovery's duration is measured from it
    decision: Mapping[str, Any] = field(default_factory=dict)  # a re-partition's break-even
    paused: bool = False  # the run was paused before or during it: it ends paused
    from_start: bool = False  # lost while starting: the next generation starts from the seed
    next_plan: Mapping[str, Any] | None = None
    resume: int = 0  # the micro-batch the next generation resumes at
    release: tuple[str, ...] = ()  # survivors the next plan leaves out: told to stop
    bytes_moved: int = 0
    transfers: int = 0
    redone: int = 0  # micro-batches past the resume point, trained again
    replanned_wall: float | None = None
    back: tuple[str, ...] = ()  # lost devices whose agent connected again during it

    @classmethod
    def from_json(cls, raw: Any) -> Recovery | None:
        """The recovery stored in ``raw``; None when there is none."""
        if not isinstance(raw, Mapping) or raw.get("generation") is None:
            return None
        wall = raw.get("replanned_wall")
        return cls(generation=int(raw["generation"]), cause=str(raw.get("cause") or "failure"),
                   lost=tuple(str(u) for u in raw.get("lost") or ()),
                   detected_at=float(raw.get("detected_at") or 0.0),
                   detected_wall=float(raw.get("detected_wall") or 0.0),
                   decision=dict(raw.get("decision") or {}), paused=bool(raw.get("paused")),
                   from_start=bool(raw.get("from_start")),
                   next_plan=_document(raw.get("next_plan")),
                   resume=int(raw.get("resume") or 0),
                   release=tuple(str(u) for u in raw.get("release") or ()),
                   bytes_moved=int(raw.get("bytes_moved") or 0),
                   transfers=int(raw.get("transfers") or 0), redone=int(raw.get("redone") or 0),
                   replanned_wall=None if wall is None else float(wall),
                   back=tuple(str(u) for u in raw.get("back") or ()))

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "cause": self.cause, "lost": list(self.lost),
                "detected_at": self.detected_at, "detected_wall": self.detected_wall,
                "decision": dict(self.decision), "paused": self.paused,
                "from_start": self.from_start,
                "next_plan": None if self.next_plan is None else dict(self.next_plan),
                "resume": self.resume, "release": list(self.release),
                "bytes_moved": self.bytes_moved, "transfers": self.transfers,
                "redone": self.redone, "replanned_wall": self.replanned_wall,
                "back": list(self.back)}
