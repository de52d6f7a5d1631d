"""From per-helper slot plans to a schedule (Tirana et al., INFOCOM 2024, Section III).

Every method ends the same way: each helper gets a :class:`HelperPlan` (the slots it spends on
each of its clients' forward and backward tasks) and :func:`assemble` turns the plans into a
:class:`~orchestrator.sl.formats.Schedule` with completion_j = end of backward + r'_ij and the
makespan max_j completion_j (the objective of the paper's problem P, eq. (1)).

:func:`plan_helper` is the decomposition of Section IV applied to one helper: the forward
tasks first (1 | r_j, pmtn | max C_j + tail_j), then the backward tasks on the slots left,
released at forward end + l_ij + l'_ij, minimising max C_j + r'_ij (problem P_b, Algorithm 2).

:func:`plan_list` schedules forward and backward tasks together by priority rules, for the
local search of ``auto``.

The preemption cost extension: with ``switch_slots`` = s > 0 on a helper, resuming a task costs
s reload slots. Both planners then keep the better of two repairs of the preemptive plan
(:func:`repair_switch`): the same segments in the same order with s slots added to every
resumed segment, or no preemption at all (tasks in the order the preemptive plan completes
them). Neither is optimal under the switching cost; the exact model is.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from orchestrator.sl.formats import Instance, Schedule, Segment
from orchestrator.sl.machine import Job, Slots, jackson, runs

Scheduler = Callable[..., dict[int, Slots]]
FORWARD_TAILS = ("chain", "transfer")


@dataclass(frozen=True)
class HelperPlan:
    """The slots one helper spends on each of its clients, forward and backward."""

    helper: int
    forward: Mapping[int, Slots]
    backward: Mapping[int, Slots]


def make_plan(*, helper: int, forward: Mapping[int, Slots],
              backward: Mapping[int, Slots]) -> HelperPlan:
    return HelperPlan(helper=helper, forward=MappingProxyType(dict(forward)),
                      backward=MappingProxyType(dict(backward)))


def plan_cost(*, instance: Instance, plan: HelperPlan) -> int:
    """The latest completion among the helper's clients (0 for an idle helper)."""
    i = plan.helper
    return max((slots[-1] + 1 + instance.rp[j][i] for j, slots in plan.backward.items()),
               default=0)


def forward_tail(*, instance: Instance, client: int, helper: int, kind: str) -> int:
    """What follows a forward task before its client completes, as the forward objective sees
    it: ``chain`` = l + l' + p' + r' (a lower bound on the rest), ``transfer`` = l (the
    paper's P_f objective, max_j forward end + l_ij)."""
    j, i = client, helper
    if kind == "chain":
        return instance.l[j][i] + instance.lp[j][i] + instance.pp[j][i] + instance.rp[j][i]
    if kind == "transfer":
        return instance.l[j][i]
    raise ValueError(f"unknown forward tail {kind!r} (known: {', '.join(FORWARD_TAILS)})")


def backward_jobs(*, instance: Instance, helper: int,
                  forward: Mapping[int, Slots]) -> list[Job]:
    """The backward tasks of a helper's clients, released at forward end + l + l'."""
    i = helper
    return [Job(key=j, release=slots[-1] + 1 + instance.l[j][i] + instance.lp[j][i],
                duration=instance.pp[j][i], tail=instance.rp[j][i])
            for j, slots in sorted(forward.items())]


def plan_helper(*, instance: Instance, helper: int, clients: Iterable[int],
                tail: str = "chain", switch_slots: int = 0,
                forward_scheduler: Scheduler = jackson,
                backward_scheduler: Scheduler = jackson) -> HelperPlan:
    """Forward tasks by ``forward_scheduler`` with the ``tail`` objective, then backward tasks
    on the free slots by ``backward_scheduler``; with a switch cost, the better repair."""
    i = helper
    members = sorted(clients)
    fwd_jobs = [Job(key=j, release=instance.r[j][i], duration=instance.p[j][i],
                    tail=forward_tail(instance=instance, client=j, helper=i, kind=tail))
                for j in members]
    forward = forward_scheduler(jobs=fwd_jobs)
    taken = [t for slots in forward.values() for t in slots]
    backward = backward_scheduler(jobs=backward_jobs(instance=instance, helper=i, forward=forward),
                                  blocked=taken)
    plan = make_plan(helper=i, forward=forward, backward=backward)
    if switch_slots:
        return repair_switch(instance=instance, plan=plan, switch_slots=switch_slots)
    return plan


def plan_list(*, instance: Instance, helper: int, clients: Iterable[int], tail: str = "chain",
              backward_first: bool = False, switch_slots: int = 0) -> HelperPlan:
    """Preemptive list scheduling of forward and backward tasks together: at every slot the
    released task of the higher class runs (forward tasks first, or backward tasks first),
    within a class the largest tail; a backward task is released at forward end + l + l'.

    Forward-first with Jackson's rule is the decomposition of :func:`plan_helper`; backward-
    first keeps a heavily loaded helper busy by returning gradients as soon as they arrive.
    """
    i = helper
    fwd_class, bwd_class = (1, 0) if backward_first else (0, 1)
    pending: list[tuple[int, int, int]] = [(instance.r[j][i], 0, j) for j in clients]
    heapq.heapify(pending)
    ready: list[tuple[int, int, int, int, int]] = []
    left: dict[tuple[int, int], int] = {}
    slots: dict[tuple[int, int], list[int]] = {}
    t = 0
    while pending or ready:
        if not ready:
            t = max(t, pending[0][0])
        while pending and pending[0][0] <= t:
            rel, kind, j = heapq.heappop(pending)
            if kind == 0:
                rank = (fwd_class, -forward_tail(instance=instance, client=j, helper=i, kind=tail))
                left[(0, j)] = instance.p[j][i]
            else:
                rank = (bwd_class, -instance.rp[j][i])
                left[(1, j)] = instance.pp[j][i]
            heapq.heappush(ready, (*rank, rel, kind, j))
        *_, kind, j = ready[0]
        until = t + left[(kind, j)]
        if pending:
            until = min(until, pending[0][0])
        slots.setdefault((kind, j), []).extend(range(t, until))
        left[(kind, j)] -= until - t
        t = until
        if left[(kind, j)] == 0:
            heapq.heappop(ready)
            if kind == 0:
                heapq.heappush(pending, (t + instance.l[j][i] + instance.lp[j][i], 1, j))
    plan = make_plan(helper=i, forward={j: tuple(v) for (k, j), v in slots.items() if k == 0},
                     backward={j: tuple(v) for (k, j), v in slots.items() if k == 1})
    if switch_slots:
        return repair_switch(instance=instance, plan=plan, switch_slots=switch_slots)
    return plan


def candidate_plans(*, instance: Instance, helper: int, clients: Iterable[int],
                    switch_slots: int = 0) -> list[HelperPlan]:
    """The list schedules for each forward objective of :data:`FORWARD_TAILS`, forward-first
    and backward-first."""
    members = tuple(clients)
    return [plan_list(instance=instance, helper=helper, clients=members, tail=kind,
                      backward_first=first, switch_slots=switch_slots)
            for kind in FORWARD_TAILS for first in (False, True)]


def cheapest(*, instance: Instance, plans: Iterable[HelperPlan]) -> HelperPlan:
    return min(plans, key=lambda pl: plan_cost(instance=instance, plan=pl))


# --------------------------------------------------------------------------- switching cost

_Piece = tuple[str, int, int]  # (kind, client, slots)


def _pieces(plan: HelperPlan) -> list[tuple[int, str, int, int]]:
    """Every segment of the plan as (start, kind, client, length), in time order."""
    out: list[tuple[int, str, int, int]] = []
    for kind, tasks in (("forward", plan.forward), ("backward", plan.backward)):
        for j, slots in tasks.items():
            out.extend((a, kind, j, b - a) for a, b in runs(slots))
    return sorted(out)


def _replay(*, instance: Instance, helper: int, pieces: Sequence[_Piece],
            switch_slots: int) -> HelperPlan:
    """Run the pieces in the given order, each as early as its task allows, adding the reload
    slots to a piece that resumes a task interrupted by another one."""
    i = helper
    t = 0
    forward: dict[int, list[int]] = {}
    backward: dict[int, list[int]] = {}
    last: tuple[str, int] | None = None
    for kind, j, length in pieces:
        tasks = forward if kind == "forward" else backward
        if kind == "forward":
            ready = instance.r[j][i]
        else:
            ready = forward[j][-1] + 1 + instance.l[j][i] + instance.lp[j][i]
        contiguous = last == (kind, j) and tasks[j][-1] + 1 >= max(t, ready)
        start = max(t, ready)
        extra = switch_slots if j in tasks and not contiguous else 0
        tasks.setdefault(j, []).extend(range(start, start + length + extra))
        t = start + length + extra
        last = (kind, j)
    return make_plan(helper=i, forward={j: tuple(s) for j, s in forward.items()},
                     backward={j: tuple(s) for j, s in backward.items()})


def repair_switch(*, instance: Instance, plan: HelperPlan, switch_slots: int) -> HelperPlan:
    """A plan feasible under the switching cost, built from a preemptive ``plan``."""
    pieces = _pieces(plan)
    kept = _replay(instance=instance, helper=plan.helper,
                   pieces=[(kind, j, n) for _, kind, j, n in pieces], switch_slots=switch_slots)
    whole: dict[tuple[str, int], int] = {}
    for _, kind, j, n in pieces:
        whole[(kind, j)] = whole.get((kind, j), 0) + n
    by_end = sorted(whole, key=lambda task: (_task_end(plan, task), task))
    unsplit = _replay(instance=instance, helper=plan.helper,
                      pieces=[(kind, j, whole[(kind, j)]) for kind, j in by_end],
                      switch_slots=switch_slots)
    return min((kept, unsplit), key=lambda pl: plan_cost(instance=instance, plan=pl))


def _task_end(plan: HelperPlan, task: tuple[str, int]) -> int:
    kind, j = task
    return (plan.forward if kind == "forward" else plan.backward)[j][-1]


# --------------------------------------------------------------------------- assembling


def _segments(plans: Iterable[HelperPlan], kind: str) -> tuple[Segment, ...]:
    out: list[Segment] = []
    for plan in plans:
        tasks = plan.forward if kind == "forward" else plan.backward
        for j, slots in tasks.items():
            out.extend(Segment(helper=plan.helper, client=j, start=a, end=b)
                       for a, b in runs(slots))
    return tuple(sorted(out, key=lambda s: (s.helper, s.start, s.client)))


def assemble(*, instance: Instance, method: str, plans: Sequence[HelperPlan],
             switch_slots: Sequence[int] | None = None, seed: int | None = None,
             lower_bound: int | None = None) -> Schedule:
    """The schedule of a plan for every helper that serves at least one client."""
    assignment = [-1] * instance.clients
    completion = [0] * instance.clients
    for plan in plans:
        for j, slots in plan.backward.items():
            assignment[j] = plan.helper
            completion[j] = slots[-1] + 1 + instance.rp[j][plan.helper]
    missing = [j for j, i in enumerate(assignment) if i < 0]
    if missing:
        raise ValueError(f"the plans leave clients {missing} unscheduled")
    makespan = max(completion)
    gap = None
    if lower_bound is not None:
        lower_bound = min(lower_bound, makespan)
        gap = (makespan - lower_bound) / lower_bound if lower_bound > 0 else 0.0
    return Schedule(
        method=method, assignment=tuple(assignment),
        forward=_segments(plans, "forward"), backward=_segments(plans, "backward"),
        completion=tuple(completion), makespan=makespan, instance=instance.name,
        lower_bound=lower_bound, gap=gap,
        switch_slots=None if switch_slots is None or not any(switch_slots)
        else tuple(switch_slots),
        seed=seed)


def plans_for(*, instance: Instance, assignment: Sequence[int],
              switch_slots: Sequence[int], planner: Callable[..., HelperPlan]
              ) -> list[HelperPlan]:
    """One plan per helper for a client -> helper assignment."""
    groups = groups_of(assignment=assignment, helpers=instance.helpers)
    return [planner(instance=instance, helper=i, clients=members, switch_slots=switch_slots[i])
            for i, members in enumerate(groups) if members]


def groups_of(*, assignment: Sequence[int], helpers: int) -> list[list[int]]:
    """The clients of each helper, in client order."""
    groups: list[list[int]] = [[] for _ in range(helpers)]
    for j, i in enumerate(assignment):
        groups[i].append(j)
    return groups
