"""Benchmark of FTPipeHD's weight aggregation: the same asynchronous pipeline trained with and
without it, and the held-out accuracy of what each trained.

    .venv/bin/python bench/aggregation.py [--model mlp] [--dataset digits] [--stages 4]
                                          [--every 1,2,4] [--seeds 3] [--epochs N] [--quick]

FTPipeHD (section III-C) observes that stage i of an n-stage asynchronous 1F1B pipeline trains
n - i weight versions at once (the micro-batches it has in flight) and, every interval that is
a multiple of n - i updates, replaces its weights by the average of its last n - i versions; on
MobileNetV2/CIFAR-10 (300 epochs, batches of 256) it reports 82.38% validation accuracy with
aggregation against 80.78% without (+1.6 points). Here the agent's own stage executors train:
the model from the zoo (default the MLP on scikit-learn's digits) cut uniformly into
``--stages`` stages, one StageExecutor per stage, each on its own thread with its own module
and its own ZeroMQ data plane on 127.0.0.1, under 1F1B with PipeDream's in-flight depths
(stage k keeps S - k micro-batches in flight), weight stashing and vertical sync (the run
default), SGD with momentum 0.9 and lr 0.01 (with lr 0.05 the MLP's 4-stage pipeline, every
forward 3 updates stale, diverged to near chance, 9-19% held out, with and without
aggregation; at 0.01 it trains stably: 20 epochs reach a training loss of 0.01-0.05 and
91-93% held out, 30 epochs about the same). Stage 0 reads ``--epochs`` epochs of the training
part (agent/data.py: a fresh permutation each epoch, from the seed); afterwards the stages' trained
layers, composed into the whole model, are evaluated on the held-out part (the last 20% of the
digits; eval mode, so batch norm uses its running statistics).

Configurations: aggregation off, and ``StageSpec(aggregate_every=K)`` for each K of ``--every``
(stage k averages its last S - k versions every K x (S - k) updates; the last stage, one
version, never does). Each seed (the model's initialisation and the data order, the same for
every configuration) trains every configuration, the order rotated from seed to seed, so that
the machine's noise (wall time only: training is deterministic) falls on each alike; an
untimed warm-up pipeline of a few micro-batches runs first. Prints a table (held-out accuracy:
mean and min-max over the seeds, and the paired difference from the same seed without
aggregation; the training loss of the last epoch; wall time per run) and, last, one JSON line
with every run's figures. Progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402  (after the path above, like the project's imports)
from torch import nn  # noqa: E402
from tqdm import tqdm  # noqa: E402

from agent.data import DATASETS, Dataset, load_dataset  # noqa: E402
from agent.executor import Clock, Metric, StageExecutor, StageResult  # noqa: E402
from agent.transport import DataPlane  # noqa: E402
from agent.zoo import MODELS, build_model  # noqa: E402
from orchestrator.partition.baselines import uniform_cuts  # noqa: E402
from orchestrator.protocol import StageSpec  # noqa: E402

# FTPipeHD's experiment: validation accuracy with and without weight aggregation
PAPER: dict[str, Any] = {"model": "mobilenetv2", "dataset": "CIFAR-10", "with": 0.8238,
                         "without": 0.8078}
DEFAULTS: dict[str, Any] = {"epochs": 20, "seeds": 3, "every": "1,2,4", "batch_size": 16,
                            "lr": 0.01, "momentum": 0.9}
QUICK: dict[str, Any] = {"epochs": 6, "seeds": 2}


@dataclass
class Run:
    """One training run: the trained (composed) model and what it measured."""

    aggregate_every: int
    seed: int
    model: nn.Module
    cuts: list[tuple[int, int]]  # each stage's layers
    results: list[StageResult]
    losses: list[float]  # the last stage's training loss, by micro-batch
    wall_s: float
    accuracy: float = 0.0  # held out
    held_out_loss: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)


def label(every: int) -> str:
    return "off" if every == 0 else f"every {every}"


def train(dataset: Dataset, *, model: str = "mlp", stages: int = 4, epochs: float = 1.0,
          batch_size: int = 16, lr: float = 0.05, momentum: float = 0.9, seed: int = 0,
          aggregate_every: int = 0, vertical_sync: bool = True,
          microbatches: int | None = None, threads: int = 1) -> Run:
    """Train ``model`` on ``dataset`` over ``stages`` uniform stages, one StageExecutor per
    stage on its own thread and data plane, ``epochs`` epochs of the training part (or
    ``microbatches``), and evaluate the composed model on the held-out part. Each stage's
    thread sets torch's ``threads`` itself, as the agent's worker threads do (runtime.spawn):
    a thread that does not runs its matrix products on an OpenMP team of every core (here the
    MLP's first stage then took 6 ms a forward instead of 0.1, and runs without aggregation,
    which never ran an op that sets it up, took 2-4x as long as runs with it)."""
    zoo = build_model(model, input_shape=dataset.input_shape, num_classes=dataset.num_classes,
                      seed=seed)
    if not 1 <= stages <= zoo.num_layers:
        raise ValueError(f"{model} has {zoo.num_layers} layers: use 1 to {zoo.num_layers} "
                         f"stages, not {stages}")
    cuts = uniform_cuts(zoo.num_layers, stages)
    per_epoch = len(dataset.y_train) // batch_size
    count = microbatches or max(1, round(epochs * per_epoch))
    devices = [f"s{k}" for k in range(stages)]
    # each stage's module, built here: the stages' layers are the zoo model's, so the whole
    # model composed afterwards holds what they trained
    modules = [zoo.stage(*cut) for cut in cuts]
    planes = [DataPlane(bind="tcp://127.0.0.1:0") for _ in devices]
    for k, plane in enumerate(planes):
        for j, peer in enumerate(planes):
            if j != k:
                plane.connect(devices[j], peer.address, peer.public_key)
    clock = Clock(started_at=time.time())
    metrics: list[Metric] = []
    results: list[StageResult | None] = [None] * stages
    errors: list[BaseException] = []
    stop = threading.Event()

    def run(k: int) -> None:
        spec = StageSpec(
            run=1, device=devices[k], stage=k, layers=cuts[k], model=model,
            dataset=dataset.name, batch_size=batch_size, schedule="1f1b",
            stage_devices=tuple((d,) for d in devices),
            stage_times_s=tuple((1.0,) for _ in devices), microbatches=count,
            inflight=tuple(stages - j for j in range(stages)), lr=lr, momentum=momentum,
            seed=seed, vertical_sync=vertical_sync, aggregate_every=aggregate_every,
            receive_timeout_s=60)
        try:
            torch.set_num_threads(threads)
            executor = StageExecutor(spec, module=modules[k], plane=planes[k], clock=clock,
                                     dataset=dataset if k == 0 else None, stop=stop,
                                     on_metric=metrics.append if k == stages - 1 else None)
            results[k] = executor.run()
        except BaseException as exc:  # raised below, once every stage has ended
            errors.append(exc)
            stop.set()

    workers = [threading.Thread(target=run, args=(k,), name=f"stage-{k}")
               for k in range(stages)]
    began = time.perf_counter()
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        for plane in planes:
            plane.close()
    wall_s = time.perf_counter() - began
    if errors:
        raise RuntimeError(f"the pipeline failed: {errors[0]!r}") from errors[0]
    losses = [m.value for m in sorted(metrics, key=lambda m: m.microbatch) if m.name == "loss"]
    trained = Run(aggregate_every=aggregate_every, seed=seed, model=zoo.full(), cuts=cuts,
                  results=[r for r in results if r is not None], losses=losses, wall_s=wall_s)
    trained.accuracy, trained.held_out_loss = evaluate(trained.model, dataset)
    last_epoch = losses[-min(per_epoch, len(losses)):]
    trained.figures = {
        "aggregate_every": aggregate_every, "seed": seed, "accuracy": trained.accuracy,
        "held_out_loss": trained.held_out_loss, "train_loss": mean(last_epoch),
        "wall_s": wall_s, "microbatches": count,
        "aggregations": [len(r.aggregated) for r in trained.results]}
    return trained


@torch.no_grad()
def evaluate(model: nn.Module, dataset: Dataset) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of ``model`` on the held-out part (eval mode)."""
    x, y = dataset.test_set()
    was_training = model.training
    model.eval()
    try:
        logits = model(x)
    finally:
        model.train(was_training)
    accuracy = (logits.argmax(dim=1) == y).float().mean().item()
    return accuracy, nn.functional.cross_entropy(logits, y).item()


def summarize(runs: Sequence[Run], configs: Sequence[int]) -> list[dict[str, Any]]:
    """Per configuration: held-out accuracy (mean, min, max), training loss and wall time."""
    base = {r.seed: r.accuracy for r in runs if r.aggregate_every == 0}
    out = []
    for every in configs:
        mine = [r for r in runs if r.aggregate_every == every]
        accuracies = [r.accuracy for r in mine]
        deltas = [r.accuracy - base[r.seed] for r in mine if r.seed in base]
        out.append({
            "config": label(every), "aggregate_every": every, "runs": len(mine),
            "accuracy_mean": mean(accuracies), "accuracy_min": min(accuracies),
            "accuracy_max": max(accuracies),
            "held_out_loss_mean": mean(r.held_out_loss for r in mine),
            "train_loss_mean": mean(r.figures["train_loss"] for r in mine),
            "wall_s_mean": mean(r.wall_s for r in mine),
            # the same seed's run without aggregation: a paired difference, in points
            "delta_points_mean": None if not deltas else 100 * mean(deltas),
            "delta_points_min": None if not deltas else 100 * min(deltas),
            "delta_points_max": None if not deltas else 100 * max(deltas)})
    return out


HEADER = (f"{'configuration':<14} {'held-out acc (mean, min-max)':<30} "
          f"{'vs off, points (mean, min..max)':<32} {'train loss':>10} {'wall s':>7}")


def table_row(row: dict[str, Any]) -> str:
    accuracy = (f"{100 * row['accuracy_mean']:6.2f}%  ({100 * row['accuracy_min']:.2f}-"
                f"{100 * row['accuracy_max']:.2f})")
    delta = ("-" if row["aggregate_every"] == 0 or row["delta_points_mean"] is None else
             f"{row['delta_points_mean']:+6.2f}  ({row['delta_points_min']:+.2f}.."
             f"{row['delta_points_max']:+.2f})")
    return (f"{row['config']:<14} {accuracy:<30} {delta:<32} {row['train_loss_mean']:>10.4f} "
            f"{row['wall_s_mean']:>7.1f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join((__doc__ or "").split("\n\n")[2:]))
    parser.add_argument("--model", default="mlp", choices=MODELS, help="(default mlp)")
    parser.add_argument("--dataset", default="digits", choices=DATASETS,
                        help="(default digits; vgg5 wants synthetic-cifar)")
    parser.add_argument("--stages", type=int, default=4, help="uniform cuts (default 4)")
    parser.add_argument("--every", default=None,
                        help=f"comma-separated aggregate_every values compared with off "
                             f"(default {DEFAULTS['every']})")
    parser.add_argument("--seeds", type=int, default=None,
                        help=f"seeds 0..N-1, each training every configuration (default "
                             f"{DEFAULTS['seeds']}; --quick {QUICK['seeds']})")
    parser.add_argument("--epochs", type=float, default=None,
                        help=f"over the training part (default {DEFAULTS['epochs']}; --quick "
                             f"{QUICK['epochs']})")
    parser.add_argument("--microbatches", type=int, default=None,
                        help="micro-batches per run, instead of --epochs")
    parser.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"],
                        help=f"samples per micro-batch (default {DEFAULTS['batch_size']})")
    parser.add_argument("--lr", type=float, default=DEFAULTS["lr"],
                        help=f"(default {DEFAULTS['lr']:g})")
    parser.add_argument("--momentum", type=float, default=DEFAULTS["momentum"],
                        help=f"(default {DEFAULTS['momentum']:g})")
    parser.add_argument("--no-vertical-sync", dest="vertical_sync", action="store_false",
                        help="each stage forwards on its own latest weights (default: vertical "
                             "sync on, the run default)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: {QUICK['seeds']} seeds, {QUICK['epochs']} epochs")
    args = parser.parse_args(argv)
    preset = {**DEFAULTS, **(QUICK if args.quick else {})}
    seeds = args.seeds if args.seeds is not None else int(preset["seeds"])
    epochs = args.epochs if args.epochs is not None else float(preset["epochs"])
    try:
        every = sorted({int(e) for e in (args.every or str(preset["every"])).split(",") if e})
    except ValueError:
        parser.error("--every: comma-separated integers")
    if any(e < 1 for e in every) or seeds < 1 or epochs <= 0 or args.stages < 1 or (
            args.microbatches is not None and args.microbatches < 1):
        parser.error("--every values, --seeds, --epochs, --microbatches and --stages must be "
                     "positive")
    configs = [0, *every]
    dataset = load_dataset(args.dataset)
    if not 1 <= args.batch_size <= len(dataset.y_train):
        parser.error(f"--batch-size: 1 to the {len(dataset.y_train)} training samples")
    per_epoch = len(dataset.y_train) // args.batch_size
    microbatches = args.microbatches or max(1, round(epochs * per_epoch))
    epochs = microbatches / per_epoch
    settings = {"model": args.model, "dataset": args.dataset, "stages": args.stages,
                "epochs": round(epochs, 3), "batch_size": args.batch_size, "lr": args.lr,
                "momentum": args.momentum, "vertical_sync": args.vertical_sync}
    threads = torch.get_num_threads()  # the stages' threads set theirs (train)
    runs: list[Run] = []
    began = time.monotonic()
    try:
        # a few untimed micro-batches first: the process's first pipeline pays for torch's
        # and ZeroMQ's start-up (twice a run's wall time on the quick run's first run)
        train(dataset, model=args.model, stages=args.stages, batch_size=args.batch_size,
              lr=args.lr, momentum=args.momentum, microbatches=4 * args.stages,
              vertical_sync=args.vertical_sync)
        with tqdm(total=seeds * len(configs), desc="runs", file=sys.stderr) as bar:
            for seed in range(seeds):
                shift = seed % len(configs)
                for every_k in configs[shift:] + configs[:shift]:
                    bar.set_postfix_str(f"seed {seed}, {label(every_k)}")
                    run = train(dataset, model=args.model, stages=args.stages,
                                batch_size=args.batch_size, lr=args.lr,
                                momentum=args.momentum, seed=seed, aggregate_every=every_k,
                                vertical_sync=args.vertical_sync, microbatches=microbatches)
                    runs.append(run)
                    bar.write(f"seed {seed}, {label(every_k)}: held-out accuracy "
                              f"{100 * run.accuracy:.2f}%, {run.wall_s:.1f} s", file=sys.stderr)
                    bar.update()
    finally:
        torch.set_num_threads(threads)
    took = time.monotonic() - began
    rows = summarize(runs, configs)
    cuts = runs[0].cuts
    print(f"\n{args.model} on {args.dataset} ({len(dataset.y_train)} training, "
          f"{len(dataset.y_test)} held out), {args.stages} stages {cuts}, 1F1B with in-flight "
          f"depths {[args.stages - k for k in range(args.stages)]}, vertical sync "
          f"{'on' if args.vertical_sync else 'off'}, SGD lr {args.lr:g} momentum "
          f"{args.momentum:g}; {microbatches} micro-batches of {args.batch_size} "
          f"({epochs:.3g} epochs) a run, seeds 0..{seeds - 1}. Held-out "
          f"accuracy of the composed model; vs off = the same seed's difference; train loss = "
          f"the last epoch's mean; wall s = per run.")
    print(HEADER)
    print("-" * len(HEADER))
    for row in rows:
        print(table_row(row))
    print(f"(FTPipeHD, {PAPER['model']} on {PAPER['dataset']}: "
          f"{100 * PAPER['with']:.2f}% with, {100 * PAPER['without']:.2f}% without, "
          f"{100 * (PAPER['with'] - PAPER['without']):+.2f} points; {took:.0f} s in all)")
    print(json.dumps({
        "bench": "aggregation", **settings, "cuts": cuts,
        "microbatches": microbatches, "seeds": list(range(seeds)),
        "configs": rows, "paper": PAPER, "seconds": round(took, 1),
        "runs": [r.figures for r in runs]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
