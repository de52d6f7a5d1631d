"""One entry point for every split-learning method (Tirana et al., INFOCOM 2024).

``solve(instance=..., method=...)`` runs a method of :data:`METHODS`, times it (``solver_s``,
wall-clock seconds of the whole call) and checks the result with the feasibility checker, so a
schedule that leaves here is feasible for its instance.

- ``exact``: the slot-indexed model with CP-SAT (:mod:`orchestrator.sl.exact`), horizon and
  hint from the local search of ``auto`` run for a fifth of the time limit;
- ``admm``: Algorithm 1 + Algorithm 2 (:mod:`orchestrator.sl.admm`);
- ``balanced-greedy``, ``random-fcfs``: the paper's heuristics (:mod:`orchestrator.sl.baselines`);
- ``auto``: local search + CP-SAT polish (:mod:`orchestrator.sl.auto`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from orchestrator.sl.admm import solve_admm
from orchestrator.sl.auto import local_search, solve_auto
from orchestrator.sl.baselines import balanced_assignment, balanced_greedy, random_fcfs
from orchestrator.sl.check import check_schedule
from orchestrator.sl.exact import simple_lower_bound, solve_exact
from orchestrator.sl.formats import Instance, Schedule

METHODS = ("exact", "admm", "balanced-greedy", "random-fcfs", "auto")
DEFAULT_TIME_LIMIT_S = 10.0
EXACT_SEARCH_SHARE = 0.2
"""The share of ``exact``'s time limit spent on the local search that gives the incumbent."""


def switch_vector(*, instance: Instance, switch_slots: int | Sequence[int] | None) -> list[int]:
    """The switching delay of every helper: one number for all, or one per helper."""
    if switch_slots is None:
        return [0] * instance.helpers
    values = [switch_slots] * instance.helpers if isinstance(switch_slots, int) \
        else list(switch_slots)
    if len(values) != instance.helpers:
        raise ValueError(f"switch_slots needs one value per helper ({instance.helpers}), got "
                         f"{len(values)}: {values}")
    if any(v < 0 for v in values):
        raise ValueError(f"switch_slots must not be negative, got {values}")
    return values


def solve(*, instance: Instance, method: str, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
          seed: int = 0, switch_slots: int | Sequence[int] | None = None,
          workers: int = 2) -> Schedule:
    """Run ``method`` on ``instance`` and return its checked schedule with ``solver_s``."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r} (known: {', '.join(METHODS)})")
    if not time_limit_s > 0:
        raise ValueError(f"the time limit must be positive, got {time_limit_s}")
    switch = switch_vector(instance=instance, switch_slots=switch_slots)
    started = time.perf_counter()
    if method == "exact":
        incumbent = local_search(instance=instance, switch_slots=switch, seed=seed,
                                 deadline=started + EXACT_SEARCH_SHARE * time_limit_s,
                                 lower_bound=simple_lower_bound(instance=instance))
        schedule = solve_exact(instance=instance, incumbent=incumbent, switch_slots=switch,
                               time_limit_s=time_limit_s - (time.perf_counter() - started),
                               workers=workers).schedule
        schedule = replace(schedule, seed=None)
    elif method == "admm":
        schedule = solve_admm(instance=instance, time_limit_s=time_limit_s, switch_slots=switch,
                              start=balanced_assignment(instance=instance))
    elif method == "balanced-greedy":
        schedule = balanced_greedy(instance=instance)
    elif method == "random-fcfs":
        schedule = random_fcfs(instance=instance, seed=seed)
    else:
        schedule = solve_auto(instance=instance, time_limit_s=time_limit_s, switch_slots=switch,
                              seed=seed, workers=workers)
    schedule = replace(schedule, solver_s=round(time.perf_counter() - started, 4),
                       switch_slots=tuple(switch) if any(switch) else None)
    check_schedule(instance=instance, schedule=schedule)
    return schedule
