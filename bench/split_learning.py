"""Benchmark of the parallel split-learning methods over the shared instances (data/sl/*.jsonl).

Tirana et al., "Workflow Optimization for Parallel Split Learning" (INFOCOM 2024). For every
instance runs random-fcfs, balanced-greedy, admm, auto and exact, and prints one table row an
instance: the makespan of each method, the exact method's proven lower bound (``*`` where it
is proven optimal), and the solving times. Then, per method: the mean ratio of its makespan to
random-fcfs's, the mean and largest gap to the exact optimum over the instances where CP-SAT
proves one, the gap to the best lower bound over all instances, and the solving times. The
last line is one JSON object with these aggregates (and the time of ``auto`` on the 100-client,
25-helper instances). Progress goes to stderr.

    .venv/bin/python bench/split_learning.py                    # all 72, 10 s per exact solve
    .venv/bin/python bench/split_learning.py --quick            # every 6th instance, 2 s
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: the package is not installed
    sys.path.insert(0, str(ROOT))

from orchestrator.sl.formats import Instance, Schedule, read_instances  # noqa: E402
from orchestrator.sl.solve import solve  # noqa: E402

METHODS = ("random-fcfs", "balanced-greedy", "admm", "auto", "exact")


@dataclass(frozen=True)
class Row:
    """One instance: every method's schedule, and the best lower bound known."""

    instance: Instance
    schedules: dict[str, Schedule]
    lower_bound: int
    proven: bool


def run_instance(instance: Instance, *, time_limit_s: float, auto_time_limit_s: float,
                 seed: int) -> Row:
    out: dict[str, Schedule] = {}
    for method in METHODS:
        limit = time_limit_s if method == "exact" else auto_time_limit_s
        out[method] = solve(instance=instance, method=method, time_limit_s=limit, seed=seed)
    exact = out["exact"]
    bounds = [s.lower_bound for s in out.values() if s.lower_bound is not None]
    lower = max(bounds)
    best = min(s.makespan for s in out.values())
    return Row(instance=instance, schedules=out, lower_bound=lower,
               proven=exact.gap == 0.0 or best == lower)


def _gap(makespan: int, reference: int) -> float:
    return (makespan - reference) / reference


def aggregate(rows: Sequence[Row]) -> dict[str, object]:
    per_method: dict[str, dict[str, float | int | None]] = {}
    proven = [r for r in rows if r.proven]
    for method in METHODS:
        ratios = [r.schedules[method].makespan / r.schedules["random-fcfs"].makespan
                  for r in rows]
        gaps = [_gap(r.schedules[method].makespan, r.lower_bound) for r in proven]
        bound_gaps = [_gap(r.schedules[method].makespan, r.lower_bound) for r in rows]
        times = [r.schedules[method].solver_s for r in rows]
        per_method[method] = {
            "mean_ratio_to_random": round(statistics.mean(ratios), 4),
            "mean_improvement_over_random": round(1 - statistics.mean(ratios), 4),
            "mean_gap_to_optimum": round(statistics.mean(gaps), 4) if gaps else None,
            "max_gap_to_optimum": round(max(gaps), 4) if gaps else None,
            "within_5pct_of_optimum": sum(g <= 0.05 for g in gaps),
            "mean_gap_to_bound": round(statistics.mean(bound_gaps), 4),
            "mean_solver_s": round(statistics.mean(times), 3),
            "max_solver_s": round(max(times), 3),
        }
    big = [r.schedules["auto"].solver_s for r in rows
           if (r.instance.clients, r.instance.helpers) == (100, 25)]
    ceiling = statistics.mean(1 - r.lower_bound / r.schedules["random-fcfs"].makespan
                              for r in rows)
    return {"instances": len(rows), "proven_optimal": len(proven), "methods": per_method,
            "auto_100x25_max_s": round(max(big), 3) if big else None,
            "improvement_ceiling_from_bounds": round(ceiling, 4)}


def table(rows: Sequence[Row]) -> str:
    head = (f"{'instance':<40} {'K':>3} {'H':>2} " + " ".join(f"{m:>15}" for m in METHODS)
            + f" {'bound':>7} {'auto_s':>7} {'exact_s':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = " ".join(f"{r.schedules[m].makespan:>15}" for m in METHODS)
        mark = "*" if r.proven else " "
        lines.append(f"{r.instance.name[:40]:<40} {r.instance.clients:>3} "
                     f"{r.instance.helpers:>2} {cells} {r.lower_bound:>6}{mark} "
                     f"{r.schedules['auto'].solver_s:>7.2f} {r.schedules['exact'].solver_s:>7.2f}")
    lines.append("* proven optimal (the bound is met by a schedule)")
    return "\n".join(lines)


def summary(figures: dict[str, object]) -> str:
    methods = figures["methods"]
    assert isinstance(methods, dict)
    lines = [f"{'method':<16} {'ratio/random':>12} {'gap(opt) mean':>14} {'max':>7} "
             f"{'<=5%':>5} {'gap(bound)':>10} {'mean s':>7} {'max s':>7}"]
    for method, m in methods.items():
        mean_gap = "-" if m["mean_gap_to_optimum"] is None else f"{m['mean_gap_to_optimum']:.2%}"
        max_gap = "-" if m["max_gap_to_optimum"] is None else f"{m['max_gap_to_optimum']:.2%}"
        lines.append(f"{method:<16} {m['mean_ratio_to_random']:>12.3f} {mean_gap:>14} "
                     f"{max_gap:>7} {m['within_5pct_of_optimum']:>5} "
                     f"{m['mean_gap_to_bound']:>10.2%} {m['mean_solver_s']:>7.2f} "
                     f"{m['max_solver_s']:>7.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-limit", type=float, default=10.0, metavar="S",
                        help="seconds per exact solve (default %(default)s)")
    parser.add_argument("--auto-time-limit", type=float, default=10.0, metavar="S",
                        help="seconds for auto and admm (default %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="every 6th instance, 2 s per exact solve, 2 s for auto and admm")
    parser.add_argument("--seed", type=int, default=0, help="seed of random-fcfs and auto")
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "sl",
                        help="folder of the .jsonl instance files")
    args = parser.parse_args(argv)
    instances = [inst for path in sorted(args.data.glob("*.jsonl"))
                 for inst in read_instances(path)]
    time_limit, auto_limit = args.time_limit, args.auto_time_limit
    if args.quick:
        instances = instances[::6]
        time_limit, auto_limit = min(time_limit, 2.0), min(auto_limit, 2.0)
    rows = []
    started = time.perf_counter()
    for n, inst in enumerate(instances, start=1):
        row = run_instance(inst, time_limit_s=time_limit, auto_time_limit_s=auto_limit,
                           seed=args.seed)
        rows.append(row)
        print(f"[{n}/{len(instances)}] {inst.name}: auto {row.schedules['auto'].makespan}, "
              f"exact {row.schedules['exact'].makespan} (bound {row.lower_bound}), "
              f"{time.perf_counter() - started:.0f} s so far", file=sys.stderr, flush=True)
    figures = aggregate(rows)
    print(table(rows))
    print()
    print(summary(figures))
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
