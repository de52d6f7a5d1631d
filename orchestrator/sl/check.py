"""Feasibility of a split-learning schedule, explained (Tirana et al., INFOCOM 2024, problem P).

The constraints of the paper's problem P, as docs/architecture.md states them, are checked in
this order, and the first one violated is explained in one sentence naming the helper, the
client and the slot:

1. ``assignment``: one helper for each client (y_ij binary, sum_i y_ij = 1);
2. ``helper``: every segment of a client on its assigned helper (x_ijt, z_ijt <= y_ij);
3. ``memory``: the demand of each helper's clients within its capacity (sum_j m_j y_ij <= M_i);
4. ``overlap``: one task per helper per slot (sum_j x_ijt + z_ijt <= 1), earliest slot first;
5. ``release``: forward segments at or after r_ij;
6. ``forward``: forward slots summing to p_ij;
7. ``backward-release``: backward segments at or after forward end + l_ij + l'_ij;
8. ``backward``: backward slots summing to p'_ij;
9. ``completion``: completion_j = backward end + r'_ij;
10. ``makespan``: makespan = max_j completion_j.

With a switching cost (``switch_slots``, the preemption cost extension) a task cut into n
segments occupies p + (n - 1) * switch_slots[helper] slots; adjacent segments count as one.
Within a constraint, clients (or helpers) are taken in index order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.errors import PlanningError
from orchestrator.sl.formats import Instance, Schedule, Segment

CONSTRAINTS = ("assignment", "helper", "memory", "overlap", "release", "forward",
               "backward-release", "backward", "completion", "makespan")


@dataclass(frozen=True)
class Violation:
    """The first constraint a schedule breaks, with where it breaks it."""

    constraint: str
    message: str
    helper: int | None = None
    client: int | None = None
    slot: int | None = None


def first_violation(*, instance: Instance, schedule: Schedule) -> Violation | None:
    """The first violated constraint (in the order of :data:`CONSTRAINTS`), or None."""
    for check in (_assignment, _helpers, _memory, _overlap, _tasks, _completion):
        found = check(instance, schedule)
        if found is not None:
            return found
    return None


def check_schedule(*, instance: Instance, schedule: Schedule) -> None:
    """Raise :class:`PlanningError` with the explanation unless the schedule is feasible."""
    found = first_violation(instance=instance, schedule=schedule)
    if found is not None:
        raise PlanningError(f"infeasible schedule for {instance.name}: {found.message}")


def _assignment(inst: Instance, sch: Schedule) -> Violation | None:
    if len(sch.assignment) != inst.clients:
        return Violation("assignment", f"the assignment names {len(sch.assignment)} helpers "
                         f"but the instance has {inst.clients} clients")
    for j, i in enumerate(sch.assignment):
        if not 0 <= i < inst.helpers:
            return Violation("assignment", f"client {j} is assigned to helper {i}, which does "
                             f"not exist (helpers are 0..{inst.helpers - 1})", client=j)
    if sch.switch_slots is not None and len(sch.switch_slots) != inst.helpers:
        return Violation("assignment", f"switch_slots has {len(sch.switch_slots)} entries but "
                         f"the instance has {inst.helpers} helpers")
    return None


def _helpers(inst: Instance, sch: Schedule) -> Violation | None:
    for kind, segments in (("forward", sch.forward), ("backward", sch.backward)):
        for seg in segments:
            if not 0 <= seg.client < inst.clients:
                return Violation("helper", f"a {kind} segment [{seg.start}, {seg.end}) names "
                                 f"client {seg.client}, which does not exist", slot=seg.start)
            assigned = sch.assignment[seg.client]
            if seg.helper != assigned:
                return Violation("helper", f"the {kind} of client {seg.client} runs on helper "
                                 f"{seg.helper} in slot {seg.start} but the client is assigned "
                                 f"to helper {assigned}", helper=seg.helper, client=seg.client,
                                 slot=seg.start)
    return None


def _memory(inst: Instance, sch: Schedule) -> Violation | None:
    for i in range(inst.helpers):
        clients = [j for j, a in enumerate(sch.assignment) if a == i]
        need = sum(inst.demand[j] for j in clients)
        if need > inst.capacity[i]:
            return Violation("memory", f"helper {i} serves clients {clients} whose memory "
                             f"demand {need:g} {inst.memory_unit} exceeds its capacity "
                             f"{inst.capacity[i]:g} {inst.memory_unit}", helper=i)
    return None


def _overlap(inst: Instance, sch: Schedule) -> Violation | None:
    users: dict[tuple[int, int], list[tuple[str, int]]] = {}
    for kind, segments in (("forward", sch.forward), ("backward", sch.backward)):
        for seg in segments:
            for t in range(seg.start, seg.end):
                users.setdefault((seg.helper, t), []).append((kind, seg.client))
    clashes = sorted(key for key, who in users.items() if len(who) > 1)
    if not clashes:
        return None
    i, t = clashes[0]
    (kind_a, client_a), (kind_b, client_b) = users[(i, t)][:2]
    return Violation("overlap", f"helper {i} runs two tasks in slot {t}: the {kind_a} of "
                     f"client {client_a} and the {kind_b} of client {client_b} (one task per "
                     f"helper per slot)", helper=i, client=client_b, slot=t)


def _merged(segments: Sequence[Segment], client: int) -> list[tuple[int, int]]:
    """The client's segments, sorted, adjacent ones joined."""
    out: list[tuple[int, int]] = []
    for s in sorted((s for s in segments if s.client == client), key=lambda s: s.start):
        if out and out[-1][1] == s.start:
            out[-1] = (out[-1][0], s.end)
        else:
            out.append((s.start, s.end))
    return out


def _total(inst: Instance, sch: Schedule, kind: str,
           pieces: dict[int, list[tuple[int, int]]]) -> Violation | None:
    """Each client's ``kind`` task gets its processing time (plus the reload slots)."""
    name, times = ("p", inst.p) if kind == "forward" else ("pp", inst.pp)
    switch = sch.switch_slots or (0,) * inst.helpers
    for j, runs in pieces.items():
        i = sch.assignment[j]
        got = sum(b - a for a, b in runs)
        resumed = max(len(runs) - 1, 0)
        need = times[j][i] + resumed * switch[i]
        if got != need:
            reload = f" + {resumed} resumptions x {switch[i]} reload slots" \
                if resumed and switch[i] else ""
            return Violation(kind, f"the {kind} of client {j} gets {got} slots on helper {i} "
                             f"but needs {need} ({name}[{j}][{i}] = {times[j][i]}{reload})",
                             helper=i, client=j, slot=runs[-1][1] if runs else None)
    return None


def _tasks(inst: Instance, sch: Schedule) -> Violation | None:
    forward = {j: _merged(sch.forward, j) for j in range(inst.clients)}
    backward = {j: _merged(sch.backward, j) for j in range(inst.clients)}
    for j, runs in forward.items():
        i = sch.assignment[j]
        if runs and runs[0][0] < inst.r[j][i]:
            return Violation("release", f"the forward of client {j} starts on helper {i} in "
                             f"slot {runs[0][0]}, before its release r[{j}][{i}] = "
                             f"{inst.r[j][i]}", helper=i, client=j, slot=runs[0][0])
    found = _total(inst, sch, "forward", forward)
    if found is not None:
        return found
    for j, runs in backward.items():
        i = sch.assignment[j]
        end = forward[j][-1][1]
        ready = end + inst.l[j][i] + inst.lp[j][i]
        if runs and runs[0][0] < ready:
            return Violation("backward-release", f"the backward of client {j} starts on helper "
                             f"{i} in slot {runs[0][0]}, before slot {ready} = forward end "
                             f"{end} + l[{j}][{i}] {inst.l[j][i]} + lp[{j}][{i}] "
                             f"{inst.lp[j][i]}", helper=i, client=j, slot=runs[0][0])
    return _total(inst, sch, "backward", backward)


def _completion(inst: Instance, sch: Schedule) -> Violation | None:
    if len(sch.completion) != inst.clients:
        return Violation("completion", f"the schedule lists {len(sch.completion)} completion "
                         f"times but the instance has {inst.clients} clients")
    for j in range(inst.clients):
        i = sch.assignment[j]
        end = max(s.end for s in sch.backward if s.client == j)
        expected = end + inst.rp[j][i]
        if sch.completion[j] != expected:
            return Violation("completion", f"client {j} completes in slot {expected} (backward "
                             f"end {end} + rp[{j}][{i}] {inst.rp[j][i]}) but the schedule says "
                             f"{sch.completion[j]}", helper=i, client=j, slot=expected)
    expected = max(sch.completion)
    if sch.makespan != expected:
        return Violation("makespan", f"the makespan is {expected} (client "
                         f"{sch.completion.index(expected)} completes last) but the schedule "
                         f"says {sch.makespan}", slot=expected)
    return None
