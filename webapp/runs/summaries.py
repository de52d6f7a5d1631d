"""A run's faults grouped into recoveries, and the run in figures (run_summary): what was
trained, how fast against the simulator's prediction for the same plan and length, its
recoveries, where the devices waited, and how the loss went (a split or PipeLearn run's
summary is its own: split_selectors, pipelearn_selectors). Reads only."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from orchestrator.cost import build_cost_model
from orchestrator.events import TimelineEvent as TimelineRecord
from orchestrator.events import idle_breakdown, steady_throughput_sps
from orchestrator.planformat import parse_plan
from orchestrator.simulator import simulate
from webapp.runs.models import MetricPoint, Run, TimelineEvent
from webapp.runs.pipelearn_selectors import pipelearn_summary
from webapp.runs.selectors import run_faults, run_planning_inputs, timeline_rows_json
from webapp.runs.split_selectors import split_summary

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
        return split_summary(run=run)
    if run.kind == "pipelearn":
        return pipelearn_summary(run=run)
    timeline = [TimelineRecord(**row)
                for row in timeline_rows_json(run, TimelineEvent.objects.filter(run=run))]
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
