"""Benchmark of the pipeline planners: how close each gets to the optimum, and how long it takes.

    .venv/bin/python bench/planners.py            # full run (a few minutes)
    .venv/bin/python bench/planners.py --quick    # smaller sample (under a minute)

Sections (each a table; the last line printed is one JSON object with the headline figures):

1. the ResNet-101 testbed of data/profiles: every planner's period, its ratio to ``optimal``,
   memory, planning time, and the simulated 1F1B throughput against the prediction;
2. random heterogeneous instances: each planner's period relative to the exact optimum
   (among plans that fit in memory) and its planning time (the learned ``tapp`` has its own
   benchmark, bench/tapp.py);
3. ``optimal``'s exact search time against the device count at 128 layers (target: 8 devices
   in at most 2 s), and the gap of its heuristic to its proven lower bound beyond that;
4. Duan-Wu grouping: local search (Algorithm 2) and the sorting baseline against brute force,
   on sets of up to 10 devices.

All ratios are measured side by side in one run on the same instances.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.cost import CostModel, build_cost_model  # noqa: E402
from orchestrator.errors import PlanningError  # noqa: E402
from orchestrator.formats import (  # noqa: E402
    Device,
    DeviceSet,
    Layer,
    LayerTimes,
    ModelProfile,
    load_devices,
    load_profile,
)
from orchestrator.grouping import (  # noqa: E402
    group_brute_force,
    group_local_search,
    group_sorting,
)
from orchestrator.partition import QUICK_PLANNERS, run_planner  # noqa: E402
from orchestrator.partition.duanwu import partition_overflow, partition_period  # noqa: E402
from orchestrator.partition.optimal import plan_optimal  # noqa: E402
from orchestrator.simulator import simulate  # noqa: E402


def random_instance(rng: random.Random, *, layers: int, devices: int) -> CostModel:
    """A heterogeneous edge testbed: speeds over two orders of magnitude, Wi-Fi to Ethernet
    links, a third of the devices with their own measured layer times, memory that binds."""
    times = [(rng.uniform(0.001, 0.02), rng.uniform(0.002, 0.04)) for _ in range(layers)]
    profile = ModelProfile(model="random", batch_size=32, reference="ref", layers=tuple(
        Layer(f"l{i}", "layer", f, b, rng.randint(10_000, 2_000_000),
              rng.randint(0, 4_000_000), rng.randint(10_000, 2_000_000))
        for i, (f, b) in enumerate(times)))
    total = sum(la.param_bytes + la.activation_bytes for la in profile.layers)
    devs = []
    for i in range(devices):
        speed = rng.choice([0.02, 0.1, 0.3, 0.5, 1.0, 1.6])
        measured = None
        if rng.random() < 0.33:
            measured = LayerTimes(
                forward_s=tuple(f / speed * rng.uniform(0.6, 1.6) for f, _ in times),
                backward_s=tuple(b / speed * rng.uniform(0.6, 1.6) for _, b in times))
        devs.append(Device(id=f"d{i}", speed=speed,
                           memory_bytes=int(total * rng.uniform(0.5, 4.0)),
                           bandwidth_bps=rng.choice([2.5e6, 6.25e6, 12.5e6, 125e6]),
                           latency_s=rng.choice([0.001, 0.002, 0.005]), layer_times=measured))
    return build_cost_model(profile, DeviceSet(devices=tuple(devs)))


def testbed_section() -> dict[str, dict[str, float]]:
    profile = load_profile(ROOT / "data/profiles/resnet101_cifar10.model.json")
    devices = load_devices(ROOT / "data/profiles/resnet101_cifar10.devices.json")
    cm = build_cost_model(profile, devices)
    plans = {name: run_planner(cm, name) for name in QUICK_PLANNERS}
    best = plans["optimal"].predicted
    assert best is not None
    print("\n1. ResNet-101 testbed (5 devices, 37 layers)")
    print(f"{'algorithm':10} {'stages':>6} {'period_s':>9} {'vs opt':>7} {'memory':>6} "
          f"{'planner_ms':>10} {'sim/pred':>8}")
    out = {}
    for name, plan in plans.items():
        p = plan.predicted
        assert p is not None
        sim = simulate(cm, plan, microbatches=256, schedule="1f1b")
        ratio = p.period_s / best.period_s
        out[name] = {"period_s": p.period_s, "vs_optimal": ratio, "planner_s": plan.planner_s,
                     "sim_over_predicted": sim.throughput_sps / p.throughput_sps}
        print(f"{name:10} {len(plan.stages):>6} {p.period_s:>9.4f} {ratio:>6.2f}x "
              f"{'ok' if p.memory_ok else 'NO':>6} {plan.planner_s * 1e3:>10.2f} "
              f"{sim.throughput_sps / p.throughput_sps:>8.3f}")
    return out


def random_section(count: int, seed: int) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    ratios: dict[str, list[float]] = {name: [] for name in QUICK_PLANNERS}
    infeasible: dict[str, int] = {name: 0 for name in QUICK_PLANNERS}
    seconds: dict[str, list[float]] = {name: [] for name in QUICK_PLANNERS}
    used = 0
    for _ in tqdm(range(count), desc="random instances", file=sys.stderr):
        cm = random_instance(rng, layers=rng.randint(12, 64), devices=rng.randint(3, 8))
        try:
            optimum = plan_optimal(cm).predicted
        except PlanningError:
            continue
        assert optimum is not None
        used += 1
        for name in QUICK_PLANNERS:
            try:
                plan = run_planner(cm, name)
            except PlanningError:
                infeasible[name] += 1
                continue
            assert plan.predicted is not None
            seconds[name].append(plan.planner_s)
            if plan.predicted.memory_ok:
                ratios[name].append(plan.predicted.period_s / optimum.period_s)
            else:
                infeasible[name] += 1
    print(f"\n2. Random instances ({used} with a feasible plan; 12-64 layers, 3-8 devices)")
    print(f"{'algorithm':10} {'mean':>7} {'median':>7} {'max':>8} {'no plan':>8} "
          f"{'planner_ms':>10}")
    out = {}
    for name in QUICK_PLANNERS:
        r = ratios[name]
        if not r:
            continue
        out[name] = {"mean_vs_optimal": statistics.mean(r),
                     "median_vs_optimal": statistics.median(r), "max_vs_optimal": max(r),
                     "no_plan_fraction": infeasible[name] / used,
                     "mean_planner_s": statistics.mean(seconds[name])}
        print(f"{name:10} {statistics.mean(r):>6.2f}x {statistics.median(r):>6.2f}x "
              f"{max(r):>7.2f}x {infeasible[name] / used:>8.0%} "
              f"{statistics.mean(seconds[name]) * 1e3:>10.2f}")
    return out


def scaling_section(device_counts: list[int], seed: int) -> dict[str, float]:
    print("\n3. optimal at 128 layers: exact search time, and the heuristic beyond it")
    print(f"{'devices':>7} {'mode':>9} {'planner_s':>10} {'period_s':>9} {'bound gap':>9}")
    out = {}
    for n in device_counts:
        rng = random.Random(seed + n)
        cm = random_instance(rng, layers=128, devices=n)
        timings = []
        for _ in range(3):
            try:
                plan = plan_optimal(cm, exact_max_devices=max(12, n) if n <= 12 else 12)
            except PlanningError:
                break
            timings.append(plan.planner_s)
        if not timings:
            print(f"{n:>7} no plan fits")
            continue
        assert plan.bound is not None and plan.predicted is not None
        gap = plan.predicted.period_s / plan.bound.lower_bound_s - 1
        mode = "exact" if plan.bound.exact else "heuristic"
        out[f"{n}_devices_s"] = statistics.median(timings)
        if not plan.bound.exact:
            out[f"{n}_devices_bound_gap"] = gap
        print(f"{n:>7} {mode:>9} {statistics.median(timings):>10.3f} "
              f"{plan.predicted.period_s:>9.4f} {gap:>8.1%}")
    return out


def grouping_section(count: int, max_devices: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    local, sorting, sorting_infeasible = [], [], 0
    local_s, brute_s = [], []
    for _ in tqdm(range(count), desc="grouping vs brute force", file=sys.stderr):
        n = rng.randint(4, max_devices)
        q = rng.randint(2, min(4, n - 1))
        cm = random_instance(rng, layers=rng.randint(max(q, 16), 40), devices=n)

        def objective(groups: list[list[int]], cm: CostModel = cm) -> float:
            return partition_period(cm, groups)

        started = time.perf_counter()
        best = objective(group_brute_force(n, q, objective=objective))
        brute_s.append(time.perf_counter() - started)
        if math.isinf(best):
            continue
        speeds = [d.speed for d in cm.devices.devices]
        started = time.perf_counter()
        found = objective(group_local_search(
            n, q, objective=objective, speeds=speeds,
            overflow=lambda g, cm=cm: partition_overflow(cm, g)))
        local_s.append(time.perf_counter() - started)
        local.append(found / best - 1)
        baseline = objective(group_sorting(n, q, speeds=speeds))
        if math.isinf(baseline):
            sorting_infeasible += 1
        else:
            sorting.append(baseline / best - 1)
    print(f"\n4. Duan-Wu grouping against brute force ({len(local)} sets of 4-{max_devices} "
          "devices, 2-4 groups)")
    print(f"{'method':13} {'mean gap':>9} {'max gap':>8} {'at optimum':>10} {'no plan':>8} "
          f"{'seconds':>8}")
    print(f"{'local search':13} {statistics.mean(local):>9.2%} {max(local):>8.2%} "
          f"{sum(g < 1e-9 for g in local) / len(local):>10.0%} {0:>8} "
          f"{statistics.mean(local_s):>8.3f}")
    print(f"{'sorting':13} {statistics.mean(sorting):>9.2%} {max(sorting):>8.2%} "
          f"{sum(g < 1e-9 for g in sorting) / len(local):>10.0%} "
          f"{sorting_infeasible:>8} {'':>8}")
    print(f"{'brute force':13} {'':>9} {'':>8} {'':>10} {'':>8} {statistics.mean(brute_s):>8.3f}")
    return {"local_search_mean_gap": statistics.mean(local),
            "local_search_max_gap": max(local),
            "sorting_mean_gap": statistics.mean(sorting),
            "sorting_no_plan": sorting_infeasible, "sets": len(local),
            "local_search_mean_s": statistics.mean(local_s),
            "brute_force_mean_s": statistics.mean(brute_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller samples")
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    summary = {
        "bench": "planners",
        "testbed": testbed_section(),
        "random": random_section(12 if args.quick else 60, args.seed),
        "optimal_scaling": scaling_section([4, 6, 8] if args.quick else [4, 6, 8, 10, 12, 16, 24],
                                           args.seed),
        "grouping": grouping_section(8 if args.quick else 40, 7 if args.quick else 10,
                                     args.seed),
    }
    print()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
