"""The exact method: the paper's slot-indexed model of problem P, solved by OR-Tools CP-SAT.

Tirana et al., "Workflow Optimization for Parallel Split Learning" (INFOCOM 2024), Section III,
problem P: binary y_ij (client j on helper i), x_ijt / z_ijt (helper i works on j's forward /
backward in slot t), minimise the makespan subject to

- sum_i y_ij = 1 and sum_j m_j y_ij <= M_i                      (assignment, memory)
- sum_t x_ijt = p_ij y_ij,  sum_t z_ijt = p'_ij y_ij             (processing)
- x_ijt = 0 for t < r_ij                                         (release)
- sum_j x_ijt + z_ijt <= 1                                       (one task per slot)
- f_j >= (t + 1) x_ijt;  z_ijt = 1 only if t >= f_j + l_ij + l'_ij (forward before backward)
- makespan >= (t + 1 + r'_ij) z_ijt                              (completion)

The paper gives the solver a horizon T; here T is the makespan of an incumbent schedule (the
caller's heuristic), and slot t exists for (j, i) only where it can still be part of a schedule
no longer than T (forward: r_ij <= t <= T - 1 - (l + l' + p' + r'); backward:
r + p + l + l' <= t <= T - 1 - r'). That removes only worse schedules, so the optimum and the
bound are those of the unrestricted model. Two valid redundant inequalities help the bound:
makespan >= sum_i y_ij (r + p + l + l' + p' + r')_ij for each client, and for each helper,
makespan >= min_j r_ij + sum_j (p + p')_ij y_ij + min_j r'_ij (the helper cannot start before
the first release, and its last busy slot is a backward slot followed by some r').

Preemption cost extension: with s_i reload slots on helper i, a start indicator per slot
marks each segment; a task with n segments takes p + (n - 1) s_i slots.

The incumbent is given to CP-SAT as a hint, so the answer is never worse than it; the result
carries CP-SAT's proven ``lower_bound`` and the ``gap`` (0 when proven optimal).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ortools.sat.python import cp_model

from orchestrator.sl.baselines import integer_memory
from orchestrator.sl.formats import Instance, Schedule
from orchestrator.sl.timeline import HelperPlan, assemble, make_plan

Var = cp_model.IntVar
BUILD_SLOTS_PER_S = 25_000
"""How many slot variables per second this module builds into a CP-SAT model (measured on a
2-core machine, with its constraints)."""


@dataclass(frozen=True)
class ExactResult:
    """The best schedule found, CP-SAT's proven lower bound and whether it is optimal."""

    schedule: Schedule
    lower_bound: int
    optimal: bool


def model_size(*, instance: Instance, horizon: int) -> int:
    """How many slot variables the model has for a horizon (to decide whether to build it)."""
    total = 0
    for j in range(instance.clients):
        for i in range(instance.helpers):
            fwd, bwd = _windows(instance, j, i, horizon)
            total += len(fwd) + len(bwd)
    return total


def _windows(inst: Instance, j: int, i: int, horizon: int) -> tuple[range, range]:
    rest = inst.l[j][i] + inst.lp[j][i] + inst.pp[j][i] + inst.rp[j][i]
    fwd = range(inst.r[j][i], horizon - rest)
    bwd = range(inst.r[j][i] + inst.p[j][i] + inst.l[j][i] + inst.lp[j][i],
                horizon - inst.rp[j][i])
    if len(fwd) < inst.p[j][i] or len(bwd) < inst.pp[j][i]:
        return range(0), range(0)
    return fwd, bwd


def simple_lower_bound(*, instance: Instance) -> int:
    """A bound no schedule beats: the longest of the clients' shortest chains, and the load
    bound. A helper i that serves anyone is busy sum_j (p + p')_ij after its first release
    and its last busy slot is followed by some r', so a_i = min_j r_ij + min_j r'_ij; if k
    helpers serve everyone, k * makespan >= (the k smallest a_i) + sum_j min_i (p + p')_ij."""
    inst = instance
    chain = max(min(inst.chain_slots(j, i) for i in range(inst.helpers))
                for j in range(inst.clients))
    work = sum(min(inst.p[j][i] + inst.pp[j][i] for i in range(inst.helpers))
               for j in range(inst.clients))
    fixed = sorted(min(inst.r[j][i] for j in range(inst.clients))
                   + min(inst.rp[j][i] for j in range(inst.clients)) for i in range(inst.helpers))
    load = min(math.ceil((sum(fixed[:k]) + work) / k) for k in range(1, inst.helpers + 1))
    return max(chain, load)


def _settle(incumbent: Schedule, lower: int, method: str) -> ExactResult:
    lower = min(lower, incumbent.makespan)
    best = replace(incumbent, method=method, lower_bound=lower,
                   gap=(incumbent.makespan - lower) / lower)
    return ExactResult(schedule=best, lower_bound=lower, optimal=lower == best.makespan)


def solve_exact(*, instance: Instance, incumbent: Schedule, time_limit_s: float,
                switch_slots: Sequence[int], workers: int = 2,
                method: str = "exact") -> ExactResult:
    """Minimise the makespan with CP-SAT from ``incumbent`` (hint and horizon).

    The time limit covers building the model: a model that would take more than 40 % of it
    to build (at :data:`BUILD_SLOTS_PER_S`) is not built, and the incumbent comes back with
    the simple lower bound.
    """
    started = time.perf_counter()
    horizon = incumbent.makespan
    floor = simple_lower_bound(instance=instance)
    if floor >= horizon or (model_size(instance=instance, horizon=horizon) / BUILD_SLOTS_PER_S
                            > 0.4 * time_limit_s):
        return _settle(incumbent, floor, method)
    model = cp_model.CpModel()
    inst = instance
    K, H = inst.clients, inst.helpers
    y = [[model.new_bool_var(f"y{j}_{i}") for i in range(H)] for j in range(K)]
    x: dict[tuple[int, int], dict[int, Var]] = {}
    z: dict[tuple[int, int], dict[int, Var]] = {}
    fwd_end = [model.new_int_var(0, horizon, f"f{j}") for j in range(K)]
    makespan = model.new_int_var(floor, horizon, "makespan")
    per_slot: dict[tuple[int, int], list[Var]] = {}
    for j in range(K):
        model.add_exactly_one(y[j])
        for i in range(H):
            fwd, bwd = _windows(inst, j, i, horizon)
            if not fwd:
                model.add(y[j][i] == 0)
                continue
            x[(j, i)] = {t: model.new_bool_var(f"x{i}_{j}_{t}") for t in fwd}
            z[(j, i)] = {t: model.new_bool_var(f"z{i}_{j}_{t}") for t in bwd}
            _task(model, x[(j, i)], y[j][i], inst.p[j][i], switch_slots[i])
            _task(model, z[(j, i)], y[j][i], inst.pp[j][i], switch_slots[i])
            ready = inst.l[j][i] + inst.lp[j][i]
            for t, var in x[(j, i)].items():
                model.add(fwd_end[j] >= t + 1).only_enforce_if(var)
                per_slot.setdefault((i, t), []).append(var)
            for t, var in z[(j, i)].items():
                model.add(fwd_end[j] + ready <= t).only_enforce_if(var)
                model.add(makespan >= t + 1 + inst.rp[j][i]).only_enforce_if(var)
                per_slot.setdefault((i, t), []).append(var)
        model.add(makespan >= sum(inst.chain_slots(j, i) * y[j][i] for i in range(H)))
    for group in per_slot.values():
        if len(group) > 1:
            model.add_at_most_one(group)
    demand, capacity = integer_memory(instance=inst)
    for i in range(H):
        model.add(sum(demand[j] * y[j][i] for j in range(K)) <= capacity[i])
        first = min(inst.r[j][i] for j in range(K))
        last = min(inst.rp[j][i] for j in range(K))
        model.add(makespan >= first + last + sum((inst.p[j][i] + inst.pp[j][i]) * y[j][i]
                                                 for j in range(K)))
    model.minimize(makespan)
    _hint(model, incumbent, y, x, z)
    solver = cp_model.CpSolver()
    # CP-SAT overruns its limit on large models (presolve, copying): keep a fifth in reserve.
    solver.parameters.max_time_in_seconds = max(
        0.8 * (time_limit_s - (time.perf_counter() - started)), 0.05)
    solver.parameters.num_workers = workers
    status = solver.solve(model)
    lower = floor
    if status == cp_model.OPTIMAL:
        lower = int(solver.objective_value)
    elif math.isfinite(solver.best_objective_bound):
        lower = max(lower, math.ceil(solver.best_objective_bound - 1e-6))
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE) or solver.objective_value >= horizon:
        return _settle(incumbent, lower, method)
    plans = _plans(solver, inst, y, x, z)
    best = assemble(instance=inst, method=method, plans=plans, switch_slots=switch_slots)
    return _settle(best, lower, method)


def _task(model: cp_model.CpModel, slots: dict[int, Var], chosen: Var, duration: int,
          switch: int) -> None:
    """sum of the task's slots = duration (+ switch per extra segment) when chosen, else 0."""
    if not switch:
        model.add(sum(slots.values()) == duration * chosen)
        return
    starts = []
    previous: Var | None = None
    for var in slots.values():
        start = model.new_bool_var(f"s{var.name}")
        # start <=> var and not previous (previous slot of the same task idle or absent)
        model.add_implication(start, var)
        if previous is not None:
            model.add_implication(start, previous.negated())
            model.add_bool_or([start, var.negated(), previous])
        else:
            model.add(start == var)
        starts.append(start)
        previous = var
    model.add(sum(slots.values()) == duration * chosen + switch * (sum(starts) - chosen))


def _hint(model: cp_model.CpModel, incumbent: Schedule, y: list[list[Var]],
          x: dict[tuple[int, int], dict[int, Var]], z: dict[tuple[int, int], dict[int, Var]]
          ) -> None:
    busy = {(s.client, s.helper, t, "x") for s in incumbent.forward for t in range(s.start, s.end)}
    busy |= {(s.client, s.helper, t, "z") for s in incumbent.backward
             for t in range(s.start, s.end)}
    for j, row in enumerate(y):
        for i, var in enumerate(row):
            model.add_hint(var, incumbent.assignment[j] == i)
    for kind, table in (("x", x), ("z", z)):
        for (j, i), slots in table.items():
            for t, var in slots.items():
                model.add_hint(var, (j, i, t, kind) in busy)


def _plans(solver: cp_model.CpSolver, inst: Instance, y: list[list[Var]],
           x: dict[tuple[int, int], dict[int, Var]], z: dict[tuple[int, int], dict[int, Var]]
           ) -> list[HelperPlan]:
    forward: dict[int, dict[int, tuple[int, ...]]] = {}
    backward: dict[int, dict[int, tuple[int, ...]]] = {}
    for j in range(inst.clients):
        i = next(i for i in range(inst.helpers) if solver.boolean_value(y[j][i]))
        forward.setdefault(i, {})[j] = tuple(t for t, v in x[(j, i)].items()
                                             if solver.boolean_value(v))
        backward.setdefault(i, {})[j] = tuple(t for t, v in z[(j, i)].items()
                                              if solver.boolean_value(v))
    return [make_plan(helper=i, forward=forward[i], backward=backward[i]) for i in sorted(forward)]
