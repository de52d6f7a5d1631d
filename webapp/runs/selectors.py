"""Reads on runs and plans, and the one place a run's planning inputs are built from the
database."""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection
from django.db.models import Max, Prefetch, QuerySet

from orchestrator.errors import PlanningError
from orchestrator.events import TimelineEvent as TimelineRecord
from orchestrator.events import idle_breakdown
from orchestrator.formats import Device as PlanDevice
from orchestrator.formats import (
    DeviceSet,
    LayerTimes,
    Link,
    ModelProfile,
    parse_profile,
)
from orchestrator.timeline_overview import timeline_downsample
from webapp.devices.models import Device, DeviceLink, LayerProfile, devices_named
from webapp.devices.selectors import planning_costs, planning_resources
from webapp.runs.models import FaultEvent, MetricPoint, Plan, Run, RunDevice, TimelineEvent

# What a live run page keeps: the timeline and metrics of the last minute of the run, and of
# the timeline at most the newest LIVE_MAX_EVENTS events (by end). A fast model reports
# thousands of events a second; a minute of them made a 3.5 MB snapshot, past the 1 MiB a
# WebSocket message may carry (daphne's limit), and more than a page draws (about 130 bytes
# an event: 4,000 make about 0.5 MB).
LIVE_WINDOW_S = 60.0
LIVE_MAX_EVENTS = 3000
# likewise the newest LIVE_MAX_METRICS metric points: a fast model's loss, accuracy and system
# figures came to 9,000 points (1 MB) a minute, and with the timeline the snapshot passed the
# 1 MiB limit, and the page could not connect (the snapshot is bounded in bytes as well:
# webapp.runs.events.run_snapshot)
LIVE_MAX_METRICS = 2000


def run_list(*, state: str | None = None, device: Device | None = None) -> QuerySet[Run]:
    runs = Run.objects.prefetch_related(
        Prefetch("run_devices", queryset=RunDevice.objects.select_related("device")),
        Prefetch("plans", queryset=Plan.objects.only("id", "run_id")))
    if state is not None:
        runs = runs.filter(state=state)
    if device is not None:
        runs = runs.filter(run_devices__device=device)
    return runs


def run_devices(*, run: Run) -> list[Device]:
    """The run's devices in pipeline order."""
    return [rd.device for rd in RunDevice.objects.filter(run=run).select_related("device")]


def plan_list(*, run: Run) -> QuerySet[Plan]:
    return Plan.objects.filter(run=run)


def plan_best(*, run: Run) -> Plan | None:
    """The finished plan with the shortest predicted period that fits in memory."""
    return (Plan.objects.filter(run=run, status=Plan.Status.DONE, memory_ok=True)
            .order_by("period_s", "id").first())


def plan_compare(*, run: Run) -> dict[str, Any]:
    """The run's plans side by side, best first, and why the best is best."""
    plans = list(plan_list(run=run))
    best = plan_best(run=run)
    ranked = sorted(plans, key=lambda p: (p.period_s is None, not p.memory_ok,
                                          p.period_s or 0.0, p.id))
    rows = []
    for p in ranked:
        rows.append({
            "plan": p.pk, "algorithm": p.algorithm, "status": p.status, "stages": p.stages,
            "period_s": p.period_s, "throughput_sps": p.throughput_sps,
            "simulated_throughput_sps": p.simulated_throughput_sps,
            "vs_best": (p.period_s / best.period_s
                        if best is not None and p.period_s and best.period_s else None),
            "bottleneck": p.bottleneck, "memory_ok": p.memory_ok, "planner_s": p.planner_s,
            "error": p.error,
        })
    reason = ""
    if best is not None:
        runner_up = next((r for r in rows if r["plan"] != best.pk and r["memory_ok"]), None)
        reason = (f"{best.algorithm} has the shortest predicted period that fits in memory "
                  f"({best.period_s:.4g} s, {best.throughput_sps:.4g} samples/s); it is limited "
                  f"by {best.bottleneck}")
        if runner_up is not None and runner_up["vs_best"]:
            reason += (f"; the next, {runner_up['algorithm']}, is "
                       f"{runner_up['vs_best']:.2f}x slower")
    return {"best": best.pk if best else None, "reason": reason, "rows": rows}


def run_planning_inputs(*, run: Run) -> tuple[ModelProfile, DeviceSet]:
    """The orchestrator's model profile and device set for planning ``run``.

    The run's first device is the reference: its profile gives the per-layer reference times
    and the layer sizes. Every device (the reference included) carries its own profile as
    ``layer_times`` and the speed ``reference total time / its total time``; memory, bandwidth
    and latency come from the device, ``overhead_s`` and ``message_s`` as they were when the
    run was planned (RunDevice: the profile's as a run measured them, else the device's
    probes'; the run's own stages measure them anew, and its prediction must not use that).
    Device ids are the devices' uids. A device whose agent reports compute resources
    (``--resources``) carries them, scaled so that their speeds sum to its speed. A device
    without a profile for the run's model spec, or one whose profile has another number of
    layers, is a PlanningError naming it.
    """
    rows = list(RunDevice.objects.filter(run=run).select_related("device"))
    devices = [rd.device for rd in rows]
    if not devices:
        raise PlanningError(f"run {run.pk} has no devices")
    planned = {rd.device_id: rd for rd in rows}
    spec = run.model_spec
    profiles = {lp.device_id: lp for lp in LayerProfile.objects.filter(
        model_spec=spec, device__in=devices)}
    missing = [d for d in devices if d.pk not in profiles]
    if missing:
        names = devices_named(missing)
        raise PlanningError(f"no profile of {spec.model} (batch {spec.batch_size}) for device"
                            f"{'s' if len(missing) > 1 else ''} {names}: ask "
                            f"{'them' if len(missing) > 1 else 'it'} to profile the model")
    parsed = {d.pk: parse_profile(profiles[d.pk].document, file=f"profile of {d.uid}")
              for d in devices}
    reference = devices[0]
    ref = parsed[reference.pk]
    ref_total = sum(la.forward_s + la.backward_s for la in ref.layers)
    plan_devices = []
    for d in devices:
        own = parsed[d.pk]
        if own.num_layers != ref.num_layers:
            raise PlanningError(f"device {d.named} profiled {own.num_layers} layers "
                                f"of {spec.model} but the reference device {reference.uid} "
                                f"profiled {ref.num_layers}")
        total = sum(la.forward_s + la.backward_s for la in own.layers)
        if total <= 0:
            raise PlanningError(f"device {d.named} has a profile with no time")
        rd = planned[d.pk]  # run_plan sets both figures, or neither (a run planned before)
        overhead, per_message = (
            planning_costs(device=d, profile=profiles[d.pk])[:2] if rd.overhead_s is None
            or rd.message_s is None else (rd.overhead_s, rd.message_s))
        speed = ref_total / total
        plan_devices.append(PlanDevice(
            id=d.uid, label=d.name, speed=speed, memory_bytes=d.memory_bytes,
            bandwidth_bps=d.bandwidth_bps, latency_s=d.latency_s, uplink_bps=d.uplink_bps,
            downlink_bps=d.downlink_bps, overhead_s=overhead, message_s=per_message,
            resources=planning_resources(device=d, speed=speed),
            layer_times=LayerTimes(forward_s=tuple(la.forward_s for la in own.layers),
                                   backward_s=tuple(la.backward_s for la in own.layers))))
    profile = ModelProfile(model=spec.model, batch_size=spec.batch_size,
                           reference=reference.uid, layers=ref.layers, dataset=spec.dataset,
                           file=f"run {run.pk}")
    return profile, DeviceSet(devices=tuple(plan_devices), links=run_links(devices=devices),
                              file=f"run {run.pk}")


def run_links(*, devices: list[Device]) -> tuple[Link, ...]:
    """The measured links among ``devices``, each pair at its slower direction (links are
    symmetric in the cost model; pairs never measured fall back to the devices' bandwidths)."""
    slowest: dict[tuple[str, str], float] = {}
    for link in DeviceLink.objects.filter(source__in=devices, target__in=devices).select_related(
            "source", "target"):
        pair = tuple(sorted((link.source.uid, link.target.uid)))
        key = (pair[0], pair[1])
        slowest[key] = min(slowest.get(key, link.bandwidth_bps), link.bandwidth_bps)
    return tuple(Link(a=a, b=b, bandwidth_bps=bw) for (a, b), bw in sorted(slowest.items()))


# --------------------------------------------------------------------------- what runs produce


def timeline_order(e: dict[str, Any]) -> tuple[Any, ...]:
    return (e["start"], e["end"], e["device"], e["kind"], e["microbatch"], e["stage"])


def metric_order(p: dict[str, Any]) -> tuple[Any, ...]:
    return (p["at"], p["kind"], p["device"], p["value"])


def fault_order(f: dict[str, Any]) -> tuple[Any, ...]:
    return (f["at"], f["kind"], f.get("device") or "")


def timeline_json(row: TimelineEvent) -> dict[str, Any]:
    return {"run": row.run_id, "device": row.device, "stage": row.stage, "kind": row.kind,
            "microbatch": row.microbatch, "version": row.version, "start": row.start,
            "end": row.end, "bytes": row.bytes, **({"pipeline": row.pipeline} if row.pipeline
                                                   else {})}


def metric_json(row: MetricPoint) -> dict[str, Any]:
    return {"at": row.at, "kind": row.kind, "device": row.device, "value": row.value}


def fault_json(row: FaultEvent) -> dict[str, Any]:
    return {"run": row.run_id, "at": row.at, "kind": row.kind, "device": row.device or None,
            "detail": row.detail}


# a timeline event's columns: orchestrator.events.TimelineEvent's fields after ``run``, in its
# order (a row reads straight into a record, and into the JSON the page gets)
_TIMELINE_FIELDS = tuple(f.name for f in dataclasses.fields(TimelineRecord))[1:]


def _timeline_window(run: Run, window_s: float, *, newest_n: int | None = None
                     ) -> QuerySet[TimelineEvent] | None:
    """The events that end within ``window_s`` of the newest one (a live run reads its window
    back every few seconds; None: the run has none). With ``newest_n``, only the events that
    end no earlier than the n-th newest end (at least n rows: ties)."""
    window = TimelineEvent.objects.filter(run=run)
    newest = window.aggregate(m=Max("end"))["m"]
    if newest is None:
        return None
    window = window.filter(end__gte=newest - window_s)
    if newest_n is not None:
        nth = list(window.order_by("-end").values_list("end", flat=True)[newest_n - 1:newest_n])
        if nth:
            window = window.filter(end__gte=nth[0])
    return window


def _timeline_window_json(run: Run, window_s: float, *, newest_n: int | None = None
                          ) -> list[dict[str, Any]]:
    """The window's events (:func:`_timeline_window`) as timeline_json gives them."""
    window = _timeline_window(run, window_s, newest_n=newest_n)
    return [] if window is None else timeline_rows_json(run, window)


def timeline_rows_json(run: Run, events: QuerySet[TimelineEvent]) -> list[dict[str, Any]]:
    """``events`` as timeline_json gives them, read as plain rows (a model instance per row
    cost three quarters of reading a run's events back)."""
    rows = events.values_list(*_TIMELINE_FIELDS)
    out = []
    for row in rows:
        event = {"run": run.pk, **dict(zip(_TIMELINE_FIELDS, row, strict=True))}
        if not event["pipeline"]:  # as the agents send it (orchestrator.events)
            del event["pipeline"]
        out.append(event)
    return out


def newest_events(events: Sequence[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The ``limit`` events that end last (ties: the later in timeline order), in timeline
    order. Adding events never brings back one this dropped, so a page that trims its window
    this way after every delta holds what a fresh snapshot would."""
    return newest_rows(events, limit, time_key="end", order=timeline_order)


def newest_rows(rows: Sequence[dict[str, Any]], limit: int, *, time_key: str,
                order: Callable[[dict[str, Any]], tuple[Any, ...]]) -> list[dict[str, Any]]:
    """The ``limit`` rows latest by ``time_key`` (ties: the later in ``order``), in ``order``:
    newest_events for any kind of row (metric points by ``at``)."""
    kept = (list(rows) if len(rows) <= limit
            else heapq.nlargest(limit, rows, key=lambda r: (r[time_key], order(r))))
    return sorted(kept, key=order)


def run_timeline_window(*, run: Run, window_s: float = LIVE_WINDOW_S,
                        limit: int | None = None) -> list[dict[str, Any]]:
    """The timeline events that end within ``window_s`` of the newest one, at most the newest
    ``limit`` of them (default LIVE_MAX_EVENTS)."""
    limit = LIVE_MAX_EVENTS if limit is None else limit
    return newest_events(_timeline_window_json(run, window_s, newest_n=limit), limit)


def run_record_end(*, run: Run) -> float:
    """The newest time on the run's record (timeline, faults, metrics): where its clock went
    on to when it starts again (0 for a run that has recorded nothing)."""
    newest = [TimelineEvent.objects.filter(run=run).aggregate(m=Max("end"))["m"],
              FaultEvent.objects.filter(run=run).aggregate(m=Max("at"))["m"],
              MetricPoint.objects.filter(run=run).aggregate(m=Max("at"))["m"]]
    return max([0.0, *(t for t in newest if t is not None)])


# the timeline API: at most this many bars per device and lane, exact events up to this many
TIMELINE_MAX_BARS = 2000
TIMELINE_MAX_EVENTS = 20000
TIMELINE_EXACT_EVENTS = LIVE_MAX_EVENTS


def run_timeline_newest(*, run: Run) -> float | None:
    """The end of the run's newest timeline event (None: it has none)."""
    newest: float | None = TimelineEvent.objects.filter(run=run).aggregate(m=Max("end"))["m"]
    return newest


def run_timeline_span(*, run: Run, start_s: float | None = None, end_s: float | None = None,
                      max_bars: int = 600, max_events: int = TIMELINE_EXACT_EVENTS
                      ) -> dict[str, Any]:
    """The run's timeline over [start_s, end_s] (default: the whole run, 0 to its newest
    event's end): its events themselves when at most ``max_events`` overlap the span, else
    the span downsampled to at most ``max_bars`` bars per device and lane
    (orchestrator.timeline_overview). What the run page's Gantt draws of a past window, and
    of the whole run."""
    newest = run_timeline_newest(run=run)
    lo = 0.0 if start_s is None else start_s
    hi = (newest if newest is not None and newest > lo else lo + 1.0) if end_s is None else end_s
    overlapping = TimelineEvent.objects.filter(run=run, end__gte=lo, start__lte=hi)
    count = overlapping.count()
    out: dict[str, Any] = {"run": run.pk, "start_s": lo, "end_s": hi, "newest_s": newest,
                           "events_in_span": count, "exact": count <= max_events,
                           "bin_s": (hi - lo) / max_bars, "events": [], "bars": []}
    if count <= max_events:
        out["events"] = sorted(timeline_rows_json(run, overlapping), key=timeline_order)
        return out
    rows = overlapping.values_list("device", "kind", "microbatch", "start", "end")
    records = (TimelineRecord(run=run.pk, device=device, stage=0, kind=kind,
                              microbatch=microbatch, version=0, start=start, end=end)
               for device, kind, microbatch, start, end in rows.iterator(chunk_size=5000))
    out["bars"] = [b.to_json() for b in timeline_downsample(records, start_s=lo, end_s=hi,
                                                            max_bars=max_bars)]
    return out


def run_metrics_window(*, run: Run, window_s: float = LIVE_WINDOW_S,
                       limit: int | None = None) -> list[dict[str, Any]]:
    """The metric points within ``window_s`` of the newest one, at most the newest ``limit``
    of them (default LIVE_MAX_METRICS)."""
    limit = LIVE_MAX_METRICS if limit is None else limit
    newest = MetricPoint.objects.filter(run=run).aggregate(m=Max("at"))["m"]
    if newest is None:
        return []
    rows = MetricPoint.objects.filter(run=run, at__gte=newest - window_s)
    # from the limit-th newest time on (more, on a tie there: newest_rows settles it)
    edge = list(rows.order_by("-at").values_list("at", flat=True)[limit - 1:limit])
    if edge:
        rows = rows.filter(at__gte=edge[0])
    return newest_rows([metric_json(r) for r in rows], limit, time_key="at",
                       order=metric_order)


def run_faults(*, run: Run) -> list[dict[str, Any]]:
    return sorted((fault_json(r) for r in FaultEvent.objects.filter(run=run)), key=fault_order)


def _records(run_id: int, events: QuerySet[TimelineEvent]) -> list[TimelineRecord]:
    """``events`` as orchestrator records, read with the cursor: Django's iteration of
    ``values_list`` cost 6 us a row, most of reading a window of 3,000 back."""
    sql, params = events.values_list(*_TIMELINE_FIELDS).query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [TimelineRecord(run_id, *row) for row in cursor.fetchall()]


def run_idle(*, run: Run, window_s: float = LIVE_WINDOW_S
             ) -> tuple[list[float], dict[str, dict[str, float]]]:
    """Each device's busy and idle time (with its causes) over the window ending at the newest
    event, by the orchestrator's one definition (orchestrator.events.idle_breakdown). The
    window is the page's: the last ``window_s`` seconds, or less when more than
    LIVE_MAX_EVENTS events end in them (then from the end of the newest LIVE_MAX_EVENTS-th).
    A live run recomputes this every few seconds, so its cost stays bounded at any rate."""
    window = _timeline_window(run, window_s, newest_n=LIVE_MAX_EVENTS)
    # read straight into records, in the dataclass's field order: a dict per row first (as
    # the page's JSON) took more than half of this, and this was a sixth of the web server's
    # CPU while two agents trained VGG-5
    events = [] if window is None else _records(run.pk, window)
    if not events:
        return [0.0, 0.0], {}
    hi = max(e.end for e in events)
    lo = max(0.0, hi - window_s)
    if len(events) >= LIVE_MAX_EVENTS:
        lo = max(lo, min(e.end for e in events))
    devices = sorted({e.device for e in events})
    return [lo, hi], {d: idle_breakdown([e for e in events if e.device == d], window=(lo, hi),
                                        schedule=run.schedule).to_json()
                      for d in devices}
