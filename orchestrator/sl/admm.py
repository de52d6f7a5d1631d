"""``admm``: the ADMM-based method of Tirana et al., "Workflow Optimization for Parallel Split
Learning" (INFOCOM 2024), Section IV: Algorithm 1 on the forward problem P_f, then the backward
problem P_b per helper by Algorithm 2.

P_f assigns clients (y) and schedules their forward tasks (x) to minimise
w = max_j (f_j + sum_i l_ij y_ij), f_j the forward end. Algorithm 1 relaxes the coupling
constraint sum_t x_ijt = p_ij y_ij with a scaled dual mu_ij and the penalty
(rho / 2) |sum_t x_ijt - p_ij y_ij + mu_ij| (the absolute value, as in the authors' code,
``util_files/ADMM_solution.py``) and alternates:

1. schedule subproblem: x^{k+1} = argmin_x  w(x; y^k) + penalty(x, y^k, mu^k), every client's
   forward processed once, one task per helper per slot, no task before its release;
2. assignment subproblem: y^{k+1} = argmin_y  max_j (f_j^{k+1} + sum_i l_ij y_ij)
   + penalty(x^{k+1}, y, mu^k), one helper per client, memory within capacity;
3. dual update: mu^{k+1} = mu^k + (sum_t x^{k+1}_ijt - p_ij y^{k+1}_ij);
4. stationarity: stop when the primal residual sum_t x - p y and the change of y are both zero
   (then x, y and mu no longer move), or after ``max_iter`` iterations (10 as in the code);
5. feasibility correction: y is kept (it satisfies the assignment and memory constraints); on
   each helper the forward tasks are rescheduled optimally for P_f (1 | r_j, pmtn | max C_j +
   l_ij, Algorithm 2) and the backward tasks by Algorithm 2 on the slots left (problem P_b).

Choices where the paper leaves room, or where its code does not scale:

- Both subproblems are solved with CP-SAT under a time budget (the paper used Gurobi on the
  slot-indexed model). The schedule subproblem is modelled with one optional interval per
  (client, helper) and no overlap per helper, i.e. each forward task whole on one helper. That
  restricts x (the slot model may split a task in time and even over helpers) but keeps the
  model at K x H intervals instead of K x H x T booleans, which is what lets 100 x 25 run. If a
  subproblem finds nothing in its budget the previous iterate is kept (x^0 = y^0).
- y^0 (and the first hint for x) is balanced-greedy's assignment, mu^0 = 0. The authors' code
  starts from y = 0, which assigns nobody: the first schedule subproblem then puts every
  client on its fastest-forward helper whatever the backward load (on the shared 100 x 5
  instance, all 100 clients on one helper, makespan 609 against 251 for balanced-greedy).
- rho defaults to 2 (one slot of makespan per slot of mismatch; the objectives are doubled to
  stay integral). The code's rho = 350 makes both subproblems copy the previous iterate.
- The feasibility-corrected schedule is computed at every iteration and the best one is
  returned (the code computes it only at the end).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

from ortools.sat.python import cp_model

from orchestrator.sl.baselines import integer_memory
from orchestrator.sl.formats import Instance, Schedule
from orchestrator.sl.machine import algorithm2
from orchestrator.sl.timeline import assemble, plan_helper, plans_for

MAX_ITER = 10
RHO = 2


def _penalty(*, p: int, x_on: bool, y_on: bool, mu: int) -> int:
    """|sum_t x_ijt - p_ij y_ij + mu_ij| for one (client, helper)."""
    return abs(p * int(x_on) - p * int(y_on) + mu)


def _solver(time_limit_s: float, workers: int) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit_s, 0.01)
    solver.parameters.num_workers = workers
    return solver


def schedule_subproblem(*, instance: Instance, y: Sequence[int], mu: Sequence[Sequence[int]],
                        rho: int, hint: Sequence[int], time_limit_s: float, workers: int
                        ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Step 1: the helper of each client's forward task and its forward end."""
    inst = instance
    K, H = inst.clients, inst.helpers
    horizon = max(max(row) for row in inst.r) + sum(max(row) for row in inst.p)
    model = cp_model.CpModel()
    on = [[model.new_bool_var(f"a{j}_{i}") for i in range(H)] for j in range(K)]
    ends: list[list[cp_model.IntVar]] = []
    per_helper: list[list[cp_model.IntervalVar]] = [[] for _ in range(H)]
    penalty = []
    w = model.new_int_var(0, 2 * horizon, "w")
    for j in range(K):
        model.add_exactly_one(on[j])
        f = model.new_int_var(0, horizon, f"f{j}")
        row = []
        for i in range(H):
            start = model.new_int_var(inst.r[j][i], horizon, f"s{j}_{i}")
            end = model.new_int_var(inst.r[j][i] + inst.p[j][i], horizon + inst.p[j][i],
                                    f"e{j}_{i}")
            per_helper[i].append(model.new_optional_interval_var(
                start, inst.p[j][i], end, on[j][i], f"iv{j}_{i}"))
            model.add(f >= end).only_enforce_if(on[j][i])
            row.append(end)
            cost = [rho * _penalty(p=inst.p[j][i], x_on=v, y_on=y[j] == i, mu=mu[j][i])
                    for v in (False, True)]
            penalty.append(cost[0] + (cost[1] - cost[0]) * on[j][i])
        ends.append(row)
        model.add(w >= f + (inst.l[j][y[j]] if y[j] >= 0 else 0))
    for intervals in per_helper:
        model.add_no_overlap(intervals)
    model.minimize(2 * w + sum(penalty))
    for j in range(K):
        for i in range(H):
            model.add_hint(on[j][i], hint[j] == i)
    solver = _solver(time_limit_s, workers)
    if solver.solve(model) in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        chosen = tuple(next(i for i in range(H) if solver.boolean_value(on[j][i]))
                       for j in range(K))
        return chosen, tuple(int(solver.value(ends[j][chosen[j]])) for j in range(K))
    return tuple(hint), _release_order_ends(inst, hint)


def _release_order_ends(inst: Instance, helper_of: Sequence[int]) -> tuple[int, ...]:
    """Forward ends when each helper serves its forward tasks whole in release order."""
    ends = [0] * inst.clients
    free = [0] * inst.helpers
    for j in sorted(range(inst.clients), key=lambda j: (inst.r[j][helper_of[j]], j)):
        i = helper_of[j]
        free[i] = max(free[i], inst.r[j][i]) + inst.p[j][i]
        ends[j] = free[i]
    return tuple(ends)


def assignment_subproblem(*, instance: Instance, x_helper: Sequence[int],
                          forward_end: Sequence[int], mu: Sequence[Sequence[int]], rho: int,
                          hint: Sequence[int], time_limit_s: float, workers: int
                          ) -> tuple[int, ...]:
    """Step 2: the assignment y, within memory."""
    inst = instance
    K, H = inst.clients, inst.helpers
    model = cp_model.CpModel()
    y = [[model.new_bool_var(f"y{j}_{i}") for i in range(H)] for j in range(K)]
    top = max(forward_end) + max(max(row) for row in inst.l)
    w = model.new_int_var(0, top, "w")
    penalty = []
    demand, capacity = integer_memory(instance=inst)
    for j in range(K):
        model.add_exactly_one(y[j])
        model.add(w >= forward_end[j] + sum(inst.l[j][i] * y[j][i] for i in range(H)))
        for i in range(H):
            cost = [rho * _penalty(p=inst.p[j][i], x_on=x_helper[j] == i, y_on=v, mu=mu[j][i])
                    for v in (False, True)]
            penalty.append(cost[0] + (cost[1] - cost[0]) * y[j][i])
            model.add_hint(y[j][i], hint[j] == i)
    for i in range(H):
        model.add(sum(demand[j] * y[j][i] for j in range(K)) <= capacity[i])
    model.minimize(2 * w + sum(penalty))
    solver = _solver(time_limit_s, workers)
    if solver.solve(model) in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return tuple(next(i for i in range(H) if solver.boolean_value(y[j][i]))
                     for j in range(K))
    return tuple(hint)


def correct(*, instance: Instance, y: Sequence[int], switch_slots: Sequence[int]) -> Schedule:
    """Step 5: keep y; forward by Algorithm 2 for P_f's cost, backward by Algorithm 2."""
    planner = functools.partial(plan_helper, tail="transfer", forward_scheduler=algorithm2,
                                backward_scheduler=algorithm2)
    plans = plans_for(instance=instance, assignment=y, switch_slots=switch_slots,
                      planner=planner)
    return assemble(instance=instance, method="admm", plans=plans, switch_slots=switch_slots)


def solve_admm(*, instance: Instance, time_limit_s: float, switch_slots: Sequence[int],
               start: Sequence[int], rho: int = RHO, max_iter: int = MAX_ITER,
               workers: int = 1) -> Schedule:
    """Algorithm 1 with the feasibility correction from ``start``, a memory-feasible
    assignment (y^0); the best corrected schedule of the iterates (y^0 included)."""
    if rho < 1:
        raise ValueError(f"rho must be a positive integer, got {rho}")
    inst = instance
    K, H = inst.clients, inst.helpers
    deadline = time.perf_counter() + time_limit_s
    step_s = time_limit_s / max_iter
    mu = [[0] * H for _ in range(K)]
    y = x_helper = y_hint = tuple(start)
    best = correct(instance=inst, y=y, switch_slots=switch_slots)
    for _ in range(max_iter):
        budget = max(min(step_s, deadline - time.perf_counter()), 0.01)
        x_helper, forward_end = schedule_subproblem(
            instance=inst, y=y, mu=mu, rho=rho, hint=x_helper, time_limit_s=0.7 * budget,
            workers=workers)
        new_y = assignment_subproblem(
            instance=inst, x_helper=x_helper, forward_end=forward_end, mu=mu, rho=rho,
            hint=y_hint, time_limit_s=0.3 * budget, workers=workers)
        residual = 0
        for j in range(K):
            for i in range(H):
                r = inst.p[j][i] * (int(x_helper[j] == i) - int(new_y[j] == i))
                mu[j][i] += r
                residual += abs(r)
        candidate = correct(instance=inst, y=new_y, switch_slots=switch_slots)
        if candidate.makespan < best.makespan:
            best = candidate
        stationary = residual == 0 and new_y == y
        y = y_hint = new_y
        if stationary or time.perf_counter() >= deadline:
            break
    return best
