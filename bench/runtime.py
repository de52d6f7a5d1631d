"""Benchmark of the pipeline runtime: real agents training real models on this machine.

    .venv/bin/python bench/runtime.py [--batches N] [--models mlp,vgg5] [--batch-size N]
                                     [--no-replication]

Starts the web server, a Celery worker and three agent processes (one emulating a device 4x
slower than the others), then, for each model on scikit-learn's digits, trains one run per plan
(uniform, FTPipeHD, optimal) and one on a fast device alone, and reports each run's measured
steady-state throughput against the simulator's prediction for the same plan and length. Then
the same with the slow agent 10x slower: the heterogeneity-aware plans (FTPipeHD's, which keeps
every device, and the optimal one, which may leave the slow device out) against the uniform one
(FTPipeHD reports 6.8x over PipeDream in that setting). Then, on the 4x testbed, plans that
serve a stage with a group of devices (bsp, duanwu, pipedream): their replicas share gradients
over the data plane (docs/architecture.md, "Replicated stages and two lanes").

The emulated devices share this machine's processors with the server, so every agent runs at
least BASE_SLOWDOWN times slower than the machine (edge devices are slower than it still), so
that three of them do not fight over two cores, as three real devices would not (with the fast
agents at full speed on 2 cores, pipelines reached 0.34-0.58 of the simulator's prediction).
An agent's own Python work per micro-batch (sends, events, checkpoints: 1-3 ms a stage here)
is not slowed down, so it weighs more the shorter the emulated passes: at 4x the three agents
and the server kept 1.5 of the 2 cores busy on the MLP, and its plans measured 0.78-1.12 of
their prediction; at 6x, 0.92-1.15. Each device's fixed costs are measured by the runs
themselves (docs/architecture.md): a testbed's first run of a model is planned with the
agents' probes, later ones with what the earlier runs measured. Runs train with the run
defaults: chain
replicas every 2 batches, global ones every 10 (``--no-replication``: neither), no dynamic
re-partition (the prediction is for the plan the run starts with). Prints a table per testbed
and, last, one JSON line. Runs on the embedded default, in a fresh var directory whose path it
prints (the processes' logs are in its demo/logs/).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.testbed import setup_django  # noqa: E402  (the path above makes it importable)


def train(testbed: Any, spec: int, devices: list[dict[str, Any]], algorithm: str, *,
          batches: int, label: str, replicate: bool) -> dict[str, Any]:
    off = None if replicate else 0
    compared = testbed.plan(spec, devices=devices, algorithms=[algorithm], schedule="1f1b",
                            name=f"bench: {label}", microbatches=8, batches=batches,
                            chain_every=off, global_every=off, repartition_every=0)
    from webapp.demo.scenario import chosen_plan

    row = chosen_plan(compared, algorithm)
    testbed.start(compared["run"], row["plan"])
    summary: dict[str, Any] = testbed.finish(compared["run"])
    if summary["state"] != "finished":
        raise SystemExit(f"{label}: the run ended {summary['state']}: {summary['error']}")
    summary["stages"] = row["stages"]
    from webapp.runs.models import Plan

    document = Plan.objects.get(pk=row["plan"]).document
    summary["two_lanes"] = sorted(document.get("beta") or {})
    summary["groups"] = max(len(st["devices"]) for st in document["stages"])
    return summary


BASE_SLOWDOWN = 6.0
SECTIONS = ("slow4", "slow10", "groups", "lanes")
HYBRID = "cpu=1:0.5,gpu=2:4"  # the hybrid agent's resources: kind=speed:backward_speed


DEFAULT_BATCHES = {"mlp": 150, "vgg5": 40}


def testbed_section(*, slowdown: float, port: int, models: list[str], batches: int | None,
                    algorithms: list[str], single: bool, replicate: bool,
                    batch_size: int, base_slowdown: float = BASE_SLOWDOWN,
                    hybrid: str | None = None) -> dict[str, Any]:
    """``hybrid``: the first agent emulates a device of these compute resources (its
    --resources), whose forward/backward split a Duan-Wu plan runs on two lanes."""
    from webapp.demo.scenario import DemoAgent, LocalTestbed

    agents = [DemoAgent("rt-hybrid" if hybrid else "rt-fast-a", slowdown=base_slowdown,
                        resources=hybrid),
              DemoAgent(f"rt-slow{slowdown:g}x", slowdown=base_slowdown * slowdown),
              DemoAgent("rt-fast-c", slowdown=base_slowdown)]
    out: dict[str, Any] = {}
    counts = {m: batches or DEFAULT_BATCHES.get(m, 40) for m in models}
    print(f"\nThree agents {base_slowdown:g}x slower than this machine, one {slowdown:g}x "
          f"slower still (on digits, 1F1B, batches of 8 "
          f"micro-batches of {batch_size}: "
          + ", ".join(f"{m} {n}" for m, n in counts.items()) + ")")
    header = (f"{'model':6} {'plan':10} {'stages':>6} {'group':>5} {'lanes':>5} "
              f"{'measured sps':>12} {'simulated sps':>13} {'ratio':>6} {'period sps':>10}")
    print(header)
    print("-" * len(header))
    with LocalTestbed(agents=agents, port=port, say=lambda line: print(line, file=sys.stderr)
                      ) as testbed:
        testbed.measure_links()
        for model in models:
            spec = testbed.model_spec(model=model, dataset="digits", batch_size=batch_size)
            runs = [(a, testbed.devices) for a in algorithms]
            if single:
                runs.append(("alone", testbed.devices[:1]))
            for name, devices in runs:
                summary = train(testbed, spec, devices, "uniform" if name == "alone" else name,
                                batches=counts[model], label=f"{model} {name}",
                                replicate=replicate)
                measured = summary["throughput_steady_sps"]
                simulated = summary["throughput_steady_predicted_sps"]
                out[f"{model}/{name}"] = {
                    "measured_sps": measured, "simulated_sps": simulated,
                    "ratio": measured / simulated if simulated else None,
                    "period_sps": summary["throughput_period_sps"],
                    "stages": summary["stages"], "largest_group": summary["groups"],
                    "two_lanes": summary["two_lanes"], "loss_first": summary["loss_first"],
                    "loss_last": summary["loss_last"]}
                print(f"{model:6} {name:10} {summary['stages']:>6} {summary['groups']:>5} "
                      f"{len(summary['two_lanes']):>5} {measured:>12.1f} "
                      f"{simulated:>13.1f} {measured / simulated:>6.2f} "
                      f"{summary['throughput_period_sps']:>10.1f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=None,
                        help="batches per run (default: mlp 150, vgg5 40, a few seconds of "
                             "steady state each; the steady-state rate of a shorter run is "
                             "mostly noise)")
    parser.add_argument("--models", default="mlp,vgg5")
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--batch-size", type=int, default=32, metavar="N",
                        help="samples per micro-batch (default 32)")
    parser.add_argument("--sections", default=",".join(SECTIONS), metavar="A,B",
                        help="which testbeds to run: slow4 (one agent 4x slower: uniform, "
                             "FTPipeHD, optimal, one device alone), slow10 (10x slower: the "
                             "heterogeneity-aware plans against uniform), groups (4x slower: "
                             "plans with replicated stages, bsp, duanwu, pipedream), lanes "
                             f"(one agent of resources {HYBRID}: Duan-Wu's two lanes); "
                             f"default all ({','.join(SECTIONS)})")
    parser.add_argument("--base-slowdown", type=float, default=BASE_SLOWDOWN, metavar="X",
                        help=f"how many times slower than this machine the fast agents are "
                             f"(default {BASE_SLOWDOWN:g})")
    parser.add_argument("--no-replication", dest="replicate", action="store_false",
                        help="train without fault-tolerance replicas (chain_every and "
                             "global_every 0), to see what replication costs")
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    var_dir = tempfile.mkdtemp(prefix="edgepipe-bench-")
    print(f"state and logs in {var_dir}", file=sys.stderr)
    setup_django(var_dir)
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"--sections: unknown section {unknown[0]!r}; known: {', '.join(SECTIONS)}")
    common = {"models": models, "batches": args.batches, "replicate": args.replicate,
              "batch_size": args.batch_size, "base_slowdown": args.base_slowdown}
    results: dict[str, dict[str, Any]] = {}
    if "slow4" in sections:
        results["slow4"] = testbed_section(slowdown=4.0, port=args.port, single=True,
                                           algorithms=["uniform", "ftpipehd", "optimal"],
                                           **common)
    if "slow10" in sections:
        results["slow10"] = testbed_section(slowdown=10.0, port=args.port + 1, single=False,
                                            algorithms=["uniform", "ftpipehd", "optimal"],
                                            **common)
    if "groups" in sections:
        # plans that put several devices on a stage: data parallelism, Duan-Wu's virtual
        # workers, PipeDream's replicas (where it replicates)
        results["groups"] = testbed_section(slowdown=4.0, port=args.port + 2, single=False,
                                            algorithms=["bsp", "duanwu", "pipedream"],
                                            **common)
    if "lanes" in sections:
        # a device whose two resources differ in forward/backward speed (an accelerator beside
        # a CPU): Duan-Wu's plan gives it a split, and it runs its passes on two lanes
        results["lanes"] = testbed_section(slowdown=4.0, port=args.port + 3, single=False,
                                           algorithms=["duanwu"], hybrid=HYBRID, **common)
    ratios = [r["ratio"] for section in results.values() for r in section.values()
              if r["ratio"]]
    report: dict[str, Any] = {"bench": "runtime", **results}
    if "slow10" in results:
        ten = results["slow10"]
        speedups = {plan: {m: ten[f"{m}/{plan}"]["measured_sps"]
                           / ten[f"{m}/uniform"]["measured_sps"] for m in models}
                    for plan in ("ftpipehd", "optimal")}
        for plan, label in (("ftpipehd", "FTPipeHD"), ("optimal", "optimal")):
            print(f"\n{label} over uniform with one device 10x slower (measured): "
                  + ", ".join(f"{m} {s:.2f}x" for m, s in speedups[plan].items()), end="")
        print()
        report["ftpipehd_over_uniform_slow10"] = speedups["ftpipehd"]
        report["optimal_over_uniform_slow10"] = speedups["optimal"]
    if ratios:
        print(f"measured / simulated: min {min(ratios):.2f}, "
              f"mean {sum(ratios) / len(ratios):.2f}")
        report["measured_over_simulated_min"] = min(ratios)
        report["measured_over_simulated_mean"] = sum(ratios) / len(ratios)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
