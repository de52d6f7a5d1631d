"""When the demo injects a fault into a run: seconds into it, or once it has trained so many
batches (:class:`When`); the run's progress as the database has it (:func:`run_progress`),
and the daemon thread that waits for it (:class:`BatchTrigger`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections

from webapp.runs.models import Run, TimelineEvent

BATCH_LOOK_S = 0.1  # how often a batch trigger looks at its run's progress in the database


@dataclass(frozen=True)
class When:
    """When the demo injects a fault into a run: ``seconds`` into it (on the run's clock, which
    starts at its ``started_at``) or once it has trained ``batches`` batches, one of the two.
    Seconds depend on how fast this machine trains, batches do not: a fault that must find the
    model partly trained comes after batches. ``paused`` (batches only): once the run is also
    paused, for a fault meant to come while it is paused (a pause takes effect a moment after
    it is asked for, a longer one on a loaded machine)."""

    seconds: float | None = None
    batches: int | None = None
    paused: bool = False

    def __post_init__(self) -> None:
        if (self.seconds is None) == (self.batches is None):
            raise ValueError("a When is seconds or batches into a run, one of the two")
        if self.paused and self.batches is None:
            raise ValueError("only a When in batches waits for the run to be paused")

    def describe(self, run: str = "the run") -> str:
        """For the demo's lines: "3.5 s into the run", "20 batches into run 7, once it is
        paused"."""
        if self.seconds is not None:
            return f"{self.seconds:g} s into {run}"
        count = f"{self.batches} batch" + ("" if self.batches == 1 else "es")
        return f"{count} into {run}" + (", once it is paused" if self.paused else "")


RECENT_UPDATES = 64  # the newest updates run_progress reads: every stage's last few


def run_progress(run_id: int) -> tuple[str, int]:
    """The run's state and how many batches it has trained, from the database. Batch b is
    trained once some stage applied the update of its last micro-batch, (b + 1) x the run's
    micro-batches - 1: an asynchronous schedule updates every micro-batch, in order, and a
    synchronous one labels a batch's one update with its last micro-batch. The newest updates
    are read by their start (the run's events are indexed by it): the highest micro-batch of
    all of them scanned every event of the run, on every look of a trigger."""
    state, microbatches = Run.objects.values_list("state", "microbatches").get(pk=run_id)
    recent = list(TimelineEvent.objects.filter(run_id=run_id, kind="update")
                  .order_by("-start").values_list("microbatch", flat=True)[:RECENT_UPDATES])
    return state, 0 if not recent else (max(recent) + 1) // microbatches


class BatchTrigger(threading.Thread):
    """Calls ``look`` every ``every_s`` on a daemon thread until it returns True (it acted, or
    gave up) or :meth:`cancel` is called. ``look`` may read the database: Django gives this
    thread a connection of its own, which nothing else would close, so the thread closes it
    as it ends."""

    def __init__(self, look: Callable[[], bool], *, every_s: float = BATCH_LOOK_S) -> None:
        super().__init__(name="batch-trigger", daemon=True)
        self.look, self.every_s = look, every_s
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        """Stop looking (an action under way goes on to its end)."""
        self.cancelled.set()

    def run(self) -> None:
        try:
            while not self.cancelled.is_set() and not self.look():
                self.cancelled.wait(self.every_s)
        finally:
            connections.close_all()
