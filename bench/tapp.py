"""Benchmark of TAPP, the reinforcement-learning planner: how close its plans get to the exact
optimum, against the baselines of the paper, and how long its policy trains.

    .venv/bin/python bench/tapp.py            # testbed (3 seeds) + 8 random instances
    .venv/bin/python bench/tapp.py --quick    # testbed (1 seed) + 3 random instances

Sections (each a table; the last line printed is one JSON object with the headline figures):

1. the ResNet-101 testbed of data/profiles: TAPP's period (default episodes, per seed) against
   ``optimal``, ``pipetorch``, ``bsp`` and the best single device, and its training seconds;
2. random heterogeneous edge instances (bench/planners.py's generator): the same figures.

Every period is the cost model's; ``inf`` marks a plan that does not fit in memory. Training
time is wall-clock on this machine, single-threaded, whatever else is running.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.planners import random_instance  # noqa: E402
from orchestrator.cost import CostModel, build_cost_model, evaluate  # noqa: E402
from orchestrator.errors import PlanningError  # noqa: E402
from orchestrator.formats import load_devices, load_profile  # noqa: E402
from orchestrator.partition import run_planner  # noqa: E402
from orchestrator.partition.common import to_stages  # noqa: E402
from orchestrator.planformat import Stage  # noqa: E402
from orchestrator.tapp import DEFAULT_EPISODES, train_tapp  # noqa: E402

BASELINES = ("optimal", "pipetorch", "bsp")


def feasible_period(cm: CostModel, stages: tuple[Stage, ...]) -> float:
    predicted = evaluate(cm, stages)
    return predicted.period_s if predicted.memory_ok else math.inf


def baseline_periods(cm: CostModel) -> dict[str, float]:
    """The baselines' periods (inf: no plan, or one that does not fit) and the best single
    device's."""
    out: dict[str, float] = {}
    for name in BASELINES:
        try:
            out[name] = feasible_period(cm, run_planner(cm, name).stages)
        except PlanningError:
            out[name] = math.inf
    out["single"] = min(feasible_period(cm, (Stage(layers=(0, cm.num_layers - 1),
                                                   devices=(d,)),))
                        for d in cm.devices.ids)
    return out


def tapp_row(cm: CostModel, *, seed: int, episodes: int) -> dict[str, float]:
    result = train_tapp(cm, episodes=episodes, seed=seed)
    row = baseline_periods(cm)
    row["tapp"] = feasible_period(cm, to_stages(cm, result.best))
    row["train_s"] = result.train_s
    row["seed"] = seed
    return row


def print_rows(title: str, rows: list[dict[str, float]]) -> None:
    print(f"\n{title}")
    print(f"{'case':>6} {'seed':>4} {'tapp_s':>9} {'optimal_s':>9} {'vs opt':>7} "
          f"{'pipetorch':>9} {'bsp':>9} {'single':>9} {'train_s':>7}")
    for i, r in enumerate(rows):
        ratio = r["tapp"] / r["optimal"] if math.isfinite(r["optimal"]) else math.nan
        print(f"{i:>6} {int(r['seed']):>4} {r['tapp']:>9.4f} {r['optimal']:>9.4f} "
              f"{ratio:>6.3f}x {r['pipetorch']:>9.4f} {r['bsp']:>9.4f} {r['single']:>9.4f} "
              f"{r['train_s']:>7.1f}")


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    ratios = [r["tapp"] / r["optimal"] for r in rows if math.isfinite(r["optimal"])]
    return {
        "cases": len(rows),
        "mean_vs_optimal": statistics.mean(ratios) if ratios else math.nan,
        "max_vs_optimal": max(ratios) if ratios else math.nan,
        "within_5pct": sum(x <= 1.05 + 1e-9 for x in ratios),
        "beats_pipetorch": sum(r["tapp"] < r["pipetorch"] for r in rows),
        "beats_bsp": sum(r["tapp"] < r["bsp"] for r in rows),
        "beats_single": sum(r["tapp"] <= r["single"] for r in rows),
        "max_train_s": max(r["train_s"] for r in rows),
        "mean_train_s": statistics.mean(r["train_s"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller samples")
    parser.add_argument("--seed", type=int, default=2026, help="random instances' seed")
    parser.add_argument("--episodes", type=int, default=DEFAULT_EPISODES)
    args = parser.parse_args()
    cm = build_cost_model(load_profile(ROOT / "data/profiles/resnet101_cifar10.model.json"),
                          load_devices(ROOT / "data/profiles/resnet101_cifar10.devices.json"))
    seeds = [0] if args.quick else [0, 1, 2]
    testbed = [tapp_row(cm, seed=s, episodes=args.episodes)
               for s in tqdm(seeds, desc="testbed seeds", file=sys.stderr)]
    print_rows("1. ResNet-101 testbed (5 devices, 37 layers), periods in s", testbed)
    rng = random.Random(args.seed)
    count = 3 if args.quick else 8
    randoms = []
    for i in tqdm(range(count), desc="random instances", file=sys.stderr):
        instance = random_instance(rng, layers=rng.randint(12, 40), devices=rng.randint(3, 6))
        randoms.append(tapp_row(instance, seed=i, episodes=args.episodes))
    print_rows(f"2. Random edge instances ({count}; 12-40 layers, 3-6 devices)", randoms)
    print()
    print(json.dumps({"bench": "tapp", "episodes": args.episodes,
                      "testbed": summary(testbed), "random": summary(randoms),
                      "testbed_rows": testbed, "random_rows": randoms}))


if __name__ == "__main__":
    main()
