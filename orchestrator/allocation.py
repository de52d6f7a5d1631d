"""Duan and Wu, resource allocation in pipeline parallelism: the forward/backward split beta.

A worker runs the forward pass of one micro-batch and the backward pass of another at the same
time and gives a fraction beta_j of each resource j to the forward pass. With r_f,j and r_b,j
the fraction of the stage's forward (backward) work resource j completes per second, the worker's
throughput is the largest r with

    r <= sum_j beta_j r_f,j        and        r <= sum_j (1 - beta_j) r_b,j,   0 <= beta_j <= 1,

a linear programme (their LP), solved here with HiGHS. When every resource has the same
backward/forward ratio the optimum is the closed form beta = c / (c + 1), c the ratio of the
worker's forward time to its backward time. :func:`best_rate` gives the same optimum in
O(R log R) by the structure of the LP's optimal vertex (resources sorted by comparative
advantage, at most one split); planners call it in their inner loops.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.optimize import linprog

from orchestrator.errors import PlanningError

_HUGE = 1e30


def _finite(rates: Sequence[float]) -> list[float]:
    return [min(r, _HUGE) for r in rates]


def _check(rf: Sequence[float], rb: Sequence[float]) -> None:
    if len(rf) != len(rb) or not rf:
        raise ValueError(f"need one forward and one backward rate per resource, got {len(rf)} "
                         f"and {len(rb)}")
    for r in (*rf, *rb):
        if not r > 0:
            raise ValueError(f"resource rates must be positive, got {r!r}")


def closed_form_beta(rf: Sequence[float], rb: Sequence[float]) -> float | None:
    """beta = c/(c+1) when all resources share one backward/forward ratio, else None."""
    _check(rf, rb)
    if all(math.isinf(r) for r in rf):
        return 0.0
    if all(math.isinf(r) for r in rb):
        return 1.0
    if any(math.isinf(r) for r in (*rf, *rb)):
        return None
    ratio = rb[0] / rf[0]
    if any(not math.isclose(b / f, ratio, rel_tol=1e-9) for f, b in zip(rf, rb, strict=True)):
        return None
    forward_s, backward_s = 1.0 / sum(rf), 1.0 / sum(rb)
    c = forward_s / backward_s
    return c / (c + 1.0)


def best_rate(rf: Sequence[float], rb: Sequence[float]) -> tuple[float, list[float]]:
    """The LP's optimum (throughput in stage passes per second) and a beta achieving it.

    Resources with the highest forward/backward comparative advantage go to the forward pass;
    the resource at the crossing is split so that both passes run at the same rate.
    """
    _check(rf, rb)
    if all(math.isinf(r) for r in rf):
        return sum(rb), [0.0] * len(rf)
    if all(math.isinf(r) for r in rb):
        return sum(rf), [1.0] * len(rf)
    f, b = _finite(rf), _finite(rb)
    order = sorted(range(len(f)), key=lambda j: f[j] / b[j], reverse=True)
    beta = [0.0] * len(f)
    before_f = 0.0  # forward rate of resources wholly on the forward pass
    after_b = sum(b)  # backward rate of resources not yet reached
    for j in order:
        after_b -= b[j]
        # give x of resource j to forward: before_f + x f_j = after_b + (1 - x) b_j
        x = (after_b + b[j] - before_f) / (f[j] + b[j])
        if x <= 1.0:
            x = max(x, 0.0)
            beta[j] = x
            rate = min(before_f + x * f[j], after_b + (1 - x) * b[j])
            return rate, beta
        beta[j] = 1.0
        before_f += f[j]
    return before_f, beta  # pragma: no cover - the loop always crosses (after_b reaches 0)


def lp_beta(rf: Sequence[float], rb: Sequence[float]) -> tuple[float, list[float]]:
    """Solve Duan-Wu's LP with HiGHS: maximise r over (beta, r)."""
    _check(rf, rb)
    f, b = np.array(_finite(rf)), np.array(_finite(rb))
    scale = max(float(f.max()), float(b.max()))
    f, b = f / scale, b / scale  # keep HiGHS's tolerances meaningful
    n = len(f)
    cost = np.zeros(n + 1)
    cost[-1] = -1.0
    a_ub = np.zeros((2, n + 1))
    a_ub[0, :n], a_ub[0, -1] = -f, 1.0  # r <= sum beta f
    a_ub[1, :n], a_ub[1, -1] = b, 1.0  # r <= sum (1 - beta) b
    b_ub = np.array([0.0, float(b.sum())])
    result = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=[(0.0, 1.0)] * n + [(0.0, None)],
                     method="highs")
    if result.status != 0:
        raise PlanningError(f"the resource allocation LP failed: {result.message}")
    beta = [min(max(float(x), 0.0), 1.0) for x in result.x[:n]]
    return float(result.x[-1]) * scale, beta


def allocate_beta(rf: Sequence[float], rb: Sequence[float]) -> list[float]:
    """Duan-Wu's allocation: the closed form when it applies, else the LP."""
    closed = closed_form_beta(rf, rb)
    if closed is not None:
        return [closed] * len(rf)
    return lp_beta(rf, rb)[1]
