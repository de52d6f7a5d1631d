"""What a run's Channels group (``run-<id>``) carries: one function builds each event, one sends
it after the transaction commits, and :func:`snapshot_apply` is how a page applies them to the
snapshot it got on connecting (the dashboard's script does the same)."""

from __future__ import annotations

from functools import partial
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from webapp.runs.models import Plan, Run
from webapp.runs.serializers import PlanOutput, RunOutput

Event = dict[str, Any]


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def event_run(run: Run) -> Event:
    """The run's state changed (or its set of plans)."""
    return {"type": "run", "run": RunOutput(run).data}


def event_plan(plan: Plan) -> Event:
    """A plan was queued, started, finished or failed."""
    return {"type": "plan", "plan": PlanOutput(plan).data}


def run_snapshot(run: Run) -> Event:
    """Everything a run page shows, at once."""
    return {"type": "snapshot", "run": RunOutput(run).data,
            "plans": PlanOutput(run.plans.all(), many=True).data}


def _group_send(run_id: int, event: Event) -> None:
    async_to_sync(get_channel_layer().group_send)(run_group(run_id),
                                                  {"type": "run.event", "event": event})


def run_event_send(run_id: int, event: Event) -> None:
    """Send ``event`` to the run's group once the current transaction commits."""
    transaction.on_commit(partial(_group_send, run_id, event))


def snapshot_apply(snapshot: Event, event: Event) -> Event:
    """The snapshot after ``event``: a run event replaces the run and drops the plans it no
    longer lists, a plan event replaces (or adds) that plan."""
    if event["type"] == "run":
        keep = set(event["run"]["plans"])
        plans = [p for p in snapshot["plans"] if p["id"] in keep]
        return {**snapshot, "run": event["run"], "plans": plans}
    if event["type"] == "plan":
        plan = event["plan"]
        others = [p for p in snapshot["plans"] if p["id"] != plan["id"]]
        return {**snapshot, "plans": sorted([*others, plan], key=lambda p: p["id"])}
    raise ValueError(f"unknown event type {event['type']!r}")
