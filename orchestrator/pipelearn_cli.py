"""``python -m orchestrator pipelearn``: PipeLearn's split point and parallel batch number for
every client, with the federated-learning and split-federated-learning baselines.

Zhang et al., "PipeLearn: Pipeline Parallelism for Collaborative Machine Learning"; the model
is :mod:`orchestrator.pipelearn`, the per-epoch figures :mod:`orchestrator.pipelearn_plan`, the
timeline :mod:`orchestrator.pipelearn_timeline`. Bad input raises
:class:`~orchestrator.errors.FormatError`, :class:`~orchestrator.errors.PlanningError` or
:class:`ValueError`, which the main CLI prints as one ``error:`` line with exit code 2.
"""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator.commands import positive_int, print_json
from orchestrator.formats import load_devices, load_profile
from orchestrator.pipelearn import DEFAULT_TOLERANCE, RULES
from orchestrator.pipelearn_plan import DEFAULT_DATA_SIZE, METHODS, compare, make_setting
from orchestrator.pipelearn_timeline import timeline


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text!r}")
    return value


def register(subparsers: Any) -> None:
    """Add the ``pipelearn`` subcommand to the main parser's subparsers."""
    parser = subparsers.add_parser(
        "pipelearn",
        help="choose PipeLearn's split point and parallel batch number per client and compare "
             "with federated and split federated learning",
        description="For every device other than the server (a client), choose the split "
                    "point P (layers [0, P) on the client) and the number N of parallel "
                    "micro-batches from the stage DAG of PipeLearn (Zhang et al.), and predict "
                    "per-epoch time, idle time and network throughput of PipeLearn, federated "
                    "learning (fl) and split federated learning (sfl). Uplink and downlink "
                    "bandwidths are the clients' uplink_bps and downlink_bps. Prints JSON: "
                    "{\"devices\": {ID: {\"split\", \"parallel_batches\", \"minibatch\", "
                    "\"iteration_s\", \"epoch_s\", \"idle_s\", \"network_bps\"}}, \"fl\": ..., "
                    "\"sfl\": ..., \"speedup\": ...}.",
        epilog="Example: python -m orchestrator pipelearn "
               "--profile data/profiles/vgg5_cifar10.model.json "
               "--devices data/profiles/vgg5_cifar10.devices.json --server edge-vm",
    )
    parser.add_argument("--profile", required=True, metavar="FILE",
                        help="model profile JSON (per-layer times and sizes)")
    parser.add_argument("--devices", required=True, metavar="FILE",
                        help="devices JSON: the clients and the server, with layer_times or "
                             "speed, uplink_bps and downlink_bps")
    parser.add_argument("--server", required=True, metavar="ID",
                        help="id of the server device; every other device is a client")
    parser.add_argument("--batch-size", type=positive_int, metavar="B",
                        help="samples per iteration (default: the profile's batch_size)")
    parser.add_argument("--data-size", type=positive_int, default=DEFAULT_DATA_SIZE,
                        metavar="S",
                        help="training samples per client and epoch (default %(default)s, "
                             "the paper's)")
    parser.add_argument("--exhaustive", action="store_true",
                        help="search every P and every N in 1..B instead; each client also "
                             "gets the closed-form choice and its score (best / chosen time)")
    parser.add_argument("--rule", choices=RULES, default="saturated",
                        help="N for a split: eq14 = the paper's equation 14; saturated "
                             "(default) = the larger of eq. 14 and the fewest micro-batches "
                             "within --tolerance of the DAG's best")
    parser.add_argument("--tolerance", type=_fraction, default=DEFAULT_TOLERANCE, metavar="X",
                        help="relative slack of the saturated rule (default %(default)s)")
    parser.add_argument("--server-parallelism", type=positive_int, default=1, metavar="C",
                        help="server-side replicas the server runs at full speed at once; with "
                             "K clients each replica is max(1, K/C) times slower "
                             "(default %(default)s)")
    parser.add_argument("--timeline", action="store_true",
                        help="add \"events\": the planned timeline in the shared event schema")
    parser.add_argument("--timeline-method", choices=METHODS, default="pipelearn",
                        help="whose timeline --timeline draws (default %(default)s)")
    parser.add_argument("--iterations", type=positive_int, default=1, metavar="I",
                        help="iterations per client in the timeline before the aggregation "
                             "(default %(default)s)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    setting = make_setting(profile=load_profile(args.profile), devices=load_devices(args.devices),
                           server=args.server, batch_size=args.batch_size,
                           data_size=args.data_size, server_parallelism=args.server_parallelism)
    result = compare(setting, exhaustive=args.exhaustive, rule=args.rule,
                     tolerance=args.tolerance)
    document = result.to_json()
    if args.timeline:
        method = {"pipelearn": result.pipelearn, "sfl": result.sfl, "fl": result.fl}
        events = timeline(method=method[args.timeline_method], iterations=args.iterations)
        document["events"] = [e.to_json() for e in events]
    print_json(document)
    return 0
