"""``python -m orchestrator``: the planning core from the command line.

Every subcommand reads JSON files, writes JSON (or a table) to stdout and exits 2 with a
one-line message on stderr for bad input or when no plan fits in memory. Subcommands live in
the modules that implement them; each exposes ``register(subparsers)`` which adds its parser and
sets ``handler``, a function of the parsed arguments returning the exit code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator import commands, pipelearn_cli
from orchestrator.errors import FormatError, PlanningError
from orchestrator.report import cli as report_cli
from orchestrator.sl import cli as sl_cli

Register = Callable[[Any], None]

SUBCOMMANDS: tuple[Register, ...] = (
    commands.register_plan,
    commands.register_simulate,
    commands.register_compare,
    commands.register_group,
    sl_cli.register,
    pipelearn_cli.register,
    report_cli.register,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator",
        description="EdgePipe's planning core: partition a profiled model over heterogeneous "
                    "devices, simulate the pipeline, compare planners, report on a run.",
        epilog="Formats: docs/architecture.md. Example: python -m orchestrator compare "
               "--profile data/profiles/resnet101_cifar10.model.json "
               "--devices data/profiles/resnet101_cifar10.devices.json",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in SUBCOMMANDS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except (FormatError, PlanningError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return code
