"""Reads for a run's report: the run from the database in the shared formats (an
:class:`orchestrator.report.record.RunRecord`), which :mod:`orchestrator.report` draws, as
``python -m orchestrator report`` does from the run page's downloads."""

from __future__ import annotations

from types import MappingProxyType

from orchestrator.errors import FormatError
from orchestrator.events import FaultEvent, TimelineEvent
from orchestrator.report.document import report_html
from orchestrator.report.figures import gantt_window
from orchestrator.report.record import Metric, PlanSummary, RunRecord, plan_summary
from webapp.common.exceptions import Conflict
from webapp.dashboard.planned import MAX_GHOST_SPAN_S, plan_ghost_timeline
from webapp.dashboard.selectors import TRACE_CHUNK, run_device_names, run_metric_rows
from webapp.runs.models import Plan, Run
from webapp.runs.models import TimelineEvent as TimelineRow
from webapp.runs.selectors import plan_list, run_devices, run_faults

_FIELDS = ("device", "stage", "kind", "microbatch", "version", "start", "end", "bytes", "pipeline")


def _plan_row(plan: Plan, *, names: dict[str, str], chosen: bool) -> PlanSummary:
    """A plan as a row of the comparison: the figures the planner stored, the stages in words."""
    layout, error = "", plan.error
    if plan.document is not None:
        try:
            layout = plan_summary(plan.document, file=f"plan {plan.pk}", labels=names).layout
        except FormatError as exc:
            error = error or str(exc)
    return PlanSummary(algorithm=plan.algorithm, layout=layout, stages=plan.stages,
                       period_s=plan.period_s, throughput_sps=plan.throughput_sps,
                       simulated_throughput_sps=plan.simulated_throughput_sps,
                       bottleneck=plan.bottleneck, memory_ok=plan.memory_ok,
                       planner_s=plan.planner_s, status=plan.status, error=error,
                       chosen=chosen)


def _planned(run: Run, events: tuple[TimelineEvent, ...]) -> tuple[TimelineEvent, ...]:
    """The chosen plan's predicted events over what the report's Gantt shows (its last ten
    minutes at most), as the live Gantt's ghosts; none when the plan cannot be simulated."""
    plan = run.chosen_plan
    if plan is None or plan.document is None or not events:
        return ()
    window = gantt_window(events)
    start_s = max(window.start_s, window.end_s - MAX_GHOST_SPAN_S)
    try:
        ghost = plan_ghost_timeline(run=run, plan=plan, start_s=start_s, end_s=window.end_s)
    except Conflict:
        return ()
    return tuple(TimelineEvent(**{k: e[k] for k in ("run", *_FIELDS) if k in e})
                 for e in ghost["events"])


def run_report_record(*, run: Run) -> RunRecord:
    """Everything the run recorded (timeline, faults, metrics), its plans and the chosen plan's
    predicted timeline."""
    names = run_device_names(run=run)
    rows = (TimelineRow.objects.filter(run=run).order_by("start", "id")
            .values_list(*_FIELDS).iterator(TRACE_CHUNK))
    events = tuple(TimelineEvent(run.pk, *row) for row in rows)
    faults = tuple(FaultEvent(run=run.pk, at=f["at"], kind=f["kind"], device=f["device"],
                              detail=f["detail"] or {}) for f in run_faults(run=run))
    metrics = tuple(Metric(at=at, kind=kind, device=device, value=value)
                    for at, kind, device, value in run_metric_rows(run=run))
    plans = tuple(_plan_row(p, names=names, chosen=p.pk == run.chosen_plan_id)
                  for p in plan_list(run=run).order_by("id"))
    spec = run.model_spec
    return RunRecord(
        title=f"run {run.pk}: {run.name}", schedule=run.schedule, events=events, faults=faults,
        metrics=metrics, plans=plans, devices=tuple(d.uid for d in run_devices(run=run)),
        labels=MappingProxyType(names), planned=_planned(run, events),
        batch_size=spec.batch_size if spec else None, source="the EdgePipe dashboard")


def run_report(*, run: Run) -> str:
    """The run's report: one HTML file with plotly.js in it (it opens offline)."""
    return report_html(run_report_record(run=run))
