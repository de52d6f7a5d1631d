"""Benchmark of PipeLearn's planner (orchestrator.pipelearn) on the shared testbed.

Zhang et al., "PipeLearn: Pipeline Parallelism for Collaborative Machine Learning". For VGG5 and
ResNet18 on CIFAR-10 (the estimated profiles of ``bench/make_pipelearn_profiles.py``) and
ResNet-101 (the measured testbed profile), with ``edge-vm`` as the server and the four other
testbed devices as clients, under three networks (4G: 10 Mbit/s up, 25 down; 4G+: 20/40;
WiFi: 50/50), prints per setting: the predicted epoch time of PipeLearn, FL and SFL, PipeLearn's
speedups, the server idle time and network throughput against FL, and the planner's time. Then
the score distribution (time of the exhaustive best / time of the choice, per client) of the
default rule and of the paper's equation 14 alone, on those settings and on random profiles.
The last line is one JSON object with the aggregates; progress goes to stderr.

    .venv/bin/python bench/pipelearn.py              # 300 random profiles
    .venv/bin/python bench/pipelearn.py --random 50
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: the package is not installed
    sys.path.insert(0, str(ROOT))

from orchestrator.formats import (  # noqa: E402
    DeviceSet,
    ModelProfile,
    load_devices,
    load_profile,
    parse_devices,
    parse_profile,
)
from orchestrator.pipelearn import RULES, Rule  # noqa: E402
from orchestrator.pipelearn_plan import (  # noqa: E402
    Setting,
    compare,
    make_setting,
    plan_method,
    score,
)

MBIT = 1e6 / 8
NETWORKS = {"4G": (10, 25), "4G+": (20, 40), "WiFi": (50, 50)}
MODELS = {"vgg5": 100, "resnet18": 100, "resnet101": 32}  # batch size: the paper's, the testbed's
SERVER = "edge-vm"


def with_network(devices: DeviceSet, up_mbit: float, down_mbit: float) -> DeviceSet:
    """The clients' links to the server set to the given uplink and downlink."""
    return replace(devices, devices=tuple(
        d if d.id == SERVER else replace(d, uplink_bps=up_mbit * MBIT,
                                         downlink_bps=down_mbit * MBIT)
        for d in devices.devices))


def scores(setting: Setting) -> dict[str, list[float]]:
    """Per rule, each client's score against the exhaustive best."""
    best = plan_method(setting, "pipelearn", exhaustive=True)
    out: dict[str, list[float]] = {}
    for rule in RULES:
        chosen = plan_method(setting, "pipelearn", rule=rule)
        out[rule] = [score(chosen=c, best=best.device(c.device)) for c in chosen.devices]
    return out


def shared_row(model: str, network: str) -> dict[str, Any]:
    profile = load_profile(ROOT / "data" / "profiles" / f"{model}_cifar10.model.json")
    devices = with_network(load_devices(ROOT / "data" / "profiles" /
                                        f"{model}_cifar10.devices.json"), *NETWORKS[network])
    setting = make_setting(profile=profile, devices=devices, server=SERVER,
                           batch_size=MODELS[model])
    result = compare(setting)
    started = time.perf_counter()
    plan_method(setting, "pipelearn", exhaustive=True)
    exhaustive_s = time.perf_counter() - started
    p = result.pipelearn
    return {
        "model": model, "network": network, "pipelearn_epoch_s": p.epoch_s,
        "fl_epoch_s": result.fl.epoch_s, "sfl_epoch_s": result.sfl.epoch_s,
        "speedup_fl": result.speedup(result.fl), "speedup_sfl": result.speedup(result.sfl),
        "server_idle_reduction_fl": result.fl.server_idle_s / p.server_idle_s,
        "throughput_increase_fl": p.network_bps / result.fl.network_bps,
        "plans": {d.device: (d.split, d.parallel_batches) for d in p.devices},
        "planner_s": p.planner_s, "exhaustive_s": exhaustive_s, "scores": scores(setting),
    }


def random_setting(rng: random.Random) -> Setting:
    """A random model (2-20 layers) on a random server and 1-4 random clients."""
    layers = rng.randint(2, 20)
    batch = rng.choice([8, 16, 32, 64, 100, 128])
    size = rng.lognormvariate(13, 1.5)
    raw_layers = []
    for i in range(layers):
        size *= rng.lognormvariate(-0.15, 0.5)
        forward = rng.lognormvariate(-4, 1.2)
        raw_layers.append({"name": f"l{i}", "kind": "layer", "forward_s": forward,
                           "backward_s": forward * rng.uniform(1.0, 3.0),
                           "output_bytes": max(1, int(size)),
                           "param_bytes": int(rng.lognormvariate(12, 2)),
                           "activation_bytes": 0})
    profile: ModelProfile = parse_profile({"model": "random", "batch_size": batch,
                                           "reference": SERVER, "layers": raw_layers})
    clients = []
    for k in range(rng.randint(1, 4)):
        speed = rng.lognormvariate(-2.5, 1.5)
        noise = [rng.lognormvariate(0, 0.3) for _ in raw_layers]
        clients.append({
            "id": f"c{k}", "speed": speed, "memory_bytes": 1, "bandwidth_bps": 1e6,
            "uplink_bps": rng.uniform(1, 100) * MBIT, "downlink_bps": rng.uniform(1, 100) * MBIT,
            "latency_s": rng.uniform(0, 0.02),
            "layer_times": {
                "forward_s": [la["forward_s"] / speed * z for la, z in zip(raw_layers, noise,
                                                                            strict=True)],
                "backward_s": [la["backward_s"] / speed * z for la, z in zip(raw_layers, noise,
                                                                              strict=True)]}})
    devices = parse_devices({"devices": [
        {"id": SERVER, "speed": rng.uniform(1, 20), "memory_bytes": 1, "bandwidth_bps": 1e8},
        *clients]})
    return make_setting(profile=profile, devices=devices, server=SERVER, batch_size=batch,
                        server_parallelism=rng.choice([1, 2, 4]))


def distribution(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"n": len(ordered), "min": round(ordered[0], 4),
            "p5": round(ordered[int(0.05 * (len(ordered) - 1))], 4),
            "mean": round(statistics.mean(ordered), 4),
            "at_least_0.98": round(sum(v >= 0.98 for v in ordered) / len(ordered), 4)}


def table(rows: Sequence[dict[str, Any]]) -> str:
    head = (f"{'model':<10} {'net':<5} {'PL epoch_s':>11} {'FL epoch_s':>11} {'SFL epoch_s':>11}"
            f" {'xFL':>6} {'xSFL':>6} {'idle/FL':>8} {'bps xFL':>8} {'plan_ms':>8}"
            f" {'exh_ms':>7} {'min score':>9}  (P,N) per client")
    lines = [head, "-" * len(head)]
    for r in rows:
        plans = " ".join(f"{d}:{p},{n}" for d, (p, n) in r["plans"].items())
        lines.append(
            f"{r['model']:<10} {r['network']:<5} {r['pipelearn_epoch_s']:>11.1f} "
            f"{r['fl_epoch_s']:>11.1f} {r['sfl_epoch_s']:>11.1f} {r['speedup_fl']:>6.2f} "
            f"{r['speedup_sfl']:>6.2f} {r['server_idle_reduction_fl']:>8.2f} "
            f"{r['throughput_increase_fl']:>8.1f} {1e3 * r['planner_s']:>8.2f} "
            f"{1e3 * r['exhaustive_s']:>7.1f} {min(r['scores']['saturated']):>9.4f}  {plans}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--random", type=int, default=300, metavar="N",
                        help="random profiles to score (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random profiles")
    args = parser.parse_args(argv)
    rows = []
    for model in MODELS:
        for network in NETWORKS:
            print(f"{model} {network}", file=sys.stderr)
            rows.append(shared_row(model, network))
    rng = random.Random(args.seed)
    random_scores: dict[str, list[float]] = {rule: [] for rule in RULES}
    planner_times = []
    for i in range(args.random):
        if i % 50 == 0:
            print(f"random profiles {i}/{args.random}", file=sys.stderr)
        setting = random_setting(rng)
        started = time.perf_counter()
        plan_method(setting, "pipelearn")
        planner_times.append((time.perf_counter() - started) / len(setting.clients))
        for rule, values in scores(setting).items():
            random_scores[rule] += values
    print(table(rows))
    shared_scores: dict[Rule, list[float]] = {
        rule: [s for r in rows for s in r["scores"][rule]] for rule in RULES}
    summary: dict[str, Any] = {"score": {}}
    print()
    print(f"{'rule':<10} {'profiles':<8} {'n':>5} {'min':>7} {'p5':>7} {'mean':>7} {'>=0.98':>7}")
    for rule in RULES:
        summary["score"][rule] = {}
        for name, values in (("shared", shared_scores[rule]), ("random", random_scores[rule])):
            if not values:
                continue
            d = distribution(values)
            summary["score"][rule][name] = d
            print(f"{rule:<10} {name:<8} {d['n']:>5} {d['min']:>7.4f} {d['p5']:>7.4f} "
                  f"{d['mean']:>7.4f} {d['at_least_0.98']:>7.2%}")
    summary["speedup"] = {
        f"{r['model']}/{r['network']}": {"fl": round(r["speedup_fl"], 3),
                                         "sfl": round(r["speedup_sfl"], 3)} for r in rows}
    paper = [r for r in rows if r["model"] != "resnet101"]
    for key in ("speedup_fl", "speedup_sfl", "server_idle_reduction_fl",
                "throughput_increase_fl"):
        summary[f"{key}_range_vgg5_resnet18"] = [round(min(r[key] for r in paper), 3),
                                                 round(max(r[key] for r in paper), 3)]
    summary["planner_ms_per_setting"] = {
        "max": round(1e3 * max(r["planner_s"] for r in rows), 3),
        "mean": round(1e3 * statistics.mean(r["planner_s"] for r in rows), 3)}
    summary["exhaustive_ms_per_setting_max"] = round(1e3 * max(r["exhaustive_s"] for r in rows),
                                                     1)
    if planner_times:
        summary["planner_ms_per_client_random"] = {
            "mean": round(1e3 * statistics.mean(planner_times), 3),
            "max": round(1e3 * max(planner_times), 3)}
    print()
    print(json.dumps(summary, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
