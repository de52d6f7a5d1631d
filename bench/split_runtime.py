"""Benchmark of parallel split learning trained for real: each method's schedule, measured
against its plan.

    .venv/bin/python bench/split_runtime.py [--quick] [--clients N] [--batches N]
        [--warmup N] [--methods A,B] [--slot-ms MS] [--exact-limit S] [--solver-limit S]

Tirana et al., "Workflow Optimization for Parallel Split Learning" (INFOCOM 2024): clients
train part-1 and part-3 of a model and offload part-2 to a helper; a schedule assigns clients
to helpers and orders each helper's forward and backward tasks in time slots to minimise the
makespan of one batch. Here every method (random-fcfs, balanced-greedy, admm, auto, and exact
where CP-SAT proves its optimum within ``--exact-limit`` seconds) plans the same testbed, and
the agent's own stage executors then train that plan: VGG-5 on synthetic-cifar, batches of 8,
cut after conv1 (part-1) and after fc1 (part-2: conv2, conv3, fc1; part-3: fc2), one
U-shaped pipeline per client (orchestrator.sl.runtime.split_run_plan: part-1 and part-3 on the
client, part-2 on its assigned helper; the labels never leave the client), every stage a
StageExecutor on a thread of its own, the passes of a helper's stages taken in the schedule's
order through its Turnstile (orchestrator.sl.turns.helper_turns: a task the schedule
preempts runs in parts between layers, one at each of its segments' turns; GPipe, one
micro-batch a batch).

The testbed (``--quick``: the first four clients): clients 12x to 28x slower than this
machine, helpers 6x and 8x, each pass paced to that many times this machine's warm time for
it (agent/emulation.py), so that every thread sleeps most of its pass and two cores carry
eighteen stages (batches of 16 with half these slowdowns, the same emulated times with twice
the real compute, measured further from the plan: docs/benchmarks.md); each client's link
shaped (agent/transport.py: bytes / bandwidth + latency a
message). The study's instance is built from what the executors emulate, no second model:
this machine's profile (agent/profiler.py, one torch thread, as each stage runs) scaled by
each device's slowdown as its layer times, the executor's fixed cost a micro-batch and a
message (measure_overhead, measure_message_cost) as every device's ``overhead_s`` and
``message_s``, each client's shaped link as its bandwidth and latency (a helper's own line is
fast), the helpers' memory as their capacity; then instance_from_measurements with slots of
``--slot-ms``.

The makespan of a batch, as the paper's: all clients are released at once (each client's
part-1 waits at a barrier for the others before reading its batch, so a fast client never
starts its next batch early), and the batch ends with the last client's completion, the end
of its part-1 backward (completion = end of the helper's backward + rp). Measured from the
timeline events: from the earliest start of a client's part-1 forward of the batch to the
latest end of a client's part-1 backward of it. The first ``--warmup`` batches are left out.
Planned: the schedule's makespan in slots times the slot length (predicted_makespan_s).
Replayed: the same schedule's order on each helper run with the instance's times before they
were rounded up to slots, tasks whole (what this runtime would take with a perfect emulation):
planned over replayed is the slots' rounding and the preemptions (a part of a pass ends at
a layer, not at a slot), measured over replayed the runtime's own costs.

Deliberate differences from the plan, said in the output: a preempted task's parts end at
the layer closest to its segment's share of the task, not at the slot; a helper starts a
task as soon as its turn and input have come, not at its slot. Each client's link is emulated
on both ends of its pair (the client's plane, and a plane of the helper for that client
alone, both shaped as the client's line): a data plane shapes its sender's whole outgoing
line, so one plane per helper would queue the helper's transfers to all its clients on one
line, which the study does not model. FedAvg of the parts at the end of a round
(split_run_plan's groups) is not run: it is outside the batch's makespan, and a helper's
per-client planes cannot carry its ring. Timing depends on this machine's load: the emulated
devices share its two cores with each other and with whatever else runs.

Prints a table (method, assignment, preempted tasks, planned, replayed and measured seconds,
measured over planned), a second one of where the runtime spends more than the cost model
along a client's chain (each pass and transfer, measured minus modelled), a line with the
planned and the measured rankings and, last, one JSON line with every figure. Progress on
stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: the package is not installed
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402  (after the path above, like the project's imports)

from agent.data import Dataset  # noqa: E402
from agent.executor import Clock, Metric, StageExecutor  # noqa: E402
from agent.transport import DataPlane, SendRecord  # noqa: E402
from agent.turns import Turn, Turnstile  # noqa: E402
from agent.zoo import build_model  # noqa: E402
from bench.split_testbed import (  # noqa: E402
    BATCH_SIZE,
    CLIENTS,
    CUTS,
    DATASET,
    MODEL,
    Testbed,
    build_testbed,
    preempted,
    replayed_s,
    say,
)
from orchestrator.cost import build_cost_model  # noqa: E402
from orchestrator.events import TimelineEvent  # noqa: E402
from orchestrator.protocol import StageSpec  # noqa: E402
from orchestrator.sl import runtime as sl  # noqa: E402
from orchestrator.sl.formats import Schedule  # noqa: E402
from orchestrator.sl.solve import solve  # noqa: E402
from orchestrator.sl.turns import helper_turns  # noqa: E402

METHODS = ("random-fcfs", "balanced-greedy", "admm", "auto", "exact")
DEFAULTS: dict[str, Any] = {"clients": len(CLIENTS), "batches": 30, "warmup": 2,
                            "slot_ms": 4.0, "exact_limit_s": 5.0, "solver_limit_s": 5.0}
QUICK: dict[str, Any] = {"clients": 4, "batches": 6, "exact_limit_s": 2.0}


# --------------------------------------------------------------------------- training


@dataclass(frozen=True, eq=False)
class ReleasedData(Dataset):
    """A client's shard whose micro-batch is handed over once every client has read its own
    (each reads it after finishing the batch before): every batch releases all clients at
    once. The read comes first: it is not part of the batch (the paper's r is part-1's
    forward and the upload)."""

    release: threading.Barrier | None = None

    def microbatch(self, microbatch: int, batch_size: int, *, seed: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        out = super().microbatch(microbatch, batch_size, seed=seed)
        if self.release is not None:
            self.release.wait()
        return out


@dataclass
class Trained:
    """What one method's run recorded."""

    events: list[TimelineEvent] = field(default_factory=list)
    sends: list[SendRecord] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)
    orders: list[list[tuple[int, str]]] = field(default_factory=list)  # each helper's turns
    wall_s: float = 0.0


def train(bed: Testbed, schedule: Schedule, *, batches: int, timeout_s: float = 60.0,
          lr: float = 0.01) -> Trained:
    """Train ``batches`` batches under ``schedule``: one U-shaped pipeline per client (its
    plan from split_run_plan), each stage a StageExecutor on its own thread, each helper's
    passes in the schedule's order."""
    ids, hids = bed.client_ids, bed.helper_ids
    shards = [bed.data.shard(j, len(ids)) for j in range(len(ids))]
    run = sl.split_run_plan(schedule=schedule, cuts=CUTS, clients=ids, helpers=hids,
                            num_layers=bed.profile.num_layers,
                            microbatches_per_round=[batches] * len(ids), rounds=1,
                            samples=[len(s.y_train) for s in shards])
    trained = Trained()
    turns: list[tuple[tuple[int, str, int, int, int], ...]] = []
    for i in range(len(hids)):
        # a preempted task in parts, each over the layers of part-2 its segment's share of
        # the task covers (by the helper's layer times: this machine's, in proportion)
        order = helper_turns(
            instance=bed.instance, schedule=schedule, helper=i,
            parts2=[run.pipelines[j].stages[1].layers for j in range(len(ids))],
            forward_s=bed.warm.forward_s, backward_s=bed.warm.backward_s,
            switch_slots=schedule.switch_slots[i] if schedule.switch_slots else 0)
        trained.orders.append([(t.client, t.kind) for t in order])
        turns.append(tuple((t.client, t.kind, batches, *t.layers) for t in order))
    turnstiles = [Turnstile([Turn(*t[:3]) for t in mine]) if mine else None for mine in turns]
    release = threading.Barrier(len(ids), timeout=timeout_s)
    stop = threading.Event()
    errors: list[BaseException] = []
    # each client's plane, and its helper's plane for it alone, both shaped as its line
    planes: list[tuple[DataPlane, DataPlane]] = []
    try:
        for j, client in enumerate(bed.clients):
            helper = hids[schedule.assignment[j]]
            own = DataPlane(bind="tcp://127.0.0.1:0", identity=client.id,
                            shaping=client.shaping, on_send=trained.sends.append)
            planes.append((own, DataPlane(bind="tcp://127.0.0.1:0", identity=helper,
                                          shaping=client.shaping,
                                          on_send=trained.sends.append)))
            own.connect(helper, planes[j][1].address, planes[j][1].public_key)
            planes[j][1].connect(client.id, own.address, own.public_key)
        modules = []
        for j in range(len(ids)):
            zoo = build_model(MODEL, input_shape=bed.data.input_shape,
                              num_classes=bed.data.num_classes, seed=0)
            modules.append([zoo.stage(*stage.layers) for stage in run.pipelines[j].stages])
        clock = Clock(started_at=time.time())

        def stage(j: int, k: int) -> None:
            pipeline = run.pipelines[j]
            helper = schedule.assignment[j]
            spec = StageSpec(
                run=1, device=pipeline.stages[k].devices[0], stage=k,
                layers=pipeline.stages[k].layers, model=MODEL, dataset=DATASET,
                batch_size=BATCH_SIZE, schedule=pipeline.schedule,
                stage_devices=tuple(s.devices for s in pipeline.stages),
                stage_times_s=tuple((1.0,) for _ in pipeline.stages),
                microbatches=run.microbatches[j], flush_every=pipeline.microbatches, lr=lr,
                receive_timeout_s=timeout_s, pipeline=j,
                turns=turns[helper] if k == 1 else ())
            data: Dataset | None = None
            if k == 0:
                data = ReleasedData(**{f.name: getattr(shards[j], f.name)
                                       for f in fields(Dataset)}, release=release)
            elif k == 2:
                data = shards[j]
            device = bed.helpers[helper] if k == 1 else bed.clients[j]
            try:
                torch.set_num_threads(1)
                StageExecutor(spec, module=modules[j][k],
                              plane=planes[j][1] if k == 1 else planes[j][0], clock=clock,
                              dataset=data, on_event=trained.events.append,
                              on_metric=trained.metrics.append if k == 2 else None,
                              slowdown=device.slowdown, warm=bed.warm, stop=stop,
                              turns=turnstiles[helper] if k == 1 else None).run()
            except BaseException as exc:  # raised below, once every stage has ended
                errors.append(exc)
                stop.set()
                release.abort()

        threads = [threading.Thread(target=stage, args=(j, k), name=f"c{j}-stage{k}")
                   for j in range(len(ids)) for k in range(3)]
        began = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=timeout_s + batches * 5.0)
        trained.wall_s = time.perf_counter() - began
        if any(thread.is_alive() for thread in threads):
            stop.set()
            release.abort()
            errors.append(TimeoutError("a stage did not end in time"))
    finally:
        for pair in planes:
            for plane in pair:
                plane.close()
    if errors:
        raise RuntimeError(f"{schedule.method}: the run failed: {errors[0]!r}") from errors[0]
    return trained


# --------------------------------------------------------------------------- measuring


def batch_makespans(trained: Trained, *, clients: int, batches: int
                    ) -> tuple[list[float], list[float]]:
    """Each batch's makespan, from its first part-1 forward start to its last part-1 backward
    end over the clients, and its release skew, from its first part-1 forward start to its
    last (seconds)."""
    starts: dict[int, list[float]] = {m: [] for m in range(batches)}
    ends: dict[int, list[float]] = {m: [] for m in range(batches)}
    for e in trained.events:
        if e.stage == 0 and e.kind == "forward":
            starts[e.microbatch].append(e.start)
        elif e.stage == 0 and e.kind == "backward":
            ends[e.microbatch].append(e.end)
    missing = [m for m in range(batches) if len(starts[m]) != clients or len(ends[m]) != clients]
    if missing:
        raise RuntimeError(f"batch {missing[0]} lacks a client's part-1 forward or backward")
    return ([max(ends[m]) - min(starts[m]) for m in range(batches)],
            [max(starts[m]) - min(starts[m]) for m in range(batches)])


STEPS = ("fwd1", "cut1>", "fwd2", "cut2<", "fwd3", "bwd3", "cut2>", "bwd2", "cut1<", "bwd1")
"""A client's chain, in order: part-1 forward, the cut-1 activation up to the helper, part-2
forward, the cut-2 activation down, part-3 forward (with the loss) and backward, the cut-2
gradient up, part-2 backward, the cut-1 gradient down, part-1 backward."""


def modelled_steps_s(bed: Testbed, schedule: Schedule) -> list[dict[str, float]]:
    """Each client's chain by the cost model the instance was built with (seconds)."""
    cm = build_cost_model(bed.profile, bed.devices)
    (a1, e1), (a2, e2), (a3, e3) = CUTS.parts(bed.profile.num_layers)
    out = []
    for j, client in enumerate(bed.client_ids):
        c, h = cm.index(client), cm.index(bed.helper_ids[schedule.assignment[j]])
        (fwd1, bwd1), (fwd2, bwd2), (fwd3, bwd3) = (
            cm.pass_s(c, a1, e1), cm.pass_s(h, a2, e2), cm.pass_s(c, a3, e3))
        cut1, cut2 = cm.boundary_s(e1, [c], [h]) / 2, cm.boundary_s(e2, [h], [c]) / 2
        out.append(dict(zip(STEPS, (fwd1, cut1, fwd2, cut2, fwd3, bwd3, cut2, bwd2, cut1, bwd1),
                            strict=True)))
    return out


def measured_steps_s(trained: Trained, *, pipeline: int, microbatch: int) -> dict[str, float]:
    """One client's chain in one batch, from the timeline: passes by their events, transfers
    by their receive events (from the send to the arrival)."""
    mine = sorted((e for e in trained.events
                   if e.pipeline == pipeline and e.microbatch == microbatch),
                  key=lambda e: e.start)

    def spans(stage: int, kind: str) -> list[float]:
        return [e.end - e.start for e in mine if e.stage == stage and e.kind == kind]

    up = spans(1, "recv")  # the activation, then the gradient
    # a helper's preempted pass is several events, one a part: their sum is the pass
    return dict(zip(STEPS, (spans(0, "forward")[0], up[0], sum(spans(1, "forward")),
                            spans(2, "recv")[0], spans(2, "forward")[0],
                            spans(2, "backward")[0], up[1], sum(spans(1, "backward")),
                            spans(0, "recv")[0], spans(0, "backward")[0]), strict=True))


def step_excess_ms(trained: Trained, bed: Testbed, schedule: Schedule, *, batches: int,
                   warmup: int) -> dict[str, float]:
    """Per step of the chain: the median over clients and batches of measured minus
    modelled, in milliseconds."""
    model = modelled_steps_s(bed, schedule)
    excess: dict[str, list[float]] = {step: [] for step in STEPS}
    for j in range(len(bed.clients)):
        for m in range(warmup, batches):
            for step, seconds in measured_steps_s(trained, pipeline=j, microbatch=m).items():
                excess[step].append(1000 * (seconds - model[j][step]))
    return {step: statistics.median(values) for step, values in excess.items()}


def orders_kept(trained: Trained, bed: Testbed, *, batches: int) -> bool:
    """Did every helper run each batch's passes in its schedule's order?"""
    for i, order in enumerate(trained.orders):
        mine = sorted((e for e in trained.events if e.device == bed.helper_ids[i]
                       and e.kind in ("forward", "backward")), key=lambda e: e.start)
        for m in range(batches):
            if [(e.pipeline, e.kind) for e in mine if e.microbatch == m] != order:
                return False
    return True


def losses(trained: Trained) -> dict[int, list[float]]:
    """Each batch's training losses, one per client that finished it."""
    by_batch: dict[int, list[float]] = {}
    for metric in trained.metrics:
        if metric.name == "loss":
            by_batch.setdefault(metric.microbatch, []).append(metric.value)
    return by_batch


# --------------------------------------------------------------------------- the report


def ranking(values: dict[str, float]) -> list[str]:
    return sorted(values, key=lambda method: (values[method], METHODS.index(method)))


def pairs_agreeing(planned: dict[str, float], measured: dict[str, float]) -> tuple[int, int]:
    """Of the pairs of methods whose plans differ, how many the measurements order alike."""
    methods = list(planned)
    judged = [(a, b) for n, a in enumerate(methods) for b in methods[n + 1:]
              if planned[a] != planned[b]]
    agree = sum((planned[a] < planned[b]) == (measured[a] < measured[b]) for a, b in judged)
    return agree, len(judged)


HEADER = (f"{'method':<16} {'assignment':<14} {'preempted':>9} {'planned s (slots)':>17} "
          f"{'replayed s':>10} {'measured s median (min-max)':>28} {'measured/planned':>16} "
          f"{'solver s':>8}")


def table_row(row: dict[str, Any]) -> str:
    measured = (f"{row['measured_median_s']:.4f} ({row['measured_min_s']:.4f}-"
                f"{row['measured_max_s']:.4f})")
    planned = f"{row['planned_s']:.4f} ({row['makespan_slots']})"
    return (f"{row['method']:<16} {''.join(map(str, row['assignment'])):<14} "
            f"{row['preempted']:>9} {planned:>17} {row['replayed_s']:>10.4f} {measured:>28} "
            f"{row['ratio']:>16.3f} {row['solver_s']:>8.2f}")


def run_method(bed: Testbed, schedule: Schedule, *, batches: int, warmup: int
               ) -> dict[str, Any]:
    trained = train(bed, schedule, batches=batches)
    spans, skews = batch_makespans(trained, clients=len(bed.clients), batches=batches)
    spans, skews = spans[warmup:], skews[warmup:]
    planned = sl.predicted_makespan_s(schedule=schedule, instance=bed.instance)
    replay = replayed_s(bed, schedule)
    median = statistics.median(spans)
    by_batch = losses(trained)
    mean_loss = [statistics.mean(by_batch[m]) for m in sorted(by_batch)]
    helpers = set(bed.helper_ids)
    return {
        "method": schedule.method, "assignment": list(schedule.assignment),
        "makespan_slots": schedule.makespan, "planned_s": planned, "replayed_s": replay,
        "measured_median_s": median, "measured_min_s": min(spans),
        "measured_max_s": max(spans), "measured_s": [round(s, 5) for s in spans],
        "ratio": median / planned, "ratio_to_replayed": median / replay,
        "release_skew_ms": 1000 * statistics.median(skews),
        "excess_ms": step_excess_ms(trained, bed, schedule, batches=batches, warmup=warmup),
        "preempted": preempted(bed, schedule), "solver_s": schedule.solver_s,
        "gap": schedule.gap, "orders_kept": orders_kept(trained, bed, batches=batches),
        "batches_trained": sum(len(v) == len(bed.clients) for v in by_batch.values()),
        "messages_to_helpers": sum(s.peer in helpers for s in trained.sends),
        "labels_sent_to_helpers": sum(s.peer in helpers and s.header.labels is not None
                                      for s in trained.sends),
        "loss_first": mean_loss[0], "loss_last": mean_loss[-1],
        "wall_s": trained.wall_s}


OPTIONS: tuple[tuple[str, type, str, str, str], ...] = (
    ("--clients", int, "clients", "N", "the first N clients of the testbed"),
    ("--batches", int, "batches", "N", "batches a method trains"),
    ("--warmup", int, "warmup", "N", "first batches left out of the makespans"),
    ("--slot-ms", float, "slot_ms", "MS", "the study's slot length, ms"),
    ("--exact-limit", float, "exact_limit_s", "S", "exact's time limit, s"),
    ("--solver-limit", float, "solver_limit_s", "S", "admm's and auto's time limit, s"))
"""Options whose default is the preset's (DEFAULTS, or QUICK under --quick)."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join((__doc__ or "").split("\n\n")[2:]))
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: {QUICK['clients']} clients, {QUICK['batches']} "
                             f"batches, exact given {QUICK['exact_limit_s']:g} s")
    for flag, kind, key, metavar, text in OPTIONS:
        quick = f"; --quick {QUICK[key]:g}" if key in QUICK else ""
        parser.add_argument(flag, type=kind, default=None, dest=key, metavar=metavar,
                            help=f"{text} (default {DEFAULTS[key]:g}{quick})")
    parser.add_argument("--methods", default=",".join(METHODS), metavar="A,B",
                        help=f"comma-separated, of {', '.join(METHODS)} (default all; exact "
                             "only where CP-SAT proves its optimum in --exact-limit)")
    parser.add_argument("--seed", type=int, default=0, help="random-fcfs's seed (default 0)")
    args = parser.parse_args(argv)
    preset = {**DEFAULTS, **(QUICK if args.quick else {})}
    for _, _, key, _, _ in OPTIONS:
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        parser.error(f"--methods: one or more of {', '.join(METHODS)}, not {args.methods!r}")
    args.methods = [m for m in METHODS if m in methods]
    if not 1 <= args.clients <= len(CLIENTS):
        parser.error(f"--clients: 1 to {len(CLIENTS)}")
    if args.warmup < 0 or args.batches <= args.warmup:
        parser.error("--batches must be above --warmup, and --warmup not negative")
    if not min(args.slot_ms, args.exact_limit_s, args.solver_limit_s) > 0:
        parser.error("--slot-ms, --exact-limit and --solver-limit must be positive")
    return args


def plan(bed: Testbed, args: argparse.Namespace) -> tuple[list[Schedule], dict[str, str]]:
    """Each method's schedule of the testbed's instance; exact only where proven optimal
    (else the reason it is left out)."""
    schedules: list[Schedule] = []
    skipped: dict[str, str] = {}
    for method in args.methods:
        limit = args.exact_limit_s if method == "exact" else args.solver_limit_s
        schedule = solve(instance=bed.instance, method=method, time_limit_s=limit,
                         seed=args.seed)
        say(f"{method}: makespan {schedule.makespan} slots, assignment "
            f"{list(schedule.assignment)}, {schedule.solver_s:.2f} s")
        if method == "exact" and schedule.gap != 0.0:
            skipped[method] = (f"CP-SAT did not prove its optimum in {limit:g} s "
                               f"(makespan {schedule.makespan}, gap {schedule.gap})")
            say(f"exact: left out, {skipped[method]}")
        else:
            schedules.append(schedule)
    return schedules, skipped


def report(bed: Testbed, args: argparse.Namespace, rows: list[dict[str, Any]],
           skipped: dict[str, str], *, seconds: float) -> None:
    """The tables, a summary line and, last, the JSON line."""
    planned = {r["method"]: r["planned_s"] for r in rows}
    measured = {r["method"]: r["measured_median_s"] for r in rows}
    agree, judged = pairs_agreeing(planned, measured)
    ratios = [r["ratio"] for r in rows]
    within = all(abs(r - 1) <= 0.15 for r in ratios)
    lines = [
        f"\n{MODEL} on {DATASET}, batches of {BATCH_SIZE}, cuts after layer {CUTS.sigma1} and "
        f"{CUTS.sigma2}; clients " + ", ".join(
            f"{c.id} {c.slowdown:g}x {c.bandwidth_mbps:g} MB/s {c.latency_ms:g} ms"
            for c in bed.clients)
        + "; helpers " + ", ".join(f"{h.id} {h.slowdown:g}x {h.memory_mb} MB"
                                   for h in bed.helpers)
        + f"; slots of {bed.instance.slot_ms:g} ms; {args.batches} batches a method, the "
        f"first {args.warmup} left out. Makespan of a batch: first part-1 forward start to "
        "last part-1 backward end. Preempted tasks run in parts between layers, each at its "
        "segment's turn.",
        HEADER, "-" * len(HEADER), *map(table_row, rows),
        *(f"{method:<16} left out: {reason}" for method, reason in skipped.items()),
        "\nThe runtime beyond the cost model, ms: release = the spread of a batch's part-1 "
        "forward starts (median over batches; the plan releases every client at 0); then "
        "along a client's chain, the median over clients and batches of measured - modelled "
        "(passes by their events, transfers from send to arrival; > up to the helper, < down "
        "to the client):",
        f"{'method':<16} {'release':>7} " + " ".join(f"{step:>6}" for step in STEPS)
        + f" {'sum':>6}",
        *(f"{r['method']:<16} {r['release_skew_ms']:>7.2f} "
          + " ".join(f"{r['excess_ms'][step]:>+6.2f}" for step in STEPS)
          + f" {sum(r['excess_ms'].values()):>+6.2f}" for r in rows),
        f"measured / planned {min(ratios):.3f}-{max(ratios):.3f}; within 15% for every "
        f"method: {within}; planned ranking {' < '.join(ranking(planned))}; measured "
        f"{' < '.join(ranking(measured))}; {agree} of {judged} pairs with different plans "
        f"ordered alike; {seconds:.0f} s in all"]
    print("\n".join(lines))
    print(json.dumps({
        "bench": "split_runtime", "model": MODEL, "dataset": DATASET,
        "batch_size": BATCH_SIZE, "cuts": CUTS.to_json(), "slot_ms": bed.instance.slot_ms,
        "batches": args.batches, "warmup": args.warmup,
        "clients": [{"id": c.id, "slowdown": c.slowdown, "bandwidth_mbps": c.bandwidth_mbps,
                     "latency_ms": c.latency_ms} for c in bed.clients],
        "helpers": [{"id": h.id, "slowdown": h.slowdown, "memory_mb": h.memory_mb}
                    for h in bed.helpers],
        "instance": bed.instance.to_json(), "methods": rows, "skipped": skipped,
        "ranking_planned": ranking(planned), "ranking_measured": ranking(measured),
        "pairs_ordered_alike": [agree, judged], "rankings_agree": agree == judged,
        "within_15_percent": within,
        "preemption": "a preempted task runs in parts between layers, each at its turn",
        "seconds": round(seconds, 1)}))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    threads = torch.get_num_threads()  # each stage's thread sets its own (train)
    try:
        bed = build_testbed(clients=args.clients, slot_ms=args.slot_ms)
        schedules, skipped = plan(bed, args)
        rows = []
        for schedule in schedules:
            say(f"{schedule.method}: training {args.batches} batches")
            row = run_method(bed, schedule, batches=args.batches, warmup=args.warmup)
            say(f"{schedule.method}: measured {row['measured_median_s']:.4f} s a batch, "
                f"planned {row['planned_s']:.4f} s ({row['ratio']:.3f}), {row['wall_s']:.1f} s")
            rows.append(row)
    finally:
        torch.set_num_threads(threads)
    report(bed, args, rows, skipped, seconds=time.monotonic() - began)
    return 0


if __name__ == "__main__":
    sys.exit(main())
