"""What the pages read of a PipeLearn run: its plans' layouts (each device's split P and
parallel batch number N, the server's copies), the time model's planned epoch (the live
Gantt's ghost bars), and its summary (run_summary's for a PipeLearn run): each epoch's time
against the time model's, each device's and the server's idle share, and each epoch's
held-out accuracy of the averaged model."""

from __future__ import annotations

import math
import statistics
from typing import Any

from orchestrator.errors import FormatError
from orchestrator.events import TimelineEvent, idle_breakdown
from orchestrator.pipelearn_run import SCHEDULE
from orchestrator.pipelearn_timeline import timeline as planned_epoch
from webapp.runs.models import MetricPoint, Plan, Run
from webapp.runs.models import TimelineEvent as TimelineRow
from webapp.runs.services.pipelearn import pipelearn_method_plan
from webapp.runs.services.split_rounds import split_rounds


def pipelearn_plan_layout(*, document: Any, names: dict[str, str], plan: Plan | None = None
                          ) -> dict[str, Any]:
    """A PipeLearn (or SFL, FL) plan laid out as the pages show a plan: the devices' row
    (each with its layers and N) and the server's (a copy of the rest for each)."""
    doc = document if isinstance(document, dict) else {}
    label = lambda uid: names.get(uid, uid)  # noqa: E731 (one use each)
    server = str(doc.get("server", ""))
    clients = [str(c) for c in doc.get("clients") or []]
    per_device = doc.get("devices") if isinstance(doc.get("devices"), dict) else {}
    layers = []
    try:
        pipelines = doc["run_plan"]["pipelines"]
        layers = [[tuple(s["layers"]) for s in p["stages"]] for p in pipelines]
    except (KeyError, TypeError):
        pass
    devices, copies = [], []
    for j, c in enumerate(clients):
        mine = per_device.get(c) or {}
        n = mine.get("parallel_batches", 1)
        own = layers[j][0] if j < len(layers) else None
        devices.append({"device": c, "label": label(c), "beta": [], "sequential": False,
                        "passes": (f"layers {own[0]}\u2013{own[1]}" if own else "")
                        + f", N = {n}"})
        if j < len(layers) and len(layers[j]) > 1:
            a, e = layers[j][1]
            copies.append(f"layers {a}\u2013{e} for {label(c)}")
    stages = [{"stage": 0, "layers": None, "replicas": 1, "role": "devices",
               "devices": devices,
               "text": "each device's own layers on its data: " + "; ".join(
                   f"{d['label']} ({d['passes']})" for d in devices)}]
    if copies:
        stages.append({"stage": 1, "layers": None, "replicas": 1, "role": "server",
                       "devices": [{"device": server, "label": label(server), "beta": [],
                                    "sequential": False, "passes": "; ".join(copies)}],
                       "text": f"a copy of the rest for each device on {label(server)}: "
                               + "; ".join(copies)})
    epoch = doc.get("epoch_s")
    notes = [f"an epoch in {epoch:.4g} s by the time model"] \
        if isinstance(epoch, (int, float)) else []
    method = str(doc.get("method", ""))
    return {"plan": plan.pk if plan else None,
            "algorithm": plan.algorithm if plan else method, "stages": stages,
            "summary": f"{method}: {len(clients)} devices and a server", "beta": False,
            "notes": notes}


def pipelearn_summary(*, run: Run) -> dict[str, Any]:
    """A finished (or running) PipeLearn run in figures: each epoch's measured time (from
    its first event to the end of its FedAvg) against the time model's, each device's and
    the server's idle share over the run, and each epoch's held-out accuracy."""
    plan = run.chosen_plan
    document: dict[str, Any] = plan.document if plan is not None and isinstance(
        plan.document, dict) else {}
    server = str((run.pipelearn or {}).get("server", ""))
    rows = list(TimelineRow.objects.filter(run=run).values_list(
        "device", "stage", "kind", "microbatch", "version", "start", "end", "bytes",
        "pipeline"))
    timeline = [TimelineEvent(run.pk, *row) for row in rows]
    makespan = max((e.end for e in timeline), default=0.0)
    # epoch k ends when the last of its FedAvgs does (pipeline j's k-th ends at micro-batch
    # (k + 1) x its micro-batches an epoch - 1)
    counts = (document.get("run_plan") or {}).get("microbatches") or []
    every = [max(1, int(n) // max(1, run.epochs)) for n in counts]
    ended: dict[int, float] = {}
    for e in timeline:
        if e.kind == "aggregate" and e.pipeline < len(every):
            k = (e.microbatch + 1) // every[e.pipeline] - 1
            ended[k] = max(ended.get(k, 0.0), e.end)
    epoch_ends = [ended[k] for k in sorted(ended)]
    starts = [0.0, *epoch_ends[:-1]]
    epochs_s = [b - a for a, b in zip(starts, epoch_ends, strict=False)]
    busy = {}
    for device in sorted({e.device for e in timeline}):
        idle = idle_breakdown([e for e in timeline if e.device == device],
                              window=(0.0, makespan), schedule=SCHEDULE)
        busy[device] = idle.to_json()
    rounds = split_rounds(run=run)
    losses = list(MetricPoint.objects.filter(run=run, kind=MetricPoint.Kind.LOSS)
                  .order_by("at", "id").values_list("value", flat=True))
    return {"run": run.pk, "kind": "pipelearn", "state": run.state,
            "error": run.error or None, "plan": None if plan is None else plan.algorithm,
            "method": document.get("method"), "server": server,
            "clients": len(document.get("clients") or []), "events": len(timeline),
            "makespan_s": makespan, "epochs": len(epoch_ends),
            "epoch_s_measured": epochs_s,
            "epoch_s_median": statistics.median(epochs_s) if epochs_s else None,
            "epoch_s_predicted": document.get("epoch_s"),
            "iteration_s_predicted": document.get("iteration_s"),
            "idle_s": busy, "test_accuracy": [r.get("accuracy") for r in rounds],
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None}


def pipelearn_epoch_events(*, run: Run, plan: Plan) -> tuple[list[TimelineEvent], float]:
    """One epoch of ``plan``'s method as the time model schedules it, in the runtime's rows
    (a device's pipeline j stage 0, the server's copy for it pipeline j stage 1; the time
    model's server-side FedAvg left out: the runtime averages by ring), and the epoch's
    length. FormatError when the plan is not a PipeLearn plan."""
    document = plan.document if isinstance(plan.document, dict) else {}
    if document.get("kind") != "pipelearn":
        raise FormatError("not a PipeLearn plan")
    settings = run.pipelearn or {}
    server, clients = str(settings.get("server")), list(document.get("clients") or [])
    method = pipelearn_method_plan(run=run, method=str(document.get("method")),
                                   clients=clients)
    index = {c: j for j, c in enumerate(clients)}
    out = []
    for e in planned_epoch(method=method, run=run.pk):
        if e.kind == "aggregate":
            continue
        if e.device == server:
            client = clients[e.stage - 1] if 1 <= e.stage <= len(clients) else None
            if client is None:
                continue
            out.append(TimelineEvent(run.pk, server, 1, e.kind, e.microbatch, e.version,
                                     e.start, e.end, e.bytes, pipeline=index[client]))
        elif e.device in index:
            out.append(TimelineEvent(run.pk, e.device, 0, e.kind, e.microbatch, e.version,
                                     e.start, e.end, e.bytes, pipeline=index[e.device]))
    return out, method.epoch_s


def pipelearn_ghost_timeline(*, run: Run, plan: Plan, start_s: float, end_s: float,
                             anchor_s: float, max_events: int) -> dict[str, Any]:
    """The time model's epoch repeated every predicted epoch from the run's first event
    (``anchor_s``), for each of its epochs, between ``start_s`` and ``end_s``; micro-batches
    and versions numbered on across epochs."""
    template, period = pipelearn_epoch_events(run=run, plan=plan)
    per_epoch = {}
    for e in template:
        per_epoch[e.pipeline] = max(per_epoch.get(e.pipeline, 0), e.microbatch + 1)
    versions = max((e.version for e in template), default=0) + 1
    out: list[dict[str, Any]] = []
    if period > 0 and template:
        first = max(0, math.floor((start_s - anchor_s) / period) - 1)
        last = run.epochs - 1
        if math.isfinite(end_s):
            last = min(last, math.ceil((end_s - anchor_s) / period))
        for k in range(first, last + 1):
            dt = anchor_s + k * period
            out.extend({**e.to_json(), "start": e.start + dt, "end": e.end + dt,
                        "microbatch": e.microbatch + k * per_epoch.get(e.pipeline, 0),
                        "version": e.version + k * versions}
                       for e in template if e.end + dt >= start_s and e.start + dt <= end_s)
            if len(out) >= max_events:
                break
    out.sort(key=lambda e: (e["start"], e["end"], e["device"], e["kind"]))
    return {"plan": plan.pk, "algorithm": plan.algorithm, "anchor_s": anchor_s,
            "batch_period_s": period, "start_s": start_s, "end_s": end_s,
            "truncated": len(out) > max_events, "events": out[:max_events]}
