"""The paper's baselines: balanced-greedy and random assignment, both with FCFS scheduling.

Tirana et al., "Workflow Optimization for Parallel Split Learning" (INFOCOM 2024), Section IV-C
and Section V, as in the authors' code (``util_files/heuristic_FCFS.py``,
``random_benchmark.py``, ``utils.fifo``):

- ``balanced-greedy``: clients in index order, each to the helper with room in memory that
  keeps the numbers of clients per helper most even (the least loaded; ties: lowest index);
- ``random-fcfs``: clients in a random order, each to a random helper with room in memory;
- FCFS on each helper: tasks are served whole (no preemption) in order of arrival, a forward
  task arriving at r_ij and its backward task at forward end + l_ij + l'_ij (ties: forward
  first, then client index).

Where the authors' greedy meets a client no helper has room for it stops; here that is a
:class:`PlanningError` unless :func:`memory_fit` finds any assignment that fits (first-fit
decreasing, then CP-SAT), which then replaces the greedy one.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence

from ortools.sat.python import cp_model

from orchestrator.errors import PlanningError
from orchestrator.sl.formats import Instance, Schedule
from orchestrator.sl.timeline import HelperPlan, assemble, groups_of, make_plan


def fcfs_plan(*, instance: Instance, helper: int, clients: Sequence[int]) -> HelperPlan:
    """First come, first served on one helper, tasks whole."""
    i = helper
    queue = [(instance.r[j][i], 0, j) for j in clients]
    heapq.heapify(queue)
    forward: dict[int, tuple[int, ...]] = {}
    backward: dict[int, tuple[int, ...]] = {}
    t = 0
    while queue:
        arrival, kind, j = heapq.heappop(queue)
        start = max(t, arrival)
        if kind == 0:
            t = start + instance.p[j][i]
            forward[j] = tuple(range(start, t))
            heapq.heappush(queue, (t + instance.l[j][i] + instance.lp[j][i], 1, j))
        else:
            t = start + instance.pp[j][i]
            backward[j] = tuple(range(start, t))
    return make_plan(helper=i, forward=forward, backward=backward)


def fcfs_schedule(*, instance: Instance, assignment: Sequence[int], method: str,
                  seed: int | None = None) -> Schedule:
    groups = groups_of(assignment=assignment, helpers=instance.helpers)
    plans = [fcfs_plan(instance=instance, helper=i, clients=members)
             for i, members in enumerate(groups) if members]
    return assemble(instance=instance, method=method, plans=plans, seed=seed)


def _greedy(instance: Instance, order: Sequence[int],
            choose: Callable[[list[int], list[int]], int]) -> list[int] | None:
    """Assign clients in ``order``; ``choose(fitting helpers, counts)`` picks one."""
    load = [0.0] * instance.helpers
    count = [0] * instance.helpers
    assignment = [-1] * instance.clients
    for j in order:
        fit = [i for i in range(instance.helpers)
               if load[i] + instance.demand[j] <= instance.capacity[i]]
        if not fit:
            return None
        i = choose(fit, count)
        assignment[j] = i
        load[i] += instance.demand[j]
        count[i] += 1
    return assignment


def balanced_assignment(*, instance: Instance) -> list[int]:
    """The balanced-greedy assignment (see the module docstring)."""
    found = _greedy(instance, range(instance.clients), lambda fit, count: min(
        fit, key=lambda i: (count[i], i)))
    return found if found is not None else memory_fit(instance=instance)


def random_assignment(*, instance: Instance, seed: int) -> list[int]:
    """Clients in a random order, each to a random helper with room (seeded)."""
    rng = random.Random(seed)
    order = list(range(instance.clients))
    rng.shuffle(order)
    found = _greedy(instance, order, lambda fit, count: rng.choice(fit))
    return found if found is not None else memory_fit(instance=instance)


def balanced_greedy(*, instance: Instance) -> Schedule:
    return fcfs_schedule(instance=instance, assignment=balanced_assignment(instance=instance),
                         method="balanced-greedy")


def random_fcfs(*, instance: Instance, seed: int = 0) -> Schedule:
    return fcfs_schedule(instance=instance,
                         assignment=random_assignment(instance=instance, seed=seed),
                         method="random-fcfs", seed=seed)


def memory_fit(*, instance: Instance, time_limit_s: float = 10.0) -> list[int]:
    """Any assignment within the helpers' memory: first-fit decreasing, else CP-SAT."""
    order = sorted(range(instance.clients), key=lambda j: (-instance.demand[j], j))
    found = _greedy(instance, order, lambda fit, count: fit[0])
    if found is not None:
        return found
    model = cp_model.CpModel()
    y = [[model.new_bool_var(f"y{j}_{i}") for i in range(instance.helpers)]
         for j in range(instance.clients)]
    for j in range(instance.clients):
        model.add_exactly_one(y[j])
    demand, capacity = integer_memory(instance=instance)
    for i in range(instance.helpers):
        model.add(sum(demand[j] * y[j][i] for j in range(instance.clients)) <= capacity[i])
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        verdict = "no" if status == cp_model.INFEASIBLE else "no (found within the time limit)"
        raise PlanningError(f"{instance.name}: {verdict} assignment of the clients fits the "
                            f"helpers' memory (demand {sum(instance.demand):g} "
                            f"{instance.memory_unit}, capacity {sum(instance.capacity):g})")
    return [next(i for i in range(instance.helpers) if solver.value(y[j][i]))
            for j in range(instance.clients)]


def integer_memory(*, instance: Instance) -> tuple[list[int], list[int]]:
    """Demands and capacities as integers for a solver: scaled by the smallest power of ten
    (up to 10^6) that makes them integral, demands rounded up and capacities down, so an
    assignment that fits the integers fits the real numbers."""
    values = (*instance.demand, *instance.capacity)
    scale = next((s for s in (1, 10, 100, 1000, 10_000, 100_000)
                  if all(float(v * s).is_integer() for v in values)), 1_000_000)
    return ([math.ceil(d * scale) for d in instance.demand],
            [math.floor(c * scale) for c in instance.capacity])
