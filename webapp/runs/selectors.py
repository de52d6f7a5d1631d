"""Reads on runs and plans, and the one place a run's planning inputs are built from the
database."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Sequence
from typing import Any

from django.db.models import Max, Prefetch, QuerySet

from orchestrator.cost import build_cost_model
from orchestrator.errors import PlanningError
from orchestrator.events import TimelineEvent as TimelineRecord
from orchestrator.events import idle_breakdown, steady_throughput_sps
from orchestrator.formats import Device as PlanDevice
from orchestrator.formats import (
    DeviceSet,
    LayerTimes,
    Link,
    ModelProfile,
    parse_plan,
    parse_profile,
)
from orchestrator.simulator import simulate
from orchestrator.timeline_overview import timeline_downsample
from webapp.devices.models import Device, DeviceLink, LayerProfile
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
        names = ", ".join(f"{d.name!r} ({d.uid})" for d in missing)
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
            raise PlanningError(f"device {d.name!r} ({d.uid}) profiled {own.num_layers} layers "
                                f"of {spec.model} but the reference device {reference.uid} "
                                f"profiled {ref.num_layers}")
        total = sum(la.forward_s + la.backward_s for la in own.layers)
        if total <= 0:
            raise PlanningError(f"device {d.name!r} ({d.uid}) has a profile with no time")
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


_TIMELINE_FIELDS = ("device", "stage", "kind", "microbatch", "version", "start", "end", "bytes",
                    "pipeline")


def _timeline_window_json(run: Run, window_s: float, *, newest_n: int | None = None
                          ) -> list[dict[str, Any]]:
    """The window's events as timeline_json gives them (a live run reads its window back every
    few seconds). With ``newest_n``, only the events that end no earlier than the n-th newest
    end (at least n rows: ties)."""
    window = TimelineEvent.objects.filter(run=run)
    newest = window.aggregate(m=Max("end"))["m"]
    if newest is None:
        return []
    window = window.filter(end__gte=newest - window_s)
    if newest_n is not None:
        nth = list(window.order_by("-end").values_list("end", flat=True)[newest_n - 1:newest_n])
        if nth:
            window = window.filter(end__gte=nth[0])
    return _timeline_rows_json(run, window)


def _timeline_rows_json(run: Run, events: QuerySet[TimelineEvent]) -> list[dict[str, Any]]:
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
        out["events"] = sorted(_timeline_rows_json(run, overlapping), key=timeline_order)
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


# --------------------------------------------------------------------------- faults, recoveries

# the order of a recovery's events when they share a time (the order the server emits them)
_FAULT_PHASE = {"device_lost": 0, "recovery_started": 1, "repartition_skipped": 2,
                "repartitioned": 2, "weights_redistributed": 3, "recovered": 4, "run_failed": 5}


def _recovery_entry(cause: str, started_s: float) -> dict[str, Any]:
    return {
        "generation": None, "cause": cause, "moved": True, "phase": "detected",
        "started_s": started_s, "lost": [], "losses": [],
        "detected_s": None, "replanned_s": None, "weights_moved_s": None, "resumed_s": None,
        "replanning_s": None, "redistributing_s": None, "resuming_s": None, "recovery_s": None,
        "planner": None, "stages": None, "predicted_throughput_sps": None,
        "measured_throughput_sps": None, "resume_microbatch": None,
        "microbatches_redone": None, "bytes_moved": None, "transfers": None,
        "weights_duration_s": None, "saved_s": None, "cost_s": None, "error": None,
    }


def _number(value: Any) -> float | int | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _durations(entry: dict[str, Any]) -> None:
    """The time between consecutive phases, from the loss detected (a dynamic re-partition:
    from its decision), and the whole recovery's when the server did not say it
    (``recovered.recovery_s``): from that origin to training resumed."""
    def between(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else b - a

    origin = entry["detected_s"]
    if origin is None and entry["moved"]:
        origin = entry["started_s"]
    entry["replanning_s"] = between(origin, entry["replanned_s"])
    entry["redistributing_s"] = between(entry["replanned_s"], entry["weights_moved_s"])
    entry["resuming_s"] = between(entry["weights_moved_s"], entry["resumed_s"])
    if entry["recovery_s"] is None:
        entry["recovery_s"] = between(origin, entry["resumed_s"])


def fault_recoveries(faults: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A run's fault events (fault_json rows, any order) as recoveries, in the order they
    started (docs/architecture.md, "Fault tolerance and dynamic re-partition").

    One entry per recovery from lost devices (``cause`` "failure": its ``device_lost`` events,
    ``recovery_started``, ``repartitioned``, ``weights_redistributed`` and ``recovered``), per
    dynamic re-partition (``cause`` "dynamic": a recovery that lost nobody, from its
    ``recovery_started`` with no one lost or its ``repartitioned``), and per check that kept
    the plan (``repartition_skipped``: ``moved`` false, ``phase`` "skipped"). A loss while a
    recovery or re-partition is under way joins it and makes it a failure recovery (the server
    starts it again, with the next generation, for the union of the lost); ``generation`` is
    the one it resumed with (else the newest it started).

    Times are the run's clock: ``started_s``, ``detected_s`` (the first loss; null for a
    dynamic one), ``replanned_s``, ``weights_moved_s``, ``resumed_s``, and between them
    ``replanning_s`` (from the loss, or the dynamic decision), ``redistributing_s``,
    ``resuming_s``; ``recovery_s`` is the server's (else from the loss or decision to resumed).
    ``phase``: the last reached (detected for a loss, started for a dynamic one, then
    replanned, weights_moved, resumed), or failed (the run failed first: ``error``), or
    skipped. ``losses``: each lost device with the time and the way it was found lost. Pure:
    the run page's script (static/dashboard/js/faults.js) computes the same from its
    snapshot."""
    ordered = sorted(faults, key=lambda f: (f["at"], _FAULT_PHASE.get(f["kind"], 9)))
    entries: list[dict[str, Any]] = []
    by_generation: dict[int, dict[str, Any]] = {}
    current: dict[str, Any] | None = None  # the recovery under way, if any

    def start(cause: str, at: float) -> dict[str, Any]:
        entry = _recovery_entry(cause, at)
        if cause == "dynamic":
            entry["phase"] = "started"
        entries.append(entry)
        return entry

    def lose(entry: dict[str, Any], device: str, at: float, detail: dict[str, Any]) -> None:
        entry["cause"] = "failure"
        if entry["phase"] == "started":
            entry["phase"] = "detected"
        if device in entry["lost"]:
            return
        entry["phase"] = "detected"  # a loss (re)starts the recovery
        entry["lost"].append(device)
        entry["losses"].append({"device": device, "detected_s": at,
                                "detected_by": detail.get("detected_by"),
                                "reason": detail.get("reason")})
        if entry["detected_s"] is None or at < entry["detected_s"]:
            entry["detected_s"] = at

    def of_generation(generation: Any) -> dict[str, Any] | None:
        if _is_int(generation) and generation in by_generation:
            return by_generation[generation]
        return current

    def keyed(entry: dict[str, Any], generation: Any) -> None:
        if _is_int(generation):
            entry["generation"] = generation
            by_generation[generation] = entry

    for f in ordered:
        kind, at, device = f["kind"], f["at"], f.get("device") or None
        detail = f.get("detail") or {}
        if kind == "device_lost":
            if current is None:
                current = start("failure", at)
            if device is not None:
                lose(current, device, at, detail)
        elif kind == "recovery_started":
            raw = detail.get("lost")
            lost = [u for u in raw if isinstance(u, str)] if isinstance(raw, list) else []
            if current is None:
                current = start("failure" if lost else "dynamic", at)
            keyed(current, detail.get("generation"))
            for uid in lost:
                lose(current, uid, at, {})
        elif kind == "repartition_skipped":
            entry = start("dynamic", at)
            entry.update(moved=False, phase="skipped", replanned_s=at)
            for key in ("predicted_throughput_sps", "measured_throughput_sps", "saved_s",
                        "cost_s"):
                entry[key] = _number(detail.get(key))
        elif kind == "repartitioned":
            cause = detail.get("cause") if detail.get("cause") in ("failure",
                                                                   "dynamic") else None
            if current is None or (cause == "dynamic" and current["cause"] == "failure"):
                current = start(cause or "dynamic", at)
            entry = current
            if cause is not None:
                entry["cause"] = cause
            keyed(entry, detail.get("generation"))
            stages = detail.get("stages")
            entry.update(replanned_s=at, phase="replanned", planner=detail.get("planner"),
                         stages=stages if isinstance(stages, list) else None,
                         predicted_throughput_sps=_number(detail.get("predicted_throughput_sps")),
                         resume_microbatch=_number(detail.get("resume_microbatch")))
            for key in ("measured_throughput_sps", "saved_s", "cost_s"):
                if _number(detail.get(key)) is not None:
                    entry[key] = detail[key]
        elif kind == "weights_redistributed":
            found = of_generation(detail.get("generation"))
            if found is None:
                continue
            found.update(weights_moved_s=at, phase="weights_moved",
                         bytes_moved=_number(detail.get("bytes_moved")),
                         transfers=_number(detail.get("transfers")),
                         weights_duration_s=_number(detail.get("duration_s")))
        elif kind == "recovered":
            found = of_generation(detail.get("generation"))
            if found is None:
                continue
            keyed(found, detail.get("generation"))
            found.update(resumed_s=at, phase="resumed",
                         recovery_s=_number(detail.get("recovery_s")),
                         microbatches_redone=_number(detail.get("microbatches_redone")))
            if _number(detail.get("resume_microbatch")) is not None:
                found["resume_microbatch"] = detail["resume_microbatch"]
            if found is current:
                current = None
        elif kind == "run_failed" and current is not None:
            current.update(phase="failed",
                           error=detail.get("reason") or detail.get("error") or None)
            current = None
    for entry in entries:
        _durations(entry)
    return sorted(entries, key=lambda e: e["started_s"])


def run_recoveries(*, run: Run) -> list[dict[str, Any]]:
    return fault_recoveries(run_faults(run=run))


def run_idle(*, run: Run, window_s: float = LIVE_WINDOW_S
             ) -> tuple[list[float], dict[str, dict[str, float]]]:
    """Each device's busy and idle time (with its causes) over the window ending at the newest
    event, by the orchestrator's one definition (orchestrator.events.idle_breakdown). The
    window is the page's: the last ``window_s`` seconds, or less when more than
    LIVE_MAX_EVENTS events end in them (then from the end of the newest LIVE_MAX_EVENTS-th).
    A live run recomputes this every few seconds, so its cost stays bounded at any rate."""
    rows = _timeline_window_json(run, window_s, newest_n=LIVE_MAX_EVENTS)
    events = [TimelineRecord(**row) for row in rows]
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


def last_stage_backwards(timeline: Sequence[TimelineRecord],
                         recoveries: Sequence[dict[str, Any]]) -> list[TimelineRecord]:
    """The backward passes of the pipeline's last stage (whose backward completes a
    micro-batch) in every generation, in timeline order: before the first re-partition that
    took effect, the highest stage's then; from each one's ``resumed_s`` on, those of the last
    of its ``stages`` (that index, on those devices). Without recoveries: the highest stage's."""
    moves = sorted(((r["resumed_s"], r["stages"]) for r in recoveries
                    if r["resumed_s"] is not None and r["stages"]), key=lambda m: m[0])
    bounds = [at for at, _ in moves]
    lasts: list[tuple[int, set[str]]] = []
    for _, stages in moves:
        tail = stages[-1]
        lasts.append((len(stages) - 1,
                      set(tail.get("devices") or ()) if isinstance(tail, dict) else set()))
    first_last = max((e.stage for e in timeline if not bounds or e.start < bounds[0]),
                     default=0)
    chosen = []
    for e in timeline:
        if e.kind != "backward":
            continue
        k = bisect.bisect_right(bounds, e.start)
        if k == 0:
            if e.stage == first_last:
                chosen.append(e)
            continue
        index, devices = lasts[k - 1]
        if e.stage == index and (not devices or e.device in devices):
            chosen.append(e)
    return chosen


def recovery_summary(recoveries: Sequence[dict[str, Any]], backwards: Sequence[TimelineRecord],
                     *, makespan: float, batch_size: int, microbatches_per_batch: int
                     ) -> dict[str, Any]:
    """The summary's fault figures: ``faults``, one per lost device ({device, detected_s,
    resumed_s, recovery_s}: when it was found lost, when training resumed without it, and the
    recovery's duration; resumed_s and recovery_s null when it never resumed);
    ``batches_lost``, the micro-batches trained again after recoveries and re-partitions
    (``microbatches_redone``) in batches, to 2 decimals; ``throughput_after_sps``, samples/s
    through the last stage from the last resumption (a ``recovered`` event, of a recovery or a
    dynamic re-partition) to the end of the run, null when nothing resumed."""
    faults = [{"device": loss["device"], "detected_s": loss["detected_s"],
               "resumed_s": r["resumed_s"], "recovery_s": r["recovery_s"]}
              for r in recoveries if r["cause"] == "failure" for loss in r["losses"]]
    redone = sum(r["microbatches_redone"] or 0 for r in recoveries if r["moved"])
    resumed = [r["resumed_s"] for r in recoveries if r["resumed_s"] is not None]
    after = None
    if resumed:
        since = max(resumed)
        elapsed = makespan - since
        count = sum(1 for e in backwards if e.start >= since)
        after = count * batch_size / elapsed if elapsed > 0 else None
    return {"faults": faults,
            "batches_lost": round(redone / max(microbatches_per_batch, 1), 2),
            "throughput_after_sps": after}


def run_summary(*, run: Run) -> dict[str, Any]:
    """A finished (or running) run in figures: what was trained, how fast against the
    simulator's prediction for the same plan and length, where the devices waited, and how
    the loss went. Throughputs count samples over the time from the run's start to its last
    event, both measured and simulated, so they compare like for like. A split run's is its
    own (webapp.runs.split_selectors.split_summary)."""
    if run.kind == "split":
        from webapp.runs.split_selectors import split_summary  # it builds on these selectors

        return split_summary(run=run)
    if run.kind == "pipelearn":
        from webapp.runs.pipelearn_selectors import pipelearn_summary  # likewise

        return pipelearn_summary(run=run)
    timeline = [TimelineRecord(**row)
                for row in _timeline_rows_json(run, TimelineEvent.objects.filter(run=run))]
    spec = run.model_spec
    plan = run.chosen_plan
    summary: dict[str, Any] = {"run": run.pk, "state": run.state, "error": run.error or None,
                               "plan": None if plan is None else plan.algorithm,
                               "events": len(timeline)}
    recoveries = run_recoveries(run=run)
    backwards = last_stage_backwards(timeline, recoveries)
    makespan = max((e.end for e in timeline), default=0.0)
    summary["microbatches"] = len(backwards)
    summary["batches"] = len(backwards) // max(run.microbatches, 1)
    summary["makespan_s"] = makespan
    summary["throughput_measured_sps"] = (len(backwards) * spec.batch_size / makespan
                                          if makespan > 0 else 0.0)
    summary["throughput_steady_sps"] = steady_throughput_sps(
        timeline, samples_per_microbatch=spec.batch_size)
    summary["throughput_predicted_sps"] = None
    if plan is not None and backwards:
        profile, devices = run_planning_inputs(run=run)
        cm = build_cost_model(profile, devices)
        document = parse_plan(plan.document, profile=profile, devices=devices,
                              file=f"plan {plan.pk}")
        simulated = simulate(cm, document, microbatches=len(backwards), schedule=run.schedule,
                             flush_every=run.microbatches)
        summary["throughput_predicted_sps"] = simulated.throughput_sps
        summary["throughput_steady_predicted_sps"] = steady_throughput_sps(
            simulated.events, samples_per_microbatch=spec.batch_size)
        summary["throughput_period_sps"] = (document.predicted.throughput_sps
                                            if document.predicted else None)
    summary.update(recovery_summary(recoveries, backwards, makespan=makespan,
                                    batch_size=spec.batch_size,
                                    microbatches_per_batch=run.microbatches))
    summary["idle_s"] = {
        d: idle_breakdown([e for e in timeline if e.device == d], window=(0.0, makespan),
                          schedule=run.schedule).to_json()
        for d in sorted({e.device for e in timeline})}
    losses = list(MetricPoint.objects.filter(run=run, kind=MetricPoint.Kind.LOSS)
                  .order_by("at", "id").values_list("value", flat=True))
    accuracy = list(MetricPoint.objects.filter(run=run, kind=MetricPoint.Kind.ACCURACY)
                    .order_by("at", "id").values_list("value", flat=True))
    window = max(1, min(20, len(losses) // 10))
    summary["loss_first"] = sum(losses[:window]) / window if losses else None
    summary["loss_last"] = sum(losses[-window:]) / window if losses else None
    summary["accuracy"] = (sum(accuracy[-window:]) / len(accuracy[-window:])
                           if accuracy else None)
    return summary
