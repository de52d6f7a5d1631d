"""Benchmark of PipeLearn trained for real against its baselines FL and SFL, side by side.

    .venv/bin/python bench/pipelearn_runtime.py [--quick] [--devices N] [--model M]
        [--dataset D] [--batch-size B] [--batches N] [--epochs E] [--slowdown X]
        [--methods pipelearn,sfl,fl] [--port P]

Starts the web server, a Celery worker and the agents of ``manage.py demo --pipelearn`` (a
server, ``pl-server``, and ``--devices`` devices of the demo's kinds: 1x, 2x, 3x and 1.5x
slower, the second on a 20 Mbit/s link with 5 ms, the fourth on 50 Mbit/s with 2 ms), each
device ``--slowdown`` times slower still (edge devices against an edge server; the emulated
passes sleep most of their time, so that the five agents do not fight over this machine's
cores as much), measures the links, profiles the model on every agent, and then trains one
PipeLearn run per method, one after the other, through the product's REST API as the demo
does (webapp.demo.pipelearn): the same devices, server, model, B, iterations an epoch,
epochs and shard split. Each run is planned with its method only (P and N per device from
the time model fed with the measured profiles and links), each device whose micro-batches
differ from B profiles the model at their size first (webapp.demo.pipelearn.
profile_microbatches, as the demo does; ``--no-warm``
leaves that out), and the run is trained to its end; the server measures each epoch's
averaged model on the held-out set.

Prints a table, one row per method: the measured epoch time (the median over the epochs of
an epoch's time on the whole testbed, webapp.demo.pipelearn.epoch_ends: from the previous
epoch's end to the last pass, update or FedAvg of its micro-batches on any device; the run
summary's epochs end with the FedAvgs alone, which leaves out a device whose split no other
shares, ``epoch_s_fedavg_median`` in the JSON), the time model's prediction and measured over
predicted, PipeLearn's speedup over it (measured, and as the time model predicts), the
server's idle fraction (- for FL: the server trains nothing there) and the devices' (the
mean over the devices; each one's in the JSON), the held-out accuracy after the last epoch;
then the parts no FedAvg averaged (a device whose split P no other device has: its model is
never averaged with the others'), and one JSON line with every figure. Progress on stderr.
Runs on the embedded default, in a fresh var directory whose path it prints (the processes'
logs are in its demo/logs/).

Deliberate differences from "the same" of the paper: each run seeds its shards and its
model's initial weights with the run's id (webapp.runs.services.pipelearn), so the three
runs' iid shards are of the same sizes and distribution but not the same samples, and their
initial weights differ. Timing depends on this machine's load: the emulated devices share
its processors with each other, the web server and the worker.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: the package is not installed
    sys.path.insert(0, str(ROOT))

from bench.testbed import free_port, setup_django  # noqa: E402

METHODS = ("pipelearn", "sfl", "fl")
DEFAULTS: dict[str, Any] = {"devices": 4, "model": "vgg5", "dataset": "synthetic-cifar",
                            "batch_size": 32, "batches": 10, "epochs": 3, "slowdown": 4.0}
QUICK: dict[str, Any] = {"devices": 2, "model": "mlp", "dataset": "digits", "batch_size": 32,
                         "batches": 3, "epochs": 2, "slowdown": 1.0}


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def method_row(method: str, summary: dict[str, Any], document: dict[str, Any]
               ) -> dict[str, Any]:
    """What the table and the JSON line say of one method's run."""
    server = summary["server"]
    shares = summary["idle_fraction"]
    devices = {d: f for d, f in shares.items() if d != server}
    accuracy = [a for a in summary["test_accuracy"] if a is not None]
    return {
        "method": method, "run": summary["run"], "state": summary["state"],
        "epochs": len(summary["epoch_s_testbed"]),
        "epoch_s_measured": summary["epoch_s_testbed"],
        "epoch_s_median": summary["epoch_s_testbed_median"],
        "epoch_s_fedavg_median": summary["epoch_s_median"],
        "epoch_s_predicted": summary["epoch_s_predicted"], "ratio": summary["epoch_ratio"],
        "iteration_s_predicted": summary["iteration_s_predicted"],
        "server_idle": shares.get(server),
        "device_idle_mean": statistics.fmean(devices.values()) if devices else None,
        "device_idle": devices,
        "unaveraged": summary["unaveraged"], "test_accuracy": summary["test_accuracy"],
        "final_accuracy": accuracy[-1] if accuracy else None,
        "loss_first": summary["loss_first"], "loss_last": summary["loss_last"],
        "plan": {uid: {"split": d["split"], "parallel_batches": d["parallel_batches"]}
                 for uid, d in (document.get("devices") or {}).items()}}


def speedups(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """PipeLearn's speedup over each other method: measured (epoch medians) and predicted."""
    out: dict[str, dict[str, float | None]] = {}
    mine = rows.get("pipelearn")
    for method, row in rows.items():
        if mine is None or method == "pipelearn":
            continue
        measured = (row["epoch_s_median"] / mine["epoch_s_median"]
                    if row["epoch_s_median"] and mine["epoch_s_median"] else None)
        predicted = (row["epoch_s_predicted"] / mine["epoch_s_predicted"]
                     if row["epoch_s_predicted"] and mine["epoch_s_predicted"] else None)
        out[method] = {"measured": measured, "predicted": predicted}
    return out


def _f(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def table(rows: dict[str, dict[str, Any]], gains: dict[str, dict[str, float | None]]
          ) -> list[str]:
    header = (f"{'method':9} {'epoch s':>8} {'predicted':>9} {'ratio':>6} {'speedup':>8} "
              f"{'pred. speedup':>13} {'server idle':>11} {'device idle':>11} "
              f"{'accuracy':>8}")
    lines = [header, "-" * len(header)]
    for method, row in rows.items():
        gain = gains.get(method, {})
        lines.append(
            f"{method:9} {_f(row['epoch_s_median'], '8.3f')} "
            f"{_f(row['epoch_s_predicted'], '9.3f')} {_f(row['ratio'], '6.2f')} "
            f"{_f(gain.get('measured'), '7.2f') + ('x' if gain.get('measured') else ' '):>8} "
            f"{_f(gain.get('predicted'), '12.2f') + ('x' if gain.get('predicted') else ' '):>13} "
            f"{_f(row['server_idle'], '11.1%')} {_f(row['device_idle_mean'], '11.1%')} "
            f"{_f(row['final_accuracy'], '8.1%')}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a short run: 2 devices, the MLP on digits, 2 epochs of 3 "
                             "iterations, no extra slowdown")
    parser.add_argument("--devices", type=int, default=None, metavar="N",
                        help=f"devices besides the server (default {DEFAULTS['devices']})")
    parser.add_argument("--model", default=None, help=f"default {DEFAULTS['model']}")
    parser.add_argument("--dataset", default=None, help=f"default {DEFAULTS['dataset']}")
    parser.add_argument("--batch-size", type=int, default=None, metavar="B",
                        help=f"samples an iteration (default {DEFAULTS['batch_size']})")
    parser.add_argument("--batches", type=int, default=None, metavar="N",
                        help=f"iterations an epoch (default {DEFAULTS['batches']})")
    parser.add_argument("--epochs", type=int, default=None, metavar="E",
                        help=f"epochs (default {DEFAULTS['epochs']})")
    parser.add_argument("--slowdown", type=float, default=None, metavar="X",
                        help="every device this many times slower than its demo kind; the "
                             f"server stays at this machine's speed (default "
                             f"{DEFAULTS['slowdown']:g})")
    parser.add_argument("--methods", default=",".join(METHODS), metavar="A,B",
                        help=f"methods to train, in this order (default {','.join(METHODS)})")
    parser.add_argument("--no-warm", dest="warm", action="store_false",
                        help="do not profile the model at each device's micro-batch size "
                             "before a run (the devices then measure their warm times at "
                             "deployment, all at once: webapp.demo.pipelearn."
                             "profile_microbatches)")
    parser.add_argument("--port", type=int, default=None, help="web server's (default: free)")
    args = parser.parse_args(argv)
    base = {**DEFAULTS, **(QUICK if args.quick else {})}
    chosen = {key: base[key] if getattr(args, key) is None else getattr(args, key)
              for key in DEFAULTS}
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown or not methods:
        parser.error(f"--methods: unknown method {unknown[0]!r}; known: {', '.join(METHODS)}"
                     if unknown else "--methods: name at least one")
    if not chosen["slowdown"] >= 1:
        parser.error(f"--slowdown must be at least 1, got {chosen['slowdown']:g}")
    var_dir = tempfile.mkdtemp(prefix="edgepipe-bench-pipelearn-")
    say(f"state and logs in {var_dir}")
    setup_django(var_dir)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line a request, as the demo's
    from webapp.demo.client import DemoError
    from webapp.demo.pipelearn import (
        PipelearnDemoOptions,
        check_options,
        create_pipelearn_run,
        describe_plans,
        describe_summary,
        device_agents,
        plan_pipelearn_run,
        profile_microbatches,
        server_agent,
        train_plan,
    )
    from webapp.demo.scenario import LocalTestbed, chosen_plan

    options = PipelearnDemoOptions(
        port=args.port or free_port(), model=chosen["model"], dataset=chosen["dataset"],
        batch_size=chosen["batch_size"], devices=chosen["devices"], batches=chosen["batches"],
        epochs=chosen["epochs"], headless=True)
    rows: dict[str, dict[str, Any]] = {}
    names: dict[str, str] = {}
    try:
        check_options(options)
        agents = (server_agent(), *device_agents(options.devices,
                                                 slowdown=chosen["slowdown"]))
        with LocalTestbed(agents=agents, port=options.port, say=say) as testbed:
            server, clients = testbed.devices[0], testbed.devices[1:]
            names.update({d["uid"]: d["name"] for d in testbed.devices})
            testbed.measure_links()
            say(f"profiling {options.model} on {options.dataset}")
            spec = testbed.model_spec(model=options.model, dataset=options.dataset,
                                      batch_size=options.batch_size)
            for method in methods:
                run_options = replace(options, method=method)
                run_id = create_pipelearn_run(testbed, run_options, spec, server, clients,
                                              algorithms=(method,), label="bench")
                compared = plan_pipelearn_run(testbed, run_id)
                for line in describe_plans(compared, names):
                    say(line)
                row = chosen_plan(compared, method)
                if args.warm:
                    warmed = profile_microbatches(testbed, options, compared["documents"][method],
                                                  clients)
                    if warmed:
                        say("profiled at their micro-batch size: " + ", ".join(warmed))
                say(f"training {method} (run {run_id})")
                summary = train_plan(testbed, run_id, row["plan"],
                                     timeout_s=options.run_timeout_s, say=say)
                for line in describe_summary(summary, names):
                    say(line)
                if summary["state"] != "finished":
                    raise DemoError(f"the {method} run ended {summary['state']}: "
                                    f"{summary['error']}")
                rows[method] = method_row(method, summary, compared["documents"][method])
    except DemoError as exc:
        say(f"error: {exc}")
        return 1
    gains = speedups(rows)
    print(f"{options.devices} devices ({chosen['slowdown']:g}x their demo kinds) and a server; "
          f"{options.model} on {options.dataset}, B = {options.batch_size}, "
          f"{options.epochs} epochs of {options.batches} iterations"
          + ("" if args.warm else ", devices not profiled at their micro-batch size")
          + "; speedup: PipeLearn's epoch time against the method's")
    for line in table(rows, gains):
        print(line)
    for method, row in rows.items():
        if row["unaveraged"]:
            print(f"{method}: averaged by no FedAvg: " + ", ".join(
                " for ".join(names.get(u, u) for u in part.split(" for "))
                for part in row["unaveraged"]))
    report = {"bench": "pipelearn_runtime", **chosen, "warm": args.warm,
              "methods": list(rows.values()),
              "speedup": gains, "var_dir": var_dir}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
