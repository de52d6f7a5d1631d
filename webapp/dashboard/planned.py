"""A plan's planned timelines for the dashboard's pages: the simulator's Gantt of a few
batches of a plan, and the live Gantt's ghost bars (what the devices would be doing had
they kept to the chosen plan); a split plan's from its schedule
(webapp.runs.split_selectors)."""

from __future__ import annotations

import math
from typing import Any

from django.db.models import Min

from orchestrator.cost import CostModel, build_cost_model
from orchestrator.errors import FormatError, PlanningError
from orchestrator.events import TimelineEvent
from orchestrator.planformat import Plan as PlanDocument
from orchestrator.planformat import parse_plan
from orchestrator.simulator import simulate
from webapp.common.exceptions import Conflict
from webapp.dashboard.selectors import run_device_names
from webapp.runs.models import Plan, Run
from webapp.runs.models import TimelineEvent as TimelineRow
from webapp.runs.pipelearn_selectors import pipelearn_ghost_timeline, pipelearn_plan_layout
from webapp.runs.selectors import run_planning_inputs
from webapp.runs.split_selectors import split_ghost_timeline, split_plan_layout

# a planned Gantt on the run page: this many batches; at most this many on request
PLANNED_BATCHES = 2
MAX_PLANNED_BATCHES = 8
# the live Gantt's ghosts: at most this span of run time, this many events per answer
MAX_GHOST_SPAN_S = 600.0
MAX_GHOST_EVENTS = 20000


def _plan_model(run: Run, plan: Plan) -> tuple[CostModel, PlanDocument]:
    """The cost model of the run's devices and the stored plan document, parsed; a Conflict
    (409) saying why when the plan cannot be simulated now."""
    if plan.status != Plan.Status.DONE or plan.document is None:
        raise Conflict(f"plan {plan.pk} ({plan.algorithm}) is {plan.status}: only a computed "
                       "plan has a planned timeline", state=plan.status,
                       action="simulate the plan")
    try:
        profile, devices = run_planning_inputs(run=run)
        parsed = parse_plan(plan.document, profile=profile, devices=devices,
                            file=f"plan {plan.pk}")
    except (PlanningError, FormatError) as exc:
        raise Conflict(f"plan {plan.pk} cannot be simulated: {exc}", state=plan.status,
                       action="simulate the plan") from None
    return build_cost_model(profile, devices), parsed


def _plan_rows(run: Run, parsed: PlanDocument) -> list[dict[str, Any]]:
    names = {rd.device.uid: rd.device.name for rd in run.run_devices.all()}
    return [{"device": uid, "label": names.get(uid, uid), "stage": k}
            for k, stage in enumerate(parsed.stages) for uid in stage.devices]


def _simulated(run: Run, plan: Plan, batches: int) -> tuple[CostModel, PlanDocument, Any]:
    cm, parsed = _plan_model(run, plan)
    try:
        result = simulate(cm, parsed, run=run.pk, microbatches=run.microbatches * batches,
                          schedule=run.schedule, flush_every=run.microbatches)
    except RuntimeError as exc:  # a schedule the simulator cannot run to its end
        raise Conflict(f"plan {plan.pk} cannot be simulated: {exc}", state=plan.status,
                       action="simulate the plan") from None
    return cm, parsed, result


def plan_timeline(*, run: Run, plan: Plan, batches: int = PLANNED_BATCHES) -> dict[str, Any]:
    """The simulator's timeline of ``batches`` batches of ``plan`` (its planned Gantt); of a
    split plan, its schedule's batch ``batches`` times over."""
    if run.kind == "split":
        return split_plan_timeline(run=run, plan=plan, batches=batches)
    if run.kind == "pipelearn":
        return pipelearn_plan_timeline(run=run, plan=plan)
    _, parsed, result = _simulated(run, plan, batches)
    return {"plan": plan.pk, "algorithm": plan.algorithm, "schedule": run.schedule,
            "batches": batches, "microbatches": run.microbatches * batches,
            "rows": _plan_rows(run, parsed), "makespan_s": result.makespan_s,
            "throughput_sps": result.throughput_sps,
            "events": [e.to_json() for e in result.events]}


def _split_only(read: Any, plan: Plan) -> dict[str, Any]:
    """``read()``, a split plan's timeline; Conflict (409) when the plan is not one."""
    if plan.status != Plan.Status.DONE:
        raise Conflict(f"plan {plan.pk} ({plan.algorithm}) is {plan.status}: only a computed "
                       "plan has a planned timeline", state=plan.status,
                       action="show the plan's timeline")
    try:
        out: dict[str, Any] = read()
    except (FormatError, ValueError) as exc:
        raise Conflict(f"plan {plan.pk} has no planned timeline: {exc}", state=plan.status,
                       action="show the plan's timeline") from None
    return out


def split_plan_timeline(*, run: Run, plan: Plan, batches: int) -> dict[str, Any]:
    """A split plan's planned Gantt: its schedule's batch, ``batches`` times one after the
    other."""
    ghost = _split_only(lambda: split_ghost_timeline(
        run=run, plan=plan, start_s=0.0, end_s=math.inf, anchor_s=0.0,
        max_events=MAX_GHOST_EVENTS, batches=batches), plan)
    period = ghost["batch_period_s"]
    events = ghost["events"]
    layout = split_plan_layout(document=plan.document, names=run_device_names(run=run))
    rows = [{"device": d["device"], "label": d["label"], "stage": s["stage"]}
            for s in layout["stages"] for d in s["devices"]]
    return {"plan": plan.pk, "algorithm": plan.algorithm, "schedule": run.schedule,
            "batches": batches, "microbatches": batches, "rows": rows,
            "makespan_s": period * batches,
            "throughput_sps": plan.throughput_sps, "events": events}


def pipelearn_plan_timeline(*, run: Run, plan: Plan) -> dict[str, Any]:
    """A PipeLearn plan's planned Gantt: one epoch of its method by the time model."""
    ghost = _split_only(lambda: pipelearn_ghost_timeline(
        run=run, plan=plan, start_s=0.0, end_s=math.inf, anchor_s=0.0,
        max_events=MAX_GHOST_EVENTS), plan)
    events = [e for e in ghost["events"] if e["start"] < ghost["batch_period_s"]]
    layout = pipelearn_plan_layout(document=plan.document, names=run_device_names(run=run))
    rows = [{"device": d["device"], "label": d["label"], "stage": s["stage"]}
            for s in layout["stages"] for d in s["devices"]]
    return {"plan": plan.pk, "algorithm": plan.algorithm, "schedule": run.schedule,
            "batches": run.batches, "microbatches": run.batches, "rows": rows,
            "makespan_s": ghost["batch_period_s"], "throughput_sps": plan.throughput_sps,
            "events": events}


def _shifted(e: TimelineEvent, dt: float, dm: int, dv: int) -> dict[str, Any]:
    return {**e.to_json(), "start": e.start + dt, "end": e.end + dt,
            "microbatch": e.microbatch + dm, "version": e.version + dv}


def run_anchor_s(*, run: Run) -> float:
    """When the run's measured pipeline began: its first timeline event (0 before any)."""
    first = TimelineRow.objects.filter(run=run).aggregate(m=Min("start"))["m"]
    return float(first) if first is not None else 0.0


def plan_ghost_timeline(*, run: Run, plan: Plan, start_s: float, end_s: float
                        ) -> dict[str, Any]:
    """The planned events of ``plan`` between ``start_s`` and ``end_s`` of run time: what the
    devices would be doing had they kept to the plan since the run's first measured event.

    The batches until the pipeline is full are taken as simulated (the fill: one batch, more
    when a stage keeps more micro-batches in flight than a batch has), and the next, the
    steady state, is repeated every batch period (the time between the first forwards of it
    and of the batch after) for the run's remaining batches, its micro-batches and versions
    numbered on. So an hours-long run needs no hours-long simulation. A split run's is its
    schedule's batch, one every planned makespan (split_selectors.split_ghost_timeline)."""
    if run.kind == "split":
        return _split_only(lambda: split_ghost_timeline(
            run=run, plan=plan, start_s=start_s, end_s=end_s, anchor_s=run_anchor_s(run=run),
            max_events=MAX_GHOST_EVENTS), plan)
    if run.kind == "pipelearn":  # the time model's epoch, once every predicted epoch
        return _split_only(lambda: pipelearn_ghost_timeline(
            run=run, plan=plan, start_s=start_s, end_s=end_s, anchor_s=run_anchor_s(run=run),
            max_events=MAX_GHOST_EVENTS), plan)
    m = run.microbatches
    depth = max(plan.document.get("inflight") or [1])
    total_batches = run.batches * run.epochs
    steady = max(1, min(math.ceil(depth / m), total_batches - 1))  # the template batch
    _, _, result = _simulated(run, plan, steady + 2)
    anchor = run_anchor_s(run=run)
    lo, hi = start_s - anchor, end_s - anchor
    first_forward: dict[int, TimelineEvent] = {}
    for e in result.events:
        if e.kind == "forward" and e.stage == 0 and e.microbatch in (steady * m,
                                                                      (steady + 1) * m):
            first_forward.setdefault(e.microbatch, e)
    head = [e for e in result.events if e.microbatch < steady * m]
    template = [e for e in result.events if steady * m <= e.microbatch < (steady + 1) * m]
    period = first_forward[(steady + 1) * m].start - first_forward[steady * m].start
    dv = first_forward[(steady + 1) * m].version - first_forward[steady * m].version
    out = [_shifted(e, anchor, 0, 0) for e in head if e.end >= lo and e.start <= hi]
    if template and period > 0 and total_batches > steady:
        t_min = min(e.start for e in template)
        t_max = max(e.end for e in template)
        first = max(steady, math.ceil((lo - t_max) / period) + steady)
        last = min(total_batches - 1, math.floor((hi - t_min) / period) + steady)
        for j in range(first, last + 1):
            dt = (j - steady) * period
            out.extend(_shifted(e, anchor + dt, (j - steady) * m, (j - steady) * dv)
                       for e in template if e.end + dt >= lo and e.start + dt <= hi)
            if len(out) >= MAX_GHOST_EVENTS:
                break
    out.sort(key=lambda e: (e["start"], e["end"], e["device"], e["kind"]))
    return {"plan": plan.pk, "algorithm": plan.algorithm, "anchor_s": anchor,
            "batch_period_s": period, "start_s": start_s, "end_s": end_s,
            "truncated": len(out) > MAX_GHOST_EVENTS, "events": out[:MAX_GHOST_EVENTS]}
