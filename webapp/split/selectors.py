"""Reads on split-learning studies: the shared instance files, the studies, the comparison of
a study's schedules and the bars of a schedule's Gantt (helpers and clients over time slots)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Prefetch, QuerySet

from orchestrator.sl.exact import simple_lower_bound
from orchestrator.sl.formats import (
    Instance,
    Schedule,
    parse_instance,
    parse_schedule,
    read_instances,
)
from orchestrator.sl.solve import METHODS
from webapp.split.models import SplitSchedule, SplitStudy

SHARED_DIR = "data/sl"
UNFINISHED = (SplitSchedule.Status.PENDING, SplitSchedule.Status.RUNNING)
METHOD_DESCRIPTIONS = {
    "auto": "local search over assignments, then CP-SAT on instances small enough "
            "(recommended)",
    "exact": "the paper's slot-indexed model with CP-SAT: a proven lower bound and the gap",
    "admm": "the paper's Algorithm 1 (ADMM) with Algorithm 2 for the backward tasks",
    "balanced-greedy": "the paper's heuristic: balanced client counts, first come first served",
    "random-fcfs": "the paper's baseline: random assignment (seeded), first come first served",
}
DEFAULT_METHODS = ("balanced-greedy", "random-fcfs", "auto")


# --------------------------------------------------------------------------- shared instances


@dataclass(frozen=True)
class SharedInstance:
    """One instance of a shared file, as a form offers it."""

    file: str
    index: int
    name: str
    clients: int
    helpers: int

    @property
    def source(self) -> str:
        return f"{self.file}#{self.index}"


def shared_instance_files() -> list[str]:
    """The shared instance files (``data/sl/*.jsonl``), relative to the checkout."""
    folder = Path(settings.BASE_DIR) / SHARED_DIR
    return [f"{SHARED_DIR}/{p.name}" for p in sorted(folder.glob("*.jsonl"))]


@functools.lru_cache(maxsize=8)
def _read_shared(path: str, mtime_ns: int) -> tuple[Instance, ...]:
    return read_instances(path)


def shared_instances(file: str) -> tuple[Instance, ...]:
    """Every instance of a shared file (read once per version of the file)."""
    path = Path(settings.BASE_DIR) / file
    return _read_shared(str(path), path.stat().st_mtime_ns)


def shared_instance_choices() -> list[SharedInstance]:
    return [SharedInstance(file=file, index=k, name=inst.name, clients=inst.clients,
                           helpers=inst.helpers)
            for file in shared_instance_files() for k, inst in enumerate(shared_instances(file))]


# --------------------------------------------------------------------------- studies


def split_study_list() -> QuerySet[SplitStudy]:
    return SplitStudy.objects.select_related("created_by").prefetch_related(
        Prefetch("schedules", queryset=SplitSchedule.objects.order_by("id")))


def split_study_status(*, study: SplitStudy) -> str:
    """``running`` while a method is left to compute, else ``done`` if one succeeded, else
    ``failed``."""
    statuses = {s.status for s in study.schedules.all()}
    if statuses & set(UNFINISHED):
        return "running"
    return "done" if SplitSchedule.Status.DONE in statuses else "failed"


def split_study_rows(studies: Iterable[SplitStudy]) -> list[dict[str, Any]]:
    """What the studies table shows of each: its status, schedules and best makespan."""
    rows = []
    for study in studies:
        schedules = list(study.schedules.all())
        done = [s for s in schedules if s.status == SplitSchedule.Status.DONE]
        best = min(done, key=lambda s: (s.makespan, s.pk)) if done else None
        rows.append({"study": study, "status": split_study_status(study=study),
                     "schedules": schedules, "best": best})
    return rows


def split_study_instance(*, study: SplitStudy) -> Instance:
    return parse_instance(study.instance, file=f"split study {study.pk}")


# --------------------------------------------------------------------------- comparison


def _bound(instance: Instance, done: list[SplitSchedule]) -> tuple[int, str]:
    """The best lower bound known: the simple bound, or one a method proved (exact, auto)."""
    bound, origin = simple_lower_bound(instance=instance), "simple"
    for s in done:
        if s.lower_bound is not None and s.lower_bound > bound:
            bound, origin = s.lower_bound, s.method
    return bound, origin


def _percent(fraction: float) -> str:
    value = fraction * 100
    return f"{value:.0f}%" if value >= 10 or value == 0 else f"{value:.1f}%"


def _reason(ranked: list[SplitSchedule], bound: int, slot_ms: float) -> str:
    """One line on why the best is best: its makespan, how much shorter than the worst, and
    how far from the optimum it can at most be."""
    if not ranked:
        return ""
    best = ranked[0]
    assert best.makespan is not None
    tied = [s.method for s in ranked if s.makespan == best.makespan]
    who = f"{best.method} has" if len(tied) == 1 else \
        f"{', '.join(tied[:-1])} and {tied[-1]} share"
    text = (f"{who} the shortest makespan ({best.makespan} slots, "
            f"{best.makespan * slot_ms / 1000:.1f} s)")
    worst = ranked[-1]
    if worst.makespan is not None and worst.makespan > best.makespan:
        text += (f", {_percent((worst.makespan - best.makespan) / worst.makespan)} shorter than "
                 f"{worst.method} ({worst.makespan} slots)")
    if best.makespan <= bound:
        return text + "; it is optimal (it meets the lower bound)"
    return (text + f"; it is at most {_percent((best.makespan - bound) / bound)} above the "
                   f"optimum (lower bound {bound} slots)")


def split_compare(*, study: SplitStudy) -> dict[str, Any]:
    """The study's schedules ranked by makespan (the computed ones first), each with its gap
    to the best and to the best lower bound known, and why the best is best."""
    schedules = list(study.schedules.all())
    done = sorted((s for s in schedules if s.status == SplitSchedule.Status.DONE),
                  key=lambda s: (s.makespan, s.solver_s or 0.0, s.pk))
    rest = sorted((s for s in schedules if s.status != SplitSchedule.Status.DONE),
                  key=lambda s: s.pk)
    bound, origin = _bound(split_study_instance(study=study), done)
    best = done[0].makespan if done else None
    rows = []
    for s in (*done, *rest):
        m = s.makespan
        rows.append({
            "schedule": s.pk, "method": s.method, "status": s.status, "makespan": m,
            "makespan_s": m * study.slot_ms / 1000 if m is not None else None,
            "gap_to_best": (m - best) / best if m is not None and best else None,
            "gap_to_bound": (m - bound) / bound if m is not None else None,
            "lower_bound": s.lower_bound, "solver_s": s.solver_s, "error": s.error,
        })
    return {"best": done[0].pk if done else None, "reason": _reason(done, bound, study.slot_ms),
            "lower_bound": bound, "lower_bound_from": origin, "rows": rows}


# --------------------------------------------------------------------------- Gantt

HELPER_KINDS = ("forward", "backward")
CLIENT_KINDS = ("client-forward", "client-loss", "client-backward", "client-finish")


def _bar(row: int, kind: str, client: int, helper: int, start: int, end: int
         ) -> dict[str, Any]:
    return {"row": row, "kind": kind, "client": client, "helper": helper, "start": start,
            "end": end}


def _client_bars(inst: Instance, sch: Schedule, j: int, row: int) -> list[dict[str, Any]]:
    """Client j's own part: part-1 forward and upload until its release at the helper (r),
    transfer, part-3 forward and loss (l), part-3 backward and gradient upload (l') after its
    forward on the helper, gradient download and part-1 backward (r') after its backward."""
    i = sch.assignment[j]
    forward_end = max(s.end for s in sch.forward if s.client == j)
    backward_end = max(s.end for s in sch.backward if s.client == j)
    loss_end = forward_end + inst.l[j][i]
    spans = (("client-forward", 0, inst.r[j][i]), ("client-loss", forward_end, loss_end),
             ("client-backward", loss_end, loss_end + inst.lp[j][i]),
             ("client-finish", backward_end, backward_end + inst.rp[j][i]))
    return [_bar(row, kind, j, i, a, b) for kind, a, b in spans if b > a]


def split_schedule_gantt(*, schedule: SplitSchedule) -> dict[str, Any]:
    """The rows (each helper, then each client) and bars of a computed schedule, in slots."""
    study = schedule.study
    inst = split_study_instance(study=study)
    sch = parse_schedule(schedule.schedule, file=f"split schedule {schedule.pk}")
    rows: list[dict[str, Any]] = [{"label": f"helper {i}", "kind": "helper", "helper": i}
                                  for i in range(inst.helpers)]
    bars = [_bar(seg.helper, kind, seg.client, seg.helper, seg.start, seg.end)
            for kind, segments in zip(HELPER_KINDS, (sch.forward, sch.backward), strict=True)
            for seg in segments]
    for j in range(inst.clients):
        row = len(rows)
        rows.append({"label": f"client {j} (h{sch.assignment[j]})", "kind": "client",
                     "helper": sch.assignment[j]})
        bars += _client_bars(inst, sch, j, row)
    return {"schedule": schedule.pk, "method": schedule.method, "makespan": sch.makespan,
            "slot_ms": inst.slot_ms, "completion": list(sch.completion), "rows": rows,
            "bars": bars}


def method_choices() -> list[dict[str, str]]:
    return [{"name": m, "description": METHOD_DESCRIPTIONS[m]} for m in METHODS]
