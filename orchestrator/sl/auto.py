"""``auto``: the method of choice for a split-learning instance (beyond Tirana et al. 2024).

The paper's strategy (INFOCOM 2024, Section V) is to run the ADMM-based method on small and
medium systems and balanced-greedy on large ones. ``auto`` does better at every size:

1. Inner scheduler: for a set of clients on one helper, the cheapest of four preemptive list
   schedules (forward-first or backward-first, forward priority by the full remaining chain
   l + l' + p' + r' or by the paper's l; the backward schedule of a forward-first plan is the
   optimal one of Algorithm 2 given the forward slots) and FCFS, which wins on heavily loaded
   helpers because it returns gradients while forward tasks still arrive.
2. Start: the better of balanced-greedy's assignment and a best-insertion greedy (clients by
   decreasing shortest chain, each to the helper whose plan it lengthens least).
3. Local search over assignments: move a client off a critical helper (one whose last client
   completes at the makespan), or swap it with a client of another helper, whenever both
   helpers then finish before the makespan; first improvement, then seeded random kicks
   (iterated local search) until the simple lower bound is met, the best stalls (a quarter
   of the search budget without improvement) or the budget ends.
4. Exact polish, chosen by instance size: where the slot-indexed model for balanced-greedy's
   makespan has at most :data:`EXACT_MAX_SLOTS` slot variables (up to about 50 clients on
   5 helpers here), the local search gets :data:`SEARCH_SHARE` of the time limit and CP-SAT
   the rest, warm-started with the local optimum as a hint and its makespan as the horizon,
   proving a lower bound; larger instances get the local search alone (90 % of the limit).

The result carries the best lower bound known (CP-SAT's where it ran, else the chain and load
bound of :func:`~orchestrator.sl.exact.simple_lower_bound`) and the gap to it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from orchestrator.sl.baselines import (
    balanced_assignment,
    balanced_greedy,
    fcfs_plan,
    memory_fit,
)
from orchestrator.sl.exact import model_size, simple_lower_bound, solve_exact
from orchestrator.sl.formats import Instance, Schedule
from orchestrator.sl.timeline import (
    HelperPlan,
    assemble,
    candidate_plans,
    cheapest,
    groups_of,
    make_plan,
    plan_cost,
)

EXACT_MAX_SLOTS = 60_000
"""The largest slot-indexed model (x and z variables) ``auto`` hands to CP-SAT."""
KICK_CLIENTS = 3
"""How many clients a random kick moves."""
STALL_SHARE = 0.25
"""The kicks stop when the best has not improved for this share of the search's time budget
(at least :data:`STALL_MIN_S`): on the shared instances the best is found within a second."""
STALL_MIN_S = 1.0
SEARCH_SHARE = 0.3
"""The share of the time limit the local search gets when CP-SAT polishes after it."""


def best_plan(*, instance: Instance, helper: int, clients: Sequence[int],
              switch_slots: int = 0) -> HelperPlan:
    """The cheapest plan of the inner scheduler (module docstring, step 1)."""
    plans = candidate_plans(instance=instance, helper=helper, clients=clients,
                            switch_slots=switch_slots)
    plans.append(fcfs_plan(instance=instance, helper=helper, clients=clients))
    return cheapest(instance=instance, plans=plans)


@dataclass
class _Search:
    """Memoised helper costs for one instance; the local search's only mutable state."""

    instance: Instance
    switch_slots: Sequence[int]
    cache: dict[tuple[int, frozenset[int]], tuple[int, HelperPlan]] = field(default_factory=dict)

    def cost(self, helper: int, clients: frozenset[int]) -> int:
        return self.plan(helper, clients)[0]

    def plan(self, helper: int, clients: frozenset[int]) -> tuple[int, HelperPlan]:
        key = (helper, clients)
        found = self.cache.get(key)
        if found is None:
            if clients:
                plan = best_plan(instance=self.instance, helper=helper, clients=sorted(clients),
                                 switch_slots=self.switch_slots[helper])
                found = (plan_cost(instance=self.instance, plan=plan), plan)
            else:
                found = (0, make_plan(helper=helper, forward={}, backward={}))
            self.cache[key] = found
        return found

    def makespan(self, groups: Sequence[frozenset[int]]) -> int:
        return max(self.cost(i, g) for i, g in enumerate(groups))


def _fits(instance: Instance, group: frozenset[int], helper: int) -> bool:
    return sum(instance.demand[j] for j in group) <= instance.capacity[helper]


def _insertion_assignment(*, search: _Search) -> list[int] | None:
    """Clients by decreasing shortest chain, each to the helper it delays least."""
    inst = search.instance
    order = sorted(range(inst.clients),
                   key=lambda j: (-min(inst.chain_slots(j, i) for i in range(inst.helpers)), j))
    groups = [frozenset[int]() for _ in range(inst.helpers)]
    for j in order:
        options = [(search.cost(i, groups[i] | {j}), len(groups[i]), i)
                   for i in range(inst.helpers) if _fits(inst, groups[i] | {j}, i)]
        if not options:
            return None
        _, _, i = min(options)
        groups[i] = groups[i] | {j}
    assignment = [0] * inst.clients
    for i, g in enumerate(groups):
        for j in g:
            assignment[j] = i
    return assignment


def _improve(search: _Search, groups: list[frozenset[int]], deadline: float) -> None:
    """First-improvement descent on the critical helpers, in place."""
    inst = search.instance
    while time.perf_counter() < deadline:
        costs = [search.cost(i, g) for i, g in enumerate(groups)]
        top = max(costs)
        if not _improve_once(search, groups, costs, top, deadline) or inst.helpers == 1:
            return


def _improve_once(search: _Search, groups: list[frozenset[int]], costs: list[int], top: int,
                  deadline: float) -> bool:
    inst = search.instance
    for c in (i for i, cost in enumerate(costs) if cost == top):
        for j in sorted(groups[c]):
            rest = groups[c] - {j}
            if search.cost(c, rest) >= top:
                continue
            for h in sorted(range(inst.helpers), key=lambda h: costs[h]):
                if h == c:
                    continue
                grown = groups[h] | {j}
                if _fits(inst, grown, h) and search.cost(h, grown) < top:
                    groups[c], groups[h] = rest, grown
                    return True
        for j in sorted(groups[c]):
            for h in sorted(range(inst.helpers), key=lambda h: costs[h]):
                if h == c or costs[h] >= top:
                    continue
                for k in sorted(groups[h]):
                    if time.perf_counter() >= deadline:
                        return False
                    a, b = groups[c] - {j} | {k}, groups[h] - {k} | {j}
                    if (_fits(inst, a, c) and _fits(inst, b, h) and search.cost(c, a) < top
                            and search.cost(h, b) < top):
                        groups[c], groups[h] = a, b
                        return True
    return False


def _kick(instance: Instance, groups: list[frozenset[int]], rng: random.Random) -> None:
    for _ in range(KICK_CLIENTS):
        j = rng.randrange(instance.clients)
        src = next(i for i, g in enumerate(groups) if j in g)
        dst = rng.randrange(instance.helpers)
        if dst != src and _fits(instance, groups[dst] | {j}, dst):
            groups[src], groups[dst] = groups[src] - {j}, groups[dst] | {j}


def local_search(*, instance: Instance, switch_slots: Sequence[int], seed: int,
                 deadline: float, lower_bound: int) -> Schedule:
    """Steps 1-3 of the module docstring; returns the best schedule found by ``deadline``,
    or earlier when it meets ``lower_bound`` or stalls (:data:`STALL_SHARE`)."""
    stall_s = max(STALL_MIN_S, STALL_SHARE * (deadline - time.perf_counter()))
    search = _Search(instance=instance, switch_slots=switch_slots)
    starts = [balanced_assignment(instance=instance)]
    inserted = _insertion_assignment(search=search)
    starts.append(inserted if inserted is not None else memory_fit(instance=instance))
    best: list[frozenset[int]] = []
    for assignment in starts:
        groups = [frozenset(g) for g in groups_of(assignment=assignment,
                                                  helpers=instance.helpers)]
        _improve(search, groups, deadline)
        if not best or search.makespan(groups) < search.makespan(best):
            best = groups
    rng = random.Random(seed)
    current = list(best)
    improved = time.perf_counter()
    while (time.perf_counter() < min(deadline, improved + stall_s)
           and search.makespan(best) > lower_bound and instance.helpers > 1):
        trial = list(current)
        _kick(instance, trial, rng)
        _improve(search, trial, deadline)
        if search.makespan(trial) <= search.makespan(current):
            current = trial
        if search.makespan(trial) < search.makespan(best):
            best = list(trial)
            improved = time.perf_counter()
    plans = [search.plan(i, g)[1] for i, g in enumerate(best) if g]
    return assemble(instance=instance, method="auto", plans=plans, switch_slots=switch_slots,
                    seed=seed, lower_bound=lower_bound)


def solve_auto(*, instance: Instance, time_limit_s: float, switch_slots: Sequence[int],
               seed: int = 0, workers: int = 2) -> Schedule:
    """Local search, then CP-SAT where the model is small enough (module docstring)."""
    started = time.perf_counter()
    lower = simple_lower_bound(instance=instance)
    # Balanced-greedy's makespan bounds the local search's, hence the model's horizon.
    horizon = balanced_greedy(instance=instance).makespan
    polish = model_size(instance=instance, horizon=horizon) <= EXACT_MAX_SLOTS
    search_share = SEARCH_SHARE if polish else 0.9
    found = local_search(instance=instance, switch_slots=switch_slots, seed=seed,
                         deadline=started + search_share * time_limit_s, lower_bound=lower)
    remaining = started + 0.9 * time_limit_s - time.perf_counter()
    if not polish or found.makespan <= lower or remaining < 0.1:
        return found
    result = solve_exact(instance=instance, incumbent=found, time_limit_s=remaining,
                         switch_slots=switch_slots, workers=workers, method="auto")
    return replace(result.schedule, seed=seed)
