"""Every method gives feasible schedules on every shared instance; the methods' own claims."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import replace

import pytest

from orchestrator.errors import PlanningError
from orchestrator.sl.admm import assignment_subproblem, correct, schedule_subproblem, solve_admm
from orchestrator.sl.baselines import balanced_assignment, random_assignment
from orchestrator.sl.check import first_violation
from orchestrator.sl.exact import simple_lower_bound
from orchestrator.sl.formats import Instance, parse_instance
from orchestrator.sl.solve import METHODS, solve

QUICK_S = 0.4


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_every_method_is_feasible_on_every_shared_instance(shared: tuple[Instance, ...],
                                                           method: str) -> None:
    for inst in shared:
        schedule = solve(instance=inst, method=method, time_limit_s=QUICK_S)
        assert first_violation(instance=inst, schedule=schedule) is None, inst.name
        assert schedule.method == method and schedule.instance == inst.name
        assert schedule.makespan >= simple_lower_bound(instance=inst)
        if schedule.lower_bound is not None:
            assert schedule.lower_bound <= schedule.makespan


def test_auto_never_loses_to_the_paper_heuristics(shared: tuple[Instance, ...]) -> None:
    for inst in shared[::6]:
        auto = solve(instance=inst, method="auto", time_limit_s=QUICK_S).makespan
        assert auto <= solve(instance=inst, method="balanced-greedy").makespan, inst.name
        assert auto <= solve(instance=inst, method="random-fcfs").makespan, inst.name


def _helper_optimum(inst: Instance, helper: int, clients: tuple[int, ...]) -> float:
    """Brute force over every slot-by-slot schedule of one helper (forward and backward)."""
    i = helper
    horizon = sum(inst.chain_slots(j, i) for j in clients) + 1

    @functools.cache
    def best(t: int, state: tuple[tuple[int, int, int], ...]) -> float:
        # per client: (forward slots left, forward end or -1, backward slots left)
        if all(f == 0 and b == 0 for f, _, b in state):
            return 0
        if t >= horizon:
            return math.inf
        options = [best(t + 1, state)]
        for k, (f, end, b) in enumerate(state):
            j = clients[k]
            if f and inst.r[j][i] <= t:
                nxt = (f - 1, t + 1 if f == 1 else -1, b)
                options.append(best(t + 1, (*state[:k], nxt, *state[k + 1:])))
            elif not f and b and end + inst.l[j][i] + inst.lp[j][i] <= t:
                done = t + 1 + inst.rp[j][i] if b == 1 else -math.inf
                rest = best(t + 1, (*state[:k], (0, end, b - 1), *state[k + 1:]))
                options.append(max(done, rest))
        return min(options)

    return best(0, tuple((inst.p[j][i], -1, inst.pp[j][i]) for j in clients))


def _brute_force_makespan(inst: Instance) -> float:
    best = math.inf
    for assignment in itertools.product(range(inst.helpers), repeat=inst.clients):
        groups = [tuple(j for j, a in enumerate(assignment) if a == i) for i in range(inst.helpers)]
        if any(sum(inst.demand[j] for j in g) > inst.capacity[i] for i, g in enumerate(groups)):
            continue
        best = min(best, max(_helper_optimum(inst, i, g) for i, g in enumerate(groups) if g))
    return best


SMALL = [
    {"r": [[0, 1], [1, 0], [0, 0]], "p": [[2, 3], [2, 2], [1, 2]], "l": [[1, 1], [1, 2], [0, 1]],
     "lp": [[1, 1], [1, 1], [2, 0]], "pp": [[2, 2], [1, 1], [2, 1]],
     "rp": [[1, 1], [2, 2], [0, 1]], "demand": [1, 1, 1], "capacity": [2, 2]},
    {"r": [[0, 0], [0, 2], [1, 0]], "p": [[3, 1], [1, 3], [2, 2]], "l": [[0, 0], [1, 0], [0, 1]],
     "lp": [[1, 3], [0, 0], [1, 1]], "pp": [[1, 2], [2, 1], [1, 1]],
     "rp": [[2, 0], [0, 1], [1, 1]], "demand": [2, 1, 1], "capacity": [3, 2]},
]


@pytest.mark.parametrize("matrices", SMALL)
def test_exact_and_auto_find_the_brute_force_optimum(matrices: dict[str, object]) -> None:
    inst = parse_instance({"name": "small", "slot_ms": 1, "clients": 3, "helpers": 2,
                           "memory_unit": "MB", **matrices})
    optimum = _brute_force_makespan(inst)
    exact = solve(instance=inst, method="exact", time_limit_s=10)
    assert exact.makespan == optimum and exact.lower_bound == optimum and exact.gap == 0.0
    assert solve(instance=inst, method="auto", time_limit_s=10).makespan == optimum


def test_exact_proves_a_bound_and_never_loses_to_its_incumbent(
        shared: tuple[Instance, ...]) -> None:
    inst = shared[2]  # 10 clients, 2 helpers
    exact = solve(instance=inst, method="exact", time_limit_s=10)
    assert exact.gap == 0.0 and exact.lower_bound == exact.makespan
    assert exact.makespan <= solve(instance=inst, method="balanced-greedy").makespan


def test_switching_cost_is_honoured_by_every_method(shared: tuple[Instance, ...]) -> None:
    inst = shared[8]  # 20 clients, 5 helpers
    bound = solve(instance=inst, method="exact", time_limit_s=3).lower_bound
    assert bound is not None
    for method in METHODS:
        schedule = solve(instance=inst, method=method, time_limit_s=1, switch_slots=2)
        assert schedule.switch_slots == (2,) * inst.helpers
        assert first_violation(instance=inst, schedule=schedule) is None
        # the same segments are infeasible if the reload slots are not paid, or feasible
        # because nothing was preempted
        unpaid = first_violation(instance=inst, schedule=replace(schedule, switch_slots=None))
        cut = len(schedule.forward) + len(schedule.backward) > 2 * inst.clients
        assert (unpaid is not None) == cut
        assert schedule.makespan >= bound  # reloads can only lengthen the optimum


def test_exact_with_switching_cost_on_a_tiny_instance(tiny: Instance) -> None:
    free = solve(instance=tiny, method="exact", time_limit_s=5)
    costly = solve(instance=tiny, method="exact", time_limit_s=5, switch_slots=[3, 3])
    assert costly.gap == 0.0 and costly.makespan >= free.makespan


def test_admm_subproblems_follow_the_penalty(shared: tuple[Instance, ...]) -> None:
    inst = shared[4]  # 10 clients, 3 helpers
    y = tuple(balanced_assignment(instance=inst))
    zero = [[0] * inst.helpers for _ in range(inst.clients)]
    # With a heavy penalty the schedule subproblem keeps every forward where y puts it ...
    x, ends = schedule_subproblem(instance=inst, y=y, mu=zero, rho=1000, hint=y,
                                  time_limit_s=5, workers=1)
    assert x == y and all(e >= inst.r[j][x[j]] + inst.p[j][x[j]] for j, e in enumerate(ends))
    # ... and a dual mu = p on another helper pulls a client there.
    mu = [row[:] for row in zero]
    target = (y[0] + 1) % inst.helpers
    mu[0][target] = -inst.p[0][target]
    mu[0][y[0]] = inst.p[0][y[0]]
    x, ends = schedule_subproblem(instance=inst, y=y, mu=mu, rho=1000, hint=y,
                                  time_limit_s=5, workers=1)
    assert x[0] == target
    new_y = assignment_subproblem(instance=inst, x_helper=x, forward_end=ends, mu=zero,
                                  rho=1000, hint=y, time_limit_s=5, workers=1)
    assert new_y == x


def test_admm_stops_at_a_stationary_point_and_corrects(shared: tuple[Instance, ...]) -> None:
    inst = shared[8]
    start = random_assignment(instance=inst, seed=1)
    result = solve_admm(instance=inst, time_limit_s=5, switch_slots=[0] * inst.helpers,
                        start=start)
    assert result.makespan <= correct(instance=inst, y=start,
                                      switch_slots=[0] * inst.helpers).makespan
    assert first_violation(instance=inst, schedule=result) is None
    with pytest.raises(ValueError, match="rho must be a positive integer, got 0"):
        solve_admm(instance=inst, time_limit_s=1, switch_slots=[0] * inst.helpers,
                   start=start, rho=0)


def test_memory_is_respected_when_it_binds(tiny: Instance) -> None:
    tight = replace(tiny, capacity=(1.0, 1.0))
    for method in METHODS:
        schedule = solve(instance=tight, method=method, time_limit_s=2)
        assert sorted(schedule.assignment) == [0, 1], method


def test_no_assignment_fits_memory(tiny: Instance) -> None:
    with pytest.raises(PlanningError, match="no assignment of the clients fits"):
        solve(instance=replace(tiny, capacity=(0.5, 0.5)), method="balanced-greedy")


@pytest.mark.slow
def test_auto_is_within_5_percent_of_proven_optima(shared: tuple[Instance, ...]) -> None:
    small = [inst for inst in shared if inst.clients * inst.helpers <= 30]
    proven = 0
    for inst in small:
        exact = solve(instance=inst, method="exact", time_limit_s=10)
        if exact.gap != 0.0:
            continue
        proven += 1
        auto = solve(instance=inst, method="auto", time_limit_s=1)
        assert auto.makespan <= 1.05 * exact.makespan, inst.name
    assert proven >= len(small) - 2
