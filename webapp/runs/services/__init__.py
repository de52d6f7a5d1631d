"""Writes on runs, one module per responsibility: ``creation`` (draft runs), ``lifecycle``
(planning, starting, pausing, stopping, and the agents' stage reports), ``deployment`` (what
each device of a plan runs), ``planning`` (the Celery task's body), ``ingest`` (what runs
produce, stored in bulk) and ``control`` (what they all build on). Callers import from here."""

from webapp.runs.services.control import ACTIVE_DEVICE
from webapp.runs.services.creation import run_create
from webapp.runs.services.deployment import spec_fields, stage_specs
from webapp.runs.services.ingest import (
    fault_events_store,
    metric_points_store,
    run_events_store,
    run_events_store_locked,
    run_member_lock,
    timeline_events_store,
)
from webapp.runs.services.lifecycle import (
    run_pause,
    run_plan,
    run_stage_done,
    run_stage_failed,
    run_stage_ready,
    run_start,
    run_stop,
    run_transition,
    runs_fail_stalled,
)
from webapp.runs.services.planning import (
    TrainingProgress,
    plan_compute,
    plans_requeue_unfinished,
    plans_watch,
)

__all__ = [
    "ACTIVE_DEVICE", "TrainingProgress", "fault_events_store", "metric_points_store",
    "plan_compute", "plans_requeue_unfinished", "plans_watch", "run_create",
    "run_events_store", "run_events_store_locked", "run_member_lock", "run_pause",
    "run_plan", "run_stage_done", "run_stage_failed", "run_stage_ready", "run_start",
    "run_stop", "run_transition", "runs_fail_stalled", "spec_fields", "stage_specs",
    "timeline_events_store",
]
