"""``python manage.py demo``: the whole product on one laptop (see webapp.demo.scenario);
``--split``, a split-learning run on it (webapp.demo.split); ``--pipelearn``, a PipeLearn run
(webapp.demo.pipelearn)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agent.data import DATASETS
from agent.zoo import MODELS
from orchestrator.formats import SCHEDULES
from orchestrator.pipelearn_plan import METHODS as PIPELEARN_METHODS
from orchestrator.protocol.stagespec import SHARD_SPLITS
from webapp.demo.client import DemoError
from webapp.demo.demo import DemoOptions, run_demo
from webapp.demo.pipelearn import PipelearnDemoOptions, run_pipelearn_demo
from webapp.demo.scenario import DEFAULT_ALGORITHMS
from webapp.demo.split import SPLIT_METHODS, SplitDemoOptions, run_split_demo

# options of one demo only (dest: option), refused with the other when changed
PIPELINE_ONLY = {
    "microbatches": "--microbatches", "schedule": "--schedule",
    "repartition_every": "--repartition-every", "chain_every": "--chain-every",
    "global_every": "--global-every", "kill_agent_at": "--kill-agent-at",
    "pause_at": "--pause-at", "pause_at_batch": "--pause-at-batch", "pause_for": "--pause-for",
    "slow_agent_at": "--slow-agent-at", "slow_agent": "--slow-agent", "slow_to": "--slow-to",
    "vertical_sync": "--no-vertical-sync", "aggregate_every": "--aggregate-every"}
SPLIT_ONLY = {"clients": "--clients", "helpers": "--helpers", "sigma1": "--sigma1",
              "sigma2": "--sigma2", "rounds": "--rounds", "shard_split": "--shard-split",
              "time_limit": "--time-limit", "slot_ms": "--slot-ms"}
PIPELEARN_ONLY = {"devices": "--devices", "epochs": "--epochs", "method": "--method"}
# what --pipelearn refuses: the other demos' options but the shard split they share
NOT_PIPELEARN = {**PIPELINE_ONLY, **{d: o for d, o in SPLIT_ONLY.items() if d != "shard_split"},
                 "algorithms": "--algorithms", "plan": "--plan"}


def dataset_option(value: str) -> str:
    """--dataset: a data set every agent ships, or npz:PATH (a file of their --data-dir)."""
    if value in DATASETS or (value.startswith("npz:") and len(value) > len("npz:")):
        return value
    raise argparse.ArgumentTypeError(
        f"no agent has the data set {value!r}: choose {', '.join(DATASETS)} or npz:PATH")


class Command(BaseCommand):
    help = ("Start the web server, a planning worker and local agents emulating a "
            "heterogeneous testbed, plan a run with several planners and train it "
            "(--split: a split-learning run, clients and helpers; --pipelearn: a PipeLearn "
            "run, a server and devices, against FL and SFL). "
            "--headless runs to the end and prints a JSON summary as the last line.")

    def add_arguments(self, parser: CommandParser) -> None:
        self.parser = parser  # its defaults tell which options were changed
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        # the agents' own lists: an agent refuses to profile another, and the demo waited
        # 300 s for the profile
        parser.add_argument("--model", default=None, choices=MODELS,
                            help="zoo model (default vgg5; --split, --pipelearn: mlp)")
        parser.add_argument("--dataset", default=None, type=dataset_option,
                            help=f"{', '.join(DATASETS)} or npz:PATH (default synthetic-cifar; "
                                 "--split, --pipelearn: digits)")
        parser.add_argument("--batch-size", type=int, default=32)
        parser.add_argument("--microbatches", type=int, default=8,
                            help="micro-batches per batch (default 8)")
        parser.add_argument("--batches", type=int, default=None,
                            help="batches to train (default: until Ctrl-C; headless 100); "
                                 "--split: batches of every client a round (default 20)")
        parser.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
        parser.add_argument("--algorithms", default=None,
                            help="planners to compare (comma-separated; default "
                                 f"{','.join(DEFAULT_ALGORITHMS)}; --split: split-learning "
                                 f"methods, default {','.join(SPLIT_METHODS)})")
        parser.add_argument("--plan", default=None,
                            help="which plan to train: a planner's name, or best (default "
                                 "ftpipehd: every device in order, so every row of the Gantt "
                                 "fills; --split: a method's name or best, default best)")
        parser.add_argument("--headless", action="store_true",
                            help="run to the end without a browser; print a JSON summary")
        parser.add_argument("--repartition-every", type=int, default=None, metavar="BATCHES",
                            help="batches between dynamic re-partition checks (0: off; default "
                                 "the run's, 100, the first after 10)")
        parser.add_argument("--chain-every", type=int, default=None, metavar="BATCHES",
                            help="batches between chain replicas of each stage's weights to the "
                                 "next stage's device (0: none; default the run's)")
        parser.add_argument("--global-every", type=int, default=None, metavar="BATCHES",
                            help="batches between global replicas to the server (0: none; "
                                 "default the run's)")
        parser.add_argument("--kill-agent-at", type=_positive_seconds, default=None,
                            metavar="SECONDS",
                            help="fault injection: SECONDS after the run starts, kill an "
                                 "agent's process with SIGKILL (the run recovers without it)")
        parser.add_argument("--kill-agent-at-batch", type=_batches, default=None, metavar="N",
                            help="fault injection as --kill-agent-at, once the run has trained "
                                 "N batches instead (the same point of training on a fast "
                                 "machine or a loaded one); at the --pause-at-batch batch the "
                                 "kill waits until the run is paused, so that the device is "
                                 "lost while it is paused (--split: with --kill-agent)")
        parser.add_argument("--kill-agent", default="", metavar="NAME[,NAME...]",
                            help="the agent --kill-agent-at or --kill-agent-at-batch kills, or "
                                 "several (comma-separated, killed at once) (default: the "
                                 "device of the middle stage of the chosen plan; --split: "
                                 "say which, as sl-helper-1 or sl-client-2)")

        parser.add_argument("--pause-at", type=_positive_seconds, default=None,
                            metavar="SECONDS",
                            help="SECONDS after the run starts, pause it through the API, and "
                                 "resume it --pause-for seconds later (a device killed while it "
                                 "is paused: the run recovers, stays paused, then resumes)")
        parser.add_argument("--pause-at-batch", type=_batches, default=None, metavar="N",
                            help="as --pause-at, once the run has trained N batches instead")
        parser.add_argument("--pause-for", type=_positive_seconds, default=2.0,
                            metavar="SECONDS",
                            help="how long --pause-at or --pause-at-batch pauses (default 2)")
        parser.add_argument("--slow-agent-at", type=_positive_seconds, default=None,
                            metavar="SECONDS",
                            help="SECONDS after the run starts, slow an agent's device down "
                                 "(as if it heated up): the dynamic re-partition reacts")
        parser.add_argument("--slow-agent", default="", metavar="NAME",
                            help="the agent --slow-agent-at slows down (default: the device of "
                                 "the middle stage of the chosen plan)")
        parser.add_argument("--slow-to", type=float, default=20.0, metavar="X",
                            help="how many times slower than this machine (default 20)")
        parser.add_argument("--lr", type=float, default=None, metavar="LR",
                            help="SGD learning rate of the run, above 0 and at most 100 "
                                 "(default 0.02 under --schedule 1f1b with vertical sync, "
                                 "whose stale weights kept VGG-5 from learning at 0.1; else "
                                 "0.1)")
        parser.add_argument("--momentum", type=float, default=None, metavar="M",
                            help="SGD momentum of the run, from 0 to 0.999 (default 0); its "
                                 "buffers are replicated and restored with the weights")
        parser.add_argument("--no-vertical-sync", dest="vertical_sync", action="store_const",
                            const=False, default=None,
                            help="1F1B without vertical sync: each stage forwards a "
                                 "micro-batch with its newest weights (stashed for its "
                                 "backward), not with stage 0's version of them")
        parser.add_argument("--aggregate-every", type=int, default=None, metavar="K",
                            help="1F1B weight aggregation: every K x its in-flight depth D "
                                 "updates each stage averages its last D weight versions, "
                                 "from 0 to 1000 (default 0: off)")

        split = parser.add_argument_group(
            "split learning (--split)", "clients train the model's first and last layers on "
            "their own data, helpers its middle layers for the clients a plan assigns them")
        split.add_argument("--split", action="store_true",
                           help="a split-learning run: --clients clients of varied speed and "
                                "links, --helpers fast helpers, the split-learning methods' "
                                "plans compared")
        split.add_argument("--clients", type=int, default=4, metavar="N",
                           help="clients (default 4: 1x, 2x, 3x and 1.5x slower than this "
                                "machine, the second and fourth on slower links)")
        split.add_argument("--helpers", type=int, default=2, metavar="M",
                           help="helpers, each fast (default 2)")
        split.add_argument("--sigma1", type=int, default=0, metavar="LAYER",
                           help="the last layer of part-1, on the clients (default 0)")
        split.add_argument("--sigma2", type=int, default=1, metavar="LAYER",
                           help="the last layer of part-2, on the helpers (default 1); the "
                                "layers after it are part-3, on the clients")
        split.add_argument("--rounds", type=int, default=None, metavar="R",
                           help="rounds, each --batches batches of every client and then "
                                "FedAvg (default: until Ctrl-C; headless 3)")
        split.add_argument("--shard-split", choices=SHARD_SPLITS, default="iid",
                           help="how the training set is cut among the clients (default iid)")
        split.add_argument("--time-limit", type=_positive_seconds, default=2.0,
                           metavar="SECONDS",
                           help="each method's time limit (exact, admm, auto; default 2)")
        split.add_argument("--slot-ms", type=float, default=1.0, metavar="MS",
                           help="the study's time slot: every task's time is rounded up to "
                                "whole slots (default 1: the demo's MLP passes take less)")

        pipelearn = parser.add_argument_group(
            "PipeLearn (--pipelearn)", "every device trains the model's first layers on its "
            "own data, N micro-batches an iteration, the server a copy of the rest for each; "
            "FedAvg of each side every epoch (--shard-split and --batches apply too)")
        pipelearn.add_argument("--pipelearn", action="store_true",
                               help="a PipeLearn run: a fast server and --devices devices of "
                                    "varied speed and links, planned with PipeLearn, SFL and "
                                    "FL, one trained (--batches: iterations an epoch, "
                                    "default 10)")
        pipelearn.add_argument("--devices", type=int, default=4, metavar="N",
                               help="devices besides the server (default 4: 1x, 2x, 3x and "
                                    "1.5x slower than this machine, the second and fourth on "
                                    "slower links)")
        pipelearn.add_argument("--epochs", type=int, default=3, metavar="E",
                               help="epochs, each --batches iterations of every device and "
                                    "then FedAvg (default 3)")
        pipelearn.add_argument("--method", choices=PIPELEARN_METHODS, default="pipelearn",
                               help="which plan to train (default pipelearn; sfl: N = 1; fl: "
                                    "the whole model on every device)")

    def handle(self, *args: Any, **options: Any) -> None:
        logging.getLogger("httpx").setLevel(logging.WARNING)
        # SIGTERM stops the demo as Ctrl-C does: the testbed's processes stop with it (killed
        # without this, the demo left its web server, worker and agents running)
        signal.signal(signal.SIGTERM, _interrupt)
        say = self.stdout.write
        try:
            if options["pipelearn"]:
                if options["split"]:
                    raise DemoError("--split and --pipelearn: choose one")
                self._refuse(options, NOT_PIPELEARN, "not for --pipelearn")
                summary = run_pipelearn_demo(_pipelearn_options(options), say=say)
            elif options["split"]:
                self._refuse(options, PIPELEARN_ONLY, "for --pipelearn only")
                self._refuse(options, PIPELINE_ONLY, "not for --split")
                summary = run_split_demo(_split_options(options), say=say)
            else:
                self._refuse(options, PIPELEARN_ONLY, "for --pipelearn only")
                self._refuse(options, SPLIT_ONLY, "for --split only")
                summary = run_demo(_pipeline_options(options), say=say)
        except DemoError as exc:
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt:
            self.stdout.write("demo stopped")
            return
        if summary is not None:
            self.stdout.write(json.dumps(summary))

    def _refuse(self, options: dict[str, Any], others: dict[str, str], why: str) -> None:
        """DemoError naming the first of ``others`` (the other demo's options) changed."""
        for dest, option in others.items():
            if options[dest] != self.parser.get_default(dest):
                raise DemoError(f"{option} is {why}")


def _methods(options: dict[str, Any], default: tuple[str, ...]) -> tuple[str, ...]:
    if options["algorithms"] is None:
        return default
    return tuple(a.strip() for a in options["algorithms"].split(",") if a.strip())


def _pipeline_options(options: dict[str, Any]) -> DemoOptions:
    return DemoOptions(
        host=options["host"], port=options["port"], model=options["model"] or "vgg5",
        dataset=options["dataset"] or "synthetic-cifar", batch_size=options["batch_size"],
        microbatches=options["microbatches"], batches=options["batches"],
        schedule=options["schedule"], algorithms=_methods(options, DEFAULT_ALGORITHMS),
        plan=options["plan"] or "ftpipehd", headless=options["headless"],
        repartition_every=options["repartition_every"],
        chain_every=options["chain_every"], global_every=options["global_every"],
        slow_agent_at=options["slow_agent_at"], slow_agent=options["slow_agent"],
        slow_to=options["slow_to"], lr=options["lr"], momentum=options["momentum"],
        vertical_sync=options["vertical_sync"], aggregate_every=options["aggregate_every"],
        kill_agent_at=options["kill_agent_at"],
        kill_agent_at_batch=options["kill_agent_at_batch"],
        pause_at=options["pause_at"], pause_at_batch=options["pause_at_batch"],
        pause_for=options["pause_for"],
        kill_agents=tuple(a.strip() for a in options["kill_agent"].split(",") if a.strip()))


def _split_options(options: dict[str, Any]) -> SplitDemoOptions:
    return SplitDemoOptions(
        host=options["host"], port=options["port"], model=options["model"] or "mlp",
        dataset=options["dataset"] or "digits", batch_size=options["batch_size"],
        clients=options["clients"], helpers=options["helpers"], sigma1=options["sigma1"],
        sigma2=options["sigma2"],
        batches=20 if options["batches"] is None else options["batches"],
        rounds=options["rounds"], shard_split=options["shard_split"],
        algorithms=_methods(options, SPLIT_METHODS), plan=options["plan"] or "best",
        time_limit_s=options["time_limit"], slot_ms=options["slot_ms"], lr=options["lr"],
        momentum=options["momentum"], headless=options["headless"],
        kill_agents=tuple(a.strip() for a in options["kill_agent"].split(",") if a.strip()),
        kill_agent_at_batch=options["kill_agent_at_batch"])


def _pipelearn_options(options: dict[str, Any]) -> PipelearnDemoOptions:
    return PipelearnDemoOptions(
        host=options["host"], port=options["port"], model=options["model"] or "mlp",
        dataset=options["dataset"] or "digits", batch_size=options["batch_size"],
        devices=options["devices"],
        batches=10 if options["batches"] is None else options["batches"],
        epochs=options["epochs"], method=options["method"],
        shard_split=options["shard_split"], lr=options["lr"], momentum=options["momentum"],
        headless=options["headless"],
        kill_agents=tuple(a.strip() for a in options["kill_agent"].split(",") if a.strip()),
        kill_agent_at_batch=options["kill_agent_at_batch"])


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def _batches(text: str) -> int:
    """A whole number of batches (run_demo says which a run may take)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of batches, got {text!r}"
                                         ) from None


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
