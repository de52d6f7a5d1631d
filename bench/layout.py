"""Which memory format each zoo model's convolutions train faster in on this machine
(agent/layout.py: the choice an agent makes for each stage it runs).

    .venv/bin/python bench/layout.py [--models vgg5,resnet18,mobilenetv2,alexnet]
                                     [--datasets digits,synthetic-cifar] [--rounds 5]

For each model and data set: a forward and backward (every parameter's gradient) of the whole
model on a micro-batch of 32, with its 4-D weights NCHW and channels last, one torch thread,
the two alternating ``--rounds`` times after a warm-up pass of each; the fastest pass of
each, their ratio, and what ``agent.layout.faster_format`` picks when asked afterwards (its
own timing, so on a noisy machine it may disagree with a ratio near 1). Prints a table and,
last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.peer import parse_list  # noqa: E402  (the path above makes it importable)

MODELS = ("vgg5", "resnet18", "mobilenetv2", "alexnet")
DATASETS = ("digits", "synthetic-cifar")
BATCH_SIZE = 32


def timed(model: str, dataset: str, rounds: int) -> dict[str, Any]:
    import torch

    from agent.data import load_dataset
    from agent.layout import FORMATS, faster_format, to_format
    from agent.zoo import build_model

    data = load_dataset(dataset, seed=0)
    module = build_model(model, input_shape=data.input_shape, num_classes=data.num_classes,
                         seed=0).full().train()
    x = data.microbatch(0, BATCH_SIZE, seed=0)[0]
    params = [p for p in module.parameters() if p.requires_grad]

    def one_pass() -> float:
        began = time.perf_counter()
        out = module(x)
        torch.autograd.grad(out.sum(), params)
        return time.perf_counter() - began

    fastest = dict.fromkeys(FORMATS, float("inf"))
    for name in FORMATS:
        to_format(module, name)
        one_pass()  # warm-up
    for _ in range(rounds):
        for name in FORMATS:
            to_format(module, name)
            fastest[name] = min(fastest[name], one_pass())
    to_format(module, "contiguous")
    return {"model": model, "dataset": dataset, "nchw_ms": 1e3 * fastest["contiguous"],
            "channels_last_ms": 1e3 * fastest["channels_last"],
            "ratio": fastest["channels_last"] / fastest["contiguous"],
            "picked": faster_format(module, x)}


def table(rows: Sequence[dict[str, Any]]) -> str:
    header = (f"{'model':12} {'data set':16} {'NCHW ms':>9} {'ch. last ms':>11} "
              f"{'ratio':>6} picked")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['model']:12} {r['dataset']:16} {r['nchw_ms']:>9.2f} "
                     f"{r['channels_last_ms']:>11.2f} {r['ratio']:>6.2f} {r['picked']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"zoo models with convolutions (default {','.join(MODELS)})")
    parser.add_argument("--datasets", default=",".join(DATASETS),
                        help=f"data sets (default {','.join(DATASETS)})")
    parser.add_argument("--rounds", type=int, default=5,
                        help="timed passes of each layout, alternating (default 5)")
    args = parser.parse_args(argv)
    models = parse_list(args.models, MODELS, "--models")
    datasets = parse_list(args.datasets, DATASETS, "--datasets")
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    rows = []
    for model in models:
        for dataset in datasets:
            rows.append(timed(model, dataset, args.rounds))
            print(f"  {model} on {dataset}: done", file=sys.stderr)
    print(table(rows))
    print(json.dumps({"bench": "layout", "batch_size": BATCH_SIZE, "rounds": args.rounds,
                      "torch": torch.__version__, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
