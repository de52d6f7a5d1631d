"""The pipeline subcommands of ``python -m orchestrator``: plan, simulate, compare, group."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from orchestrator.cost import CostModel, build_cost_model, memory_shortfall
from orchestrator.errors import PlanningError
from orchestrator.formats import SCHEDULES, load_devices, load_profile
from orchestrator.grouping import group_brute_force, group_local_search, group_sorting
from orchestrator.partition import DESCRIPTIONS, PLANNERS, QUICK_PLANNERS, run_planner
from orchestrator.partition.duanwu import partition_overflow, partition_period
from orchestrator.planformat import load_plan
from orchestrator.schedule import format_schedule
from orchestrator.simulator import simulate

GROUPING = ("local-search", "sorting", "brute-force")


def print_json(document: Any) -> None:
    json.dump(document, sys.stdout, indent=1)
    sys.stdout.write("\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _inputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", required=True, metavar="FILE",
                        help="model profile JSON (per-layer times and sizes)")
    parser.add_argument("--devices", required=True, metavar="FILE",
                        help="devices JSON (speeds, memory, bandwidths, optional layer_times)")


def _cost_model(args: argparse.Namespace) -> CostModel:
    return build_cost_model(load_profile(args.profile), load_devices(args.devices))


def _plan_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--microbatches", type=positive_int, default=8, metavar="M",
                        help="micro-batches per batch (default 8)")
    parser.add_argument("--schedule", choices=SCHEDULES, default="1f1b",
                        help="pipeline schedule (default 1f1b)")


# --------------------------------------------------------------------------- plan


def register_plan(sub: Any) -> None:
    algorithms = "\n".join(f"  {name:10} {text}" for name, text in DESCRIPTIONS.items())
    parser = sub.add_parser(
        "plan", help="partition the model over the devices with one algorithm",
        description="Plan a pipeline and print the plan JSON (stages, predicted period, "
                    "throughput, bottleneck, memory).",
        epilog=f"algorithms:\n{algorithms}", formatter_class=argparse.RawDescriptionHelpFormatter)
    _inputs(parser)
    parser.add_argument("--algorithm", required=True, choices=list(PLANNERS), metavar="A",
                        help=f"one of: {', '.join(PLANNERS)}")
    _plan_options(parser)
    parser.add_argument("--workers", type=positive_int, metavar="Q",
                        help="duanwu only: pipeline depth q (default: the best q)")
    parser.add_argument("--episodes", type=positive_int, metavar="N",
                        help="tapp only: policy-gradient episodes (default: tapp's)")
    parser.add_argument("--seed", type=int, metavar="S",
                        help="tapp only: random seed of the policy and its sampling (default 0)")
    parser.set_defaults(handler=_plan)


def _plan(args: argparse.Namespace) -> int:
    cm = _cost_model(args)
    options: dict[str, Any] = {"schedule": args.schedule, "microbatches": args.microbatches}
    if args.workers is not None:
        if args.algorithm != "duanwu":
            raise ValueError("--workers applies to --algorithm duanwu only")
        options["workers"] = args.workers
    for name in ("episodes", "seed"):
        if getattr(args, name) is not None:
            if args.algorithm != "tapp":
                raise ValueError(f"--{name} applies to --algorithm tapp only")
            options[name] = getattr(args, name)
    if args.algorithm == "tapp":
        options["progress"] = True  # training takes seconds: a progress bar on stderr
    plan = run_planner(cm, args.algorithm, **options)
    assert plan.predicted is not None
    if not plan.predicted.memory_ok:
        raise PlanningError(f"the {args.algorithm} plan does not fit in memory: "
                            f"{memory_shortfall(cm, plan.stages, plan.predicted)}")
    print_json(plan.to_json())
    return 0


# --------------------------------------------------------------------------- simulate


def register_simulate(sub: Any) -> None:
    parser = sub.add_parser(
        "simulate", help="simulate a plan's pipeline and print its timeline and summary",
        description="Discrete-event simulation of a plan: prints {\"summary\": ..., "
                    "\"events\": [...]} with events in the shared timeline schema.")
    _inputs(parser)
    parser.add_argument("--plan", required=True, metavar="FILE", help="plan JSON")
    parser.add_argument("--microbatches", type=positive_int, required=True, metavar="M",
                        help="micro-batches to simulate")
    parser.add_argument("--schedule", choices=SCHEDULES,
                        help="schedule (default: the plan's)")
    parser.add_argument("--summary-only", action="store_true", help="omit the events")
    parser.add_argument("--actions", action="store_true",
                        help="print the schedule's step x device action table instead")
    parser.set_defaults(handler=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    cm = _cost_model(args)
    plan = load_plan(args.plan, profile=cm.profile, devices=cm.devices)
    result = simulate(cm, plan, microbatches=args.microbatches, schedule=args.schedule)
    if args.actions:
        print(format_schedule(result.schedule))
        return 0
    document: dict[str, Any] = {"summary": result.summary_json()}
    if not args.summary_only:
        document["events"] = [e.to_json() for e in result.events]
    print_json(document)
    return 0


# --------------------------------------------------------------------------- compare


def register_compare(sub: Any) -> None:
    parser = sub.add_parser(
        "compare", help="run every planner and compare their plans",
        description="Plan with every algorithm (or those given) and print a table: period, "
                    "throughput, bottleneck, memory, planner time.")
    _inputs(parser)
    parser.add_argument("--algorithms", metavar="A,B",
                        help=f"comma-separated planners (default: {','.join(QUICK_PLANNERS)}; "
                             "add tapp to train the learned planner too)")
    _plan_options(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=_compare)


def compare_rows(cm: CostModel, algorithms: list[str], *, schedule: str,
                 microbatches: int) -> list[dict[str, Any]]:
    """One row per algorithm: its plan's figures, or why it has none."""
    rows: list[dict[str, Any]] = []
    for name in algorithms:
        try:
            plan = run_planner(cm, name, schedule=schedule, microbatches=microbatches)
        except PlanningError as exc:
            rows.append({"algorithm": name, "error": str(exc)})
            continue
        assert plan.predicted is not None
        rows.append({"algorithm": name, "period_s": plan.predicted.period_s,
                     "throughput_sps": plan.predicted.throughput_sps,
                     "bottleneck": plan.predicted.bottleneck,
                     "memory_ok": plan.predicted.memory_ok, "planner_s": plan.planner_s,
                     "stages": len(plan.stages), "plan": plan.to_json()})
    return rows


def _compare(args: argparse.Namespace) -> int:
    cm = _cost_model(args)
    algorithms = list(QUICK_PLANNERS) if not args.algorithms else [
        a.strip() for a in args.algorithms.split(",") if a.strip()]
    unknown = [a for a in algorithms if a not in PLANNERS]
    if unknown:
        raise ValueError(f"--algorithms: unknown algorithm {unknown[0]!r}; known: "
                         f"{', '.join(PLANNERS)}")
    rows = compare_rows(cm, algorithms, schedule=args.schedule, microbatches=args.microbatches)
    if args.json:
        print_json({"profile": cm.profile.model, "devices": list(cm.devices.ids), "rows": rows})
        return 0
    feasible = [r for r in rows if "error" not in r and r["memory_ok"]]
    best = min(feasible, key=lambda r: r["period_s"]) if feasible else None
    header = (f"{'algorithm':10} {'stages':>6} {'period_s':>10} {'samples/s':>10} "
              f"{'vs best':>8} {'memory':>6} {'planner_s':>10}  bottleneck")
    print(header)
    print("-" * len(header))
    for r in rows:
        if "error" in r:
            print(f"{r['algorithm']:10} no plan: {r['error']}")
            continue
        ratio = f"{r['period_s'] / best['period_s']:.2f}x" if best else "-"
        print(f"{r['algorithm']:10} {r['stages']:>6} {r['period_s']:>10.4f} "
              f"{r['throughput_sps']:>10.2f} {ratio:>8} {'ok' if r['memory_ok'] else 'NO':>6} "
              f"{r['planner_s']:>10.4f}  {r['bottleneck']}")
    return 0


# --------------------------------------------------------------------------- group


def register_group(sub: Any) -> None:
    parser = sub.add_parser(
        "group", help="group the devices into q virtual workers (Duan-Wu)",
        description="Group heterogeneous devices into q virtual workers and report the "
                    "pipeline period Duan-Wu's partition reaches on them.")
    _inputs(parser)
    parser.add_argument("--workers", type=positive_int, required=True, metavar="Q",
                        help="number of virtual workers (pipeline depth)")
    parser.add_argument("--algorithm", choices=GROUPING, default="local-search",
                        help="local-search (Duan-Wu Algorithm 2), sorting baseline, or "
                             "brute-force (small sets)")
    parser.set_defaults(handler=_group)


def _group(args: argparse.Namespace) -> int:
    cm = _cost_model(args)
    n = cm.num_devices
    if args.workers > min(n, cm.num_layers):
        raise ValueError(f"--workers must be at most {min(n, cm.num_layers)} (the number of "
                         f"devices and of layers), got {args.workers}")
    started = time.perf_counter()

    def objective(g: list[list[int]]) -> float:
        return partition_period(cm, g)

    speeds = [d.speed for d in cm.devices.devices]
    if args.algorithm == "sorting":
        groups = group_sorting(n, args.workers, speeds=speeds)
    elif args.algorithm == "brute-force":
        groups = group_brute_force(n, args.workers, objective=objective)
    else:
        groups = group_local_search(n, args.workers, objective=objective, speeds=speeds,
                                    overflow=lambda g: partition_overflow(cm, g))
    period = objective(groups)
    if math.isinf(period):
        raise PlanningError(f"no partition over the {args.algorithm} grouping fits in memory")
    ids = cm.devices.ids
    print_json({"algorithm": args.algorithm, "workers": args.workers,
                "groups": [[ids[d] for d in g] for g in groups], "period_s": period,
                "planner_s": time.perf_counter() - started})
    return 0
