"""What the pages read of a split run: its plans' layouts, the chosen schedule's planned
timeline (the live Gantt's ghost bars), each batch's makespan against the plan, each
client's progress and each round's held-out accuracy, and its summary (run_summary's for a
split run)."""

from __future__ import annotations

import math
from typing import Any

from django.db.models import Max

from orchestrator.errors import FormatError
from orchestrator.sl.formats import Instance, Schedule, parse_instance, parse_schedule
from orchestrator.sl.measured import batch_spans, split_figures
from orchestrator.sl.planned import batch_events
from webapp.runs.models import MetricPoint, Plan, Run
from webapp.runs.models import TimelineEvent as TimelineRow
from webapp.runs.services.split_rounds import split_rounds
from webapp.runs.states import Deployment


def _layers(a: int, e: int) -> str:
    return f"layer {a}" if a == e else f"layers {a}\u2013{e}"


def split_parsed(document: Any) -> tuple[Instance, Schedule, list[str], list[str]]:
    """A split plan document's instance, schedule, clients and helpers; FormatError when it
    is not one."""
    if not isinstance(document, dict) or document.get("kind") != "split":
        raise FormatError("not a split plan")
    clients, helpers = document.get("clients"), document.get("helpers")
    if not isinstance(clients, list) or not isinstance(helpers, list):
        raise FormatError("a split plan names its clients and helpers")
    return (parse_instance(document.get("instance"), file="plan instance"),
            parse_schedule(document.get("schedule"), file="plan schedule"),
            [str(c) for c in clients], [str(h) for h in helpers])


def split_plan_layout(*, document: Any, names: dict[str, str], plan: Plan | None = None
                      ) -> dict[str, Any]:
    """A split plan laid out as the pages show a plan (dashboard.selectors.plan_layout): the
    clients' row first (part-1 and part-3 on each), then the helpers' (part-2 of the clients
    each serves), with the assignment in words."""
    try:
        _, schedule, clients, helpers = split_parsed(document)
        pipeline = document["run_plan"]["pipelines"][0]["stages"]
        (a1, e1), (a2, e2), (a3, e3) = (tuple(s["layers"]) for s in pipeline)
    except (FormatError, KeyError, IndexError, TypeError, ValueError):
        return {"plan": plan.pk if plan else None, "algorithm": plan.algorithm if plan else "",
                "stages": [], "summary": "split plan", "beta": False, "notes": []}
    label = lambda uid: names.get(uid, uid)  # noqa: E731 (one use each)
    served = {i: [label(c) for j, c in enumerate(clients) if schedule.assignment[j] == i]
              for i in range(len(helpers))}
    stages = [
        {"stage": 0, "layers": [a1, e3], "replicas": 1, "role": "clients",
         "devices": [{"device": c, "label": label(c), "beta": [], "sequential": False,
                      "passes": ""} for c in clients],
         "text": f"part-1 ({_layers(a1, e1)}) and part-3 ({_layers(a3, e3)}) on each client: "
                 + ", ".join(label(c) for c in clients)},
        {"stage": 1, "layers": [a2, e2], "replicas": 1, "role": "helpers",
         "devices": [{"device": h, "label": label(h), "beta": [], "sequential": False,
                      "passes": "part-2 of " + (", ".join(served[i]) or "no client")}
                     for i, h in enumerate(helpers)],
         "text": f"part-2 ({_layers(a2, e2)}) on the helpers: " + "; ".join(
             f"{label(h)} for {', '.join(served[i]) or 'no client'}"
             for i, h in enumerate(helpers))}]
    makespan = document.get("makespan_s")
    notes = [f"a batch of every client in {makespan:.4g} s as planned"] \
        if isinstance(makespan, (int, float)) else []
    return {"plan": plan.pk if plan else None, "algorithm": plan.algorithm if plan else "",
            "stages": stages, "summary": f"{len(clients)} clients, {len(helpers)} helpers",
            "beta": False, "notes": notes}


def split_ghost_timeline(*, run: Run, plan: Plan, start_s: float, end_s: float,
                         anchor_s: float, max_events: int, batches: int | None = None
                         ) -> dict[str, Any]:
    """The chosen schedule's batch repeated every planned makespan from the run's first
    event (``anchor_s``), for each of the run's batches (the first ``batches`` only, when
    given), between ``start_s`` and ``end_s``."""
    instance, schedule, clients, helpers = split_parsed(plan.document)
    period = schedule.makespan * instance.slot_ms / 1000.0
    template = batch_events(instance=instance, schedule=schedule, clients=clients,
                            helpers=helpers, run=run.pk)
    total = run.batches * run.epochs * run.microbatches if batches is None else batches
    out: list[dict[str, Any]] = []
    if period > 0 and template:
        first = max(0, math.floor((start_s - anchor_s) / period) - 1)
        last = total - 1
        if math.isfinite(end_s):
            last = min(last, math.ceil((end_s - anchor_s) / period))
        for m in range(first, last + 1):
            dt = anchor_s + m * period
            out.extend({**e.to_json(), "start": e.start + dt, "end": e.end + dt, "microbatch": m}
                       for e in template if e.end + dt >= start_s and e.start + dt <= end_s)
            if len(out) >= max_events:
                break
    out.sort(key=lambda e: (e["start"], e["end"], e["device"], e["kind"]))
    return {"plan": plan.pk, "algorithm": plan.algorithm, "anchor_s": anchor_s,
            "batch_period_s": period, "start_s": start_s, "end_s": end_s,
            "truncated": len(out) > max_events, "events": out[:max_events]}


def split_progress(*, run: Run) -> dict[str, Any]:
    """A split run as its page shows it: the chosen plan's batch makespan, each batch's
    measured one, each client's batches done (its last part-1 backward) and helper, and the
    rounds evaluated so far."""
    plan = run.chosen_plan
    clients = list(run.split.get("clients") or [])
    planned: float | None = None
    assignment: dict[str, str] = {}
    if plan is not None:
        try:
            instance, schedule, plan_clients, helpers = split_parsed(plan.document)
        except FormatError:
            pass
        else:
            planned = schedule.makespan * instance.slot_ms / 1000.0
            assignment = {c: helpers[schedule.assignment[j]] for j, c in enumerate(plan_clients)}
    passes = TimelineRow.objects.filter(run=run, stage=0, kind__in=("forward", "backward")
                                        ).values("stage", "kind", "microbatch", "start", "end",
                                                 "pipeline")
    # a batch under way is one not every client of the plan now training has finished
    current = Deployment.from_json(run.deployment).plan or (plan.document if plan else None)
    training = len(current.get("clients") or ()) if isinstance(current, dict) else None
    makespans = {m: end - start for m, (start, end) in batch_spans(passes, pipelines=training)
                 .items()}
    done = dict(TimelineRow.objects.filter(run=run, stage=0, kind="backward")
                .values_list("pipeline").annotate(m=Max("microbatch")).values_list("pipeline",
                                                                                    "m"))
    per_round = run.batches * run.microbatches
    return {
        "planned_makespan_s": planned,
        "batches": [{"batch": m, "makespan_s": s} for m, s in makespans.items()],
        "clients": [{"device": c, "helper": assignment.get(c),
                     "batches_done": done[j] + 1 if j in done else 0,
                     "batches": per_round * run.epochs} for j, c in enumerate(clients)],
        "round_batches": per_round, "rounds": split_rounds(run=run),
    }


def held_out_accuracy(run: Run) -> dict[int, float]:
    """Each evaluated round's held-out accuracy of the aggregated model, by round from 0 (the
    server measures it after each round's FedAvg: webapp.runs.services.split_rounds)."""
    return {int(r["round"]) - 1: float(r["accuracy"])
            for r in split_rounds(run=run) if "round" in r and "accuracy" in r}


def split_summary(*, run: Run) -> dict[str, Any]:
    """A finished (or running) split run in figures: what it trained, each round's mean
    training loss and accuracy and the aggregated model's held-out accuracy after it
    (``test_accuracy``, None until measured), the measured batch makespan against the
    plan's."""
    plan: Plan | None = run.chosen_plan
    settings = run.split or {}
    events = list(TimelineRow.objects.filter(run=run).values(
        "device", "stage", "pipeline", "kind", "microbatch", "start", "end"))
    metrics = MetricPoint.objects.filter(run=run, kind__in=("loss", "accuracy")).values(
        "at", "kind", "device", "value")
    planned = None
    if plan is not None and isinstance(plan.document, dict):
        planned = plan.document.get("makespan_s", plan.period_s)
    figures = split_figures(events=events, metrics=metrics, pipelines=None,
                            batches_per_round=run.batches, rounds=run.epochs,
                            planned_makespan_s=planned)
    held_out = held_out_accuracy(run)
    for row in figures["rounds"]:
        row["test_accuracy"] = held_out.get(row["round"])
    return {"run": run.pk, "kind": "split", "state": run.state, "error": run.error or None,
            "plan": None if plan is None else plan.algorithm,
            "clients": len(settings.get("clients") or ()),
            "helpers": len(settings.get("helpers") or ()),
            "batches_per_round": run.batches, "rounds_planned": run.epochs,
            "events": len(events),
            "makespan_s": max((e["end"] for e in events), default=0.0), **figures}
