"""``python -m orchestrator sl``: plan a parallel split-learning batch from the command line.

Reads a split-learning instance (docs/architecture.md; a ``.json`` file, or one line of a
``.jsonl`` file picked by ``--index`` or ``--name``), runs a method of Tirana et al.,
"Workflow Optimization for Parallel Split Learning" (INFOCOM 2024), and prints the schedule
JSON, or a text Gantt chart per helper with ``--gantt``. ``--check SCHEDULE`` instead checks a
schedule file and explains the first constraint it violates. Bad input raises
:class:`~orchestrator.errors.FormatError` or :class:`ValueError`, which the main CLI prints as
one ``error:`` line with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from orchestrator.sl.check import first_violation
from orchestrator.sl.formats import load_instance, load_schedule
from orchestrator.sl.gantt import gantt
from orchestrator.sl.solve import DEFAULT_TIME_LIMIT_S, METHODS, solve

_METHOD_HELP = {
    "auto": "local search over assignments, each helper scheduled by the best of five rules "
            "(Algorithm 2's among them), then CP-SAT warm-started from it on instances small "
            "enough (recommended)",
    "exact": "the paper's slot-indexed model with CP-SAT: best schedule, proven lower bound "
             "and gap within the time limit",
    "admm": "the paper's Algorithm 1 (ADMM on the forward problem) + Algorithm 2 (backward)",
    "balanced-greedy": "the paper's heuristic: balanced client counts, FCFS per helper",
    "random-fcfs": "the paper's baseline: random assignment (seeded), FCFS per helper",
}


def register(subparsers: Any) -> None:
    """Add the ``sl`` subcommand to the main parser's subparsers."""
    methods = "; ".join(f"{m}: {_METHOD_HELP[m]}" for m in METHODS)
    parser = subparsers.add_parser(
        "sl",
        help="assign split-learning clients to helpers and schedule their forward/backward "
             "tasks (Tirana et al., INFOCOM 2024)",
        description="Minimise the makespan of one parallel split-learning batch: assign each "
                    "client to a helper within memory and schedule the helpers' forward and "
                    "backward tasks in time slots (preemption allowed). Prints the schedule "
                    f"JSON. Methods: {methods}.",
        epilog="Example: python -m orchestrator sl --instance data/sl/resnet101_cifar10.jsonl "
               "--index 2 --method auto --gantt",
    )
    parser.add_argument("--instance", required=True, metavar="FILE",
                        help="instance file: .json (one instance) or .jsonl (one a line)")
    pick = parser.add_mutually_exclusive_group()
    pick.add_argument("--index", type=int, metavar="N",
                      help="in a .jsonl file, the instance on line N (counting non-blank lines "
                           "from 0)")
    pick.add_argument("--name", metavar="NAME", help="in a .jsonl file, the instance named NAME")
    parser.add_argument("--method", metavar="M",
                        help=f"one of {', '.join(METHODS)} (required unless --check)")
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, metavar="S",
                        help="seconds for exact, admm and auto (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, metavar="N",
                        help="seed of random-fcfs and of auto's random kicks (default 0)")
    parser.add_argument("--switch-slots", default=None, metavar="S[,S...]",
                        help="preemption cost: reload slots each time a helper resumes a task, "
                             "one number for all helpers or one per helper (default 0)")
    parser.add_argument("--gantt", action="store_true",
                        help="print a text Gantt chart per helper instead of the JSON")
    parser.add_argument("--check", metavar="SCHEDULE",
                        help="check this schedule JSON against the instance instead of solving; "
                             "exit 1 and explain the first violated constraint if infeasible")
    parser.set_defaults(handler=run)


def parse_switch_slots(text: str | None) -> list[int] | None:
    """``"2"`` or ``"1,0,2"`` as a list of non-negative integers."""
    if text is None:
        return None
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--switch-slots must be integers separated by commas, got {text!r}") \
            from None
    if any(v < 0 for v in values):
        raise ValueError(f"--switch-slots must not be negative, got {text!r}")
    return values


def run(args: argparse.Namespace) -> int:
    """The ``sl`` handler: the exit code (0 done or feasible, 1 infeasible schedule)."""
    instance = load_instance(args.instance, index=args.index, name=args.name)
    if args.check is not None:
        schedule = load_schedule(args.check)
        found = first_violation(instance=instance, schedule=schedule)
        if found is not None:
            print(f"infeasible: {found.message}")
            return 1
        print(f"feasible: makespan {schedule.makespan} slots")
        return 0
    if args.method is None:
        raise ValueError(f"--method is required (one of {', '.join(METHODS)})")
    switch = parse_switch_slots(args.switch_slots)
    schedule = solve(instance=instance, method=args.method, time_limit_s=args.time_limit,
                     seed=args.seed, switch_slots=switch[0] if switch and len(switch) == 1
                     else switch)
    if args.gantt:
        sys.stdout.write(gantt(instance=instance, schedule=schedule))
    else:
        json.dump(schedule.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    return 0
