"""Benchmark of fault tolerance: real agents killed while training, and how the run recovers.

    .venv/bin/python bench/faults.py [--models mlp,vgg5] [--quick] [--var DIR]

Starts the web server, a Celery worker and four agent processes (fast, 2x slower, fast, fast;
every agent also runs BASE_SLOWDOWN times slower than one core of this machine, about a
Raspberry Pi 4 by the papers' testbed, so that four of them and the server share its cores
as little as devices of their own would; see BASE_SLOWDOWN). For each
model (mlp on scikit-learn's digits, vgg5 on synthetic-cifar) and each scenario it trains one
run per recovery policy with FTPipeHD's plan (every device, in order; ``--plan`` another
planner's, whose recovery then re-plans with it too) and kills device agents
with SIGKILL (a device losing power) a third of the way into the run. Before a model's
scenarios, a calibration run (fault-free, a third as long; ``--no-calibration`` skips it)
measures every device's fixed costs for the model in a pipeline, so that the runs measured are
planned, and their recoveries re-planned, with them, as a user's later runs of a model are:

- ``middle``: the device of the middle stage (stage len // 2);
- ``last``: the device of the last stage;
- ``middle+last``: both at once.

Recovery policies: ``replan`` (FTPipeHD: the server re-plans the survivors with the run's
planner from their measured capacities) and ``respipe`` (the ResPipe-style baseline: no
re-plan, the failed stage's successor takes all its layers; the last surviving stage when the
tail fails). Dynamic re-partition is off (``--repartition-every 0``), so the plan trained
after the recovery is the recovery's; replicas go to the next stage's device every 2 batches
(``--chain-every``) and to the server every tenth of the run, at most every 10 batches
(``--global-every``: losing two adjacent stages needs the server's copy of the first one's
layers). Each run also records, for each process, the cores it used and the cores' worth of
time its threads were ready to run but waited for one (CpuSampler), before the kill and after
the resumption, since the agents, the server and anything else running share this machine's
cores and real devices do not.

For each run it reports, from the server's database: ``detect_s``, from the kill to the
server's ``device_lost`` (on the run's clock, seconds since the run started); ``recovery_s``,
from detection to training resumed (the ``recovered`` event's); the steady samples/s through
the last stage before the kill and after the resumption (the first WARMUP_S after it left
out); the throughput the ``optimal`` planner predicts for the survivors on their profiles, and
the measured after over it (the acceptance asks for at least 0.9, and a recovery of at most
3 s; FTPipeHD reports 2.24 s); the plan after the recovery, the capacities it was planned
with, the micro-batches trained again and the weights' bytes moved. Every agent is restarted
(same enrolment) before the next run (bench.testbed.restart_agents says why the survivors
too). Prints a table and, last, one JSON line. Runs on the embedded default, in a fresh var
directory whose path it prints (the processes' logs are in its demo/logs/).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cpu_sampler import CpuSampler, agents_waiting  # noqa: E402  (the path above makes it importable)
from bench.testbed import free_port, restart_agents, setup_django  # noqa: E402

# every agent, over one core of this machine (each runs torch on one thread). The papers'
# testbed (data/profiles) puts a Raspberry Pi 4 at 1/48 of an 8-core VM and a Jetson Nano's CPU
# at 1/72: 12x and the slow agent's 24x are about those devices. An agent's own Python work (its
# sends, events, replicas) is not slowed down, and the four of them and the server share 2
# cores, where devices would each have their own: at 6x the three survivors of the MLP's
# three-stage recoveries kept 1.5-2.3 cores' worth of threads waiting for a core and trained at
# 0.89-0.90 of the optimum's prediction; at 12x, 0.83-0.88 waiting and 0.96-0.99 (at 3x,
# 0.49-0.58). Devices of their own wait for nobody.
BASE_SLOWDOWN = 12.0
SLOW = 2.0  # the slow agent, over the others
DATASETS = {"mlp": "digits", "vgg5": "synthetic-cifar"}
# batches per run: 4-8 s of training here for the MLP, 25-50 s for VGG-5; the kill a third of
# the way into the predicted length (measured runs are slower than predicted: it comes earlier
# than a third)
DEFAULT_BATCHES = {"mlp": 100, "vgg5": 12}
QUICK_BATCHES = {"mlp": 50, "vgg5": 6}
SCENARIOS = ("middle", "last", "middle+last")
POLICIES = ("replan", "respipe")
WARMUP_S = 0.5  # after the resumption, left out of the throughput after
FILL = 0.2  # of the last stage's completions before the kill, left out (the pipeline filling)
RECOVERY_TARGET_S = 3.0
RATIO_TARGET = 0.9


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def setup(var_dir: str) -> None:
    setup_django(var_dir)
    logging.getLogger("httpx").setLevel(logging.WARNING)


# --------------------------------------------------------------------------- one run


def subset(devices: Any, keep: Sequence[str]) -> Any:
    """The device set restricted to ``keep`` (webapp.runs.recovery does the same)."""
    from orchestrator.formats import DeviceSet

    chosen = set(keep)
    return DeviceSet(devices=tuple(d for d in devices.devices if d.id in chosen),
                     links=tuple(li for li in devices.links if li.a in chosen and li.b in chosen),
                     file=devices.file)


def rate_sps(times: Sequence[float], batch_size: int) -> float | None:
    """Samples/s from the completion times of consecutive micro-batches."""
    ordered = sorted(times)
    if len(ordered) < 3 or ordered[-1] <= ordered[0]:
        return None
    return (len(ordered) - 1) * batch_size / (ordered[-1] - ordered[0])


def create_and_plan(testbed: Any, spec: int, *, name: str, policy: str, planner: str,
                    microbatches: int, batches: int, settings: dict[str, int]
                    ) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """A run of every device, planned with ``planner``; the run id, the plan's comparison row
    and its document."""
    from webapp.demo.client import DemoError
    from webapp.demo.scenario import chosen_plan
    from webapp.runs.models import Run

    run = testbed.api.post("/api/runs/", {
        "name": name, "model_spec": spec, "devices": [d["id"] for d in testbed.devices],
        "algorithms": [planner], "schedule": "1f1b", "microbatches": microbatches,
        "batches": batches, "epochs": 1, "recovery_policy": policy, **settings})
    run_id = int(run["id"])
    testbed.api.post(f"/api/runs/{run_id}/plan/")
    planned = testbed.wait_state(run_id, (Run.State.PLANNED, Run.State.FAILED), 300)
    if planned["state"] != Run.State.PLANNED:
        raise DemoError(f"planning run {run_id} failed: {planned['error']}")
    compared = testbed.api.get(f"/api/runs/{run_id}/plans/compare/")
    row = chosen_plan(compared, planner)
    document = next(p["document"] for p in testbed.api.get(f"/api/runs/{run_id}/plans/")
                    if p["id"] == row["plan"])
    return run_id, row, document


def fault_run(testbed: Any, spec: int, *, model: str, scenario: str, policy: str,
              planner: str, batches: int, microbatches: int, kill_at: float, warmup_s: float,
              settings: dict[str, int]) -> dict[str, Any]:
    """One run with the scenario's devices killed; its figures."""
    from django.utils import timezone

    from orchestrator.cost import build_cost_model, evaluate_plan
    from orchestrator.events import TimelineEvent as TimelineRecord
    from orchestrator.partition import run_planner
    from orchestrator.planformat import parse_plan
    from orchestrator.recovery import successor_takes_over
    from webapp.demo.client import DemoError
    from webapp.runs.models import Run, TimelineEvent
    from webapp.runs.selectors import run_faults, run_planning_inputs
    from webapp.runs.summaries import fault_recoveries, last_stage_backwards

    names = {d["uid"]: a.name for d, a in zip(testbed.devices, testbed.agents, strict=True)}
    agents = {d["uid"]: a for d, a in zip(testbed.devices, testbed.agents, strict=True)}
    run_id, row, document = create_and_plan(
        testbed, spec, name=f"bench faults: {model} {scenario} {policy}", policy=policy,
        planner=planner, microbatches=microbatches, batches=batches, settings=settings)
    stages = document["stages"]
    order = [u for s in stages for u in s["devices"]]
    if order != [d["uid"] for d in testbed.devices]:
        say(f"  note: the {planner} plan of run {run_id} does not use every device in order: "
            + " ".join(names.get(u, u) for u in order))
    victims = {"middle": [stages[len(stages) // 2]["devices"][0]],
               "last": [stages[-1]["devices"][0]],
               "middle+last": [stages[len(stages) // 2]["devices"][0],
                               stages[-1]["devices"][0]]}[scenario]
    victims = list(dict.fromkeys(victims))
    run = Run.objects.select_related("model_spec").get(pk=run_id)
    batch_size = run.model_spec.batch_size
    samples = batches * microbatches * batch_size
    expected_s = samples / (row["simulated_throughput_sps"] or row["throughput_sps"])
    load = os.getloadavg()[0]
    with CpuSampler(testbed) as sampler:
        testbed.start(run_id, row["plan"])
        run.refresh_from_db()
        started = run.started_at.timestamp() if run.started_at else time.time()
        kill_s = kill_at * expected_s
        say(f"  run {run_id}: {model} {scenario} {policy}, {len(stages)} stages "
            f"({', '.join(names.get(s['devices'][0], '?') for s in stages)}), about "
            f"{expected_s:.0f} s expected; killing {', '.join(names[v] for v in victims)} at "
            f"{kill_s:.1f} s")
        while time.time() < started + kill_s:
            time.sleep(min(0.05, max(0.0, started + kill_s - time.time())))
        if Run.objects.get(pk=run_id).state != Run.State.RUNNING:
            raise DemoError(f"run {run_id} was no longer running at the kill "
                            f"({Run.objects.get(pk=run_id).state}): choose more --batches")
        killed_wall = time.time()
        for uid in victims:
            testbed.processes.kill(testbed.agent_process(agents[uid]))
        killed_s = killed_wall - started
        error = None
        try:
            testbed.finish(run_id, timeout_s=max(180.0, 8 * expected_s))
        except DemoError as exc:  # timed out: stop it, report what it did
            error = str(exc)
            say(f"  run {run_id}: {exc}; stopping it")
            try:
                testbed.api.post(f"/api/runs/{run_id}/stop/")
            except Exception as stop_exc:  # a report, not a failure
                say(f"  run {run_id}: could not stop it: {stop_exc}")
    run = Run.objects.select_related("model_spec").get(pk=run_id)
    finished_in = ((run.finished_at or timezone.now()).timestamp() - started)

    recoveries = fault_recoveries(run_faults(run=run))
    failures = [r for r in recoveries if r["cause"] == "failure"]
    losses = sorted((loss for r in failures for loss in r["losses"]),
                    key=lambda x: x["detected_s"])
    detected = [loss["detected_s"] for loss in losses if loss["device"] in victims]
    resumed = [r for r in failures if r["resumed_s"] is not None]
    last = resumed[-1] if resumed else None
    recovery_s: float | None = None
    if len(resumed) == 1:
        recovery_s = resumed[0]["recovery_s"]
    elif resumed and detected:  # more than one recovery: the first loss to the last resume
        recovery_s = resumed[-1]["resumed_s"] - min(detected)

    timeline = [TimelineRecord(run=run.pk, device=e.device, stage=e.stage, kind=e.kind,
                               microbatch=e.microbatch, version=e.version, start=e.start,
                               end=e.end, bytes=e.bytes)
                for e in TimelineEvent.objects.filter(run=run, kind="backward")]
    backwards = last_stage_backwards(timeline, recoveries)
    before_ends = sorted(e.end for e in backwards if e.end <= killed_s)
    before = rate_sps(before_ends[int(len(before_ends) * FILL):], batch_size)
    after = None
    if last is not None:
        after = rate_sps([e.end for e in backwards if e.start >= last["resumed_s"] + warmup_s],
                         batch_size)
    # the cores each process used, and waited for, over the run and the same windows
    cpu_run = sampler.window(started, started + finished_in)
    cpu_before = sampler.window(started + FILL * killed_s, killed_wall)
    cpu_after = (sampler.window(started + last["resumed_s"] + warmup_s, started + finished_in)
                 if last is not None else {})

    profile, devices = run_planning_inputs(run=run)
    lost = {loss["device"] for loss in losses} | set(victims)
    survivors = [u for u in devices.ids if u not in lost]
    cm = build_cost_model(profile, subset(devices, survivors))
    optimal = run_planner(cm, "optimal", schedule=run.schedule, microbatches=run.microbatches)
    optimal_sps = optimal.predicted.throughput_sps if optimal.predicted else None
    # what each recovery would choose for the survivors, all on the same profiles
    on_profiles: dict[str, float | None] = {"optimal": optimal_sps}
    try:
        replanned = run_planner(cm, planner, schedule=run.schedule,
                                microbatches=run.microbatches)
        on_profiles[f"replan ({planner})"] = (replanned.predicted.throughput_sps
                                              if replanned.predicted else None)
        old = parse_plan(document, profile=profile, devices=devices)
        taken = successor_takes_over(cm, old, sorted(lost), schedule=run.schedule,
                                     microbatches=run.microbatches)
        on_profiles["respipe"] = taken.predicted.throughput_sps if taken.predicted else None
    except Exception as exc:  # a report, not a failure
        say(f"  run {run_id}: the recoveries' plans could not be predicted: {exc}")
    plan_after = None
    plan_after_sps = None
    if last is not None and last["stages"]:
        plan_after = [{"devices": [names.get(u, u) for u in s["devices"]],
                       "layers": s["layers"]} for s in last["stages"]]
        try:
            parsed = parse_plan({"algorithm": "recovered", "stages": last["stages"]},
                                profile=profile, devices=subset(devices, survivors))
            plan_after_sps = evaluate_plan(cm, parsed).throughput_sps
        except Exception as exc:  # a report, not a failure
            say(f"  run {run_id}: the plan after the recovery could not be evaluated: {exc}")
    return {
        "run": run_id, "model": model, "scenario": scenario, "policy": policy,
        "state": run.state, "error": error or run.error or None,
        "killed": [names[v] for v in victims], "killed_s": round(killed_s, 3),
        "finished_s": round(finished_in, 2),
        "stages_before": [{"devices": [names.get(u, u) for u in s["devices"]],
                           "layers": s["layers"]} for s in stages],
        "predicted_before_sps": row["throughput_sps"],
        "detection_s": (round(max(detected) - killed_s, 3)
                        if len(detected) == len(victims) else None),
        "detection_each_s": {names.get(loss["device"], loss["device"]):
                             round(loss["detected_s"] - killed_s, 3) for loss in losses},
        "detected_by": [loss["detected_by"] for loss in losses],
        "recoveries": len(failures),
        "recovery_s": recovery_s,
        "replanning_s": last["replanning_s"] if last else None,
        "redistributing_s": last["redistributing_s"] if last else None,
        "resuming_s": last["resuming_s"] if last else None,
        "throughput_before_sps": before, "throughput_after_sps": after,
        "predicted_optimal_after_sps": optimal_sps,
        "predicted_on_profiles_sps": on_profiles,
        "optimal_after_stages": [{"devices": [names.get(u, u) for u in s.devices],
                                  "layers": list(s.layers)} for s in optimal.stages],
        "after_over_optimal": (after / optimal_sps if after and optimal_sps else None),
        "predicted_plan_after_sps": plan_after_sps,
        "after_over_plan_predicted": (after / plan_after_sps
                                      if after and plan_after_sps else None),
        "before_over_predicted": (before / row["throughput_sps"]
                                  if before and row["throughput_sps"] else None),
        "planner_after": last["planner"] if last else None,
        # each device's capacity over its profile as the (last) recovery planned with it
        # (FTPipeHD's estimate from the stage times measured before the kill; > 1: faster)
        "capacities": {names.get(u, u): round(float(r), 3)
                       for u, r in ((run.recovery or {}).get("capacity") or {}).items()},
        "stages_after": plan_after,
        "resume_microbatch": last["resume_microbatch"] if last else None,
        "loadavg_1min_at_start": round(load, 2),
        "cores_used": {name: v["cores"] for name, v in cpu_run.items()},
        "cpu_before": cpu_before, "cpu_after": cpu_after,
        "agents_waiting_before": agents_waiting(cpu_before),
        "agents_waiting_after": agents_waiting(cpu_after),
        "microbatches_redone": sum(r["microbatches_redone"] or 0 for r in resumed),
        "bytes_moved": sum(r["bytes_moved"] or 0 for r in resumed),
    }


# --------------------------------------------------------------------------- report


def short_stages(stages: Sequence[dict[str, Any]] | None) -> str:
    if not stages:
        return "-"
    return " ".join(f"{'+'.join(s['devices'])}:{s['layers'][0]}-{s['layers'][1]}"
                    for s in stages)


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


HEADER = (f"{'model':5} {'scenario':11} {'policy':7} {'state':8} {'detect_s':>8} "
          f"{'recov_s':>7} {'before':>7} {'after':>7} {'optimal':>7} {'ratio':>5} "
          f"{'plan':>7} {'a/plan':>6} {'wait':>5} {'redone':>6} {'moved_kB':>8}  stages after")


def calibration_run(testbed: Any, spec: int, *, model: str, planner: str, batches: int,
                    microbatches: int, settings: dict[str, int]) -> int:
    """A run of every device with nothing killed, so that each device's fixed costs for the
    model (per micro-batch, per message sent) are measured by a pipeline, as a user's first
    run of a model measures them, before the runs the bench measures are planned; its id."""
    from webapp.demo.client import DemoError

    run_id, row, _ = create_and_plan(testbed, spec, name=f"bench faults: {model} calibration",
                                     policy="replan", planner=planner,
                                     microbatches=microbatches, batches=batches,
                                     settings=settings)
    testbed.start(run_id, row["plan"])
    summary = testbed.finish(run_id)
    if summary["state"] != "finished":
        raise DemoError(f"calibration run {run_id} ended {summary['state']}: "
                        f"{summary['error']}")
    say(f"  calibration run {run_id}: {summary['throughput_steady_sps']:.0f} samples/s, "
        f"{summary['throughput_steady_sps'] / summary['throughput_steady_predicted_sps']:.2f} "
        "of the prediction from the agents' probes")
    return run_id


def table_row(r: dict[str, Any]) -> str:
    return (f"{r['model']:5} {r['scenario']:11} {r['policy']:7} {r['state']:8} "
            f"{fmt(r['detection_s'], '.3f'):>8} {fmt(r['recovery_s'], '.3f'):>7} "
            f"{fmt(r['throughput_before_sps'], '.0f'):>7} "
            f"{fmt(r['throughput_after_sps'], '.0f'):>7} "
            f"{fmt(r['predicted_optimal_after_sps'], '.0f'):>7} "
            f"{fmt(r['after_over_optimal'], '.2f'):>5} "
            f"{fmt(r['predicted_plan_after_sps'], '.0f'):>7} "
            f"{fmt(r['after_over_plan_predicted'], '.2f'):>6} "
            f"{fmt(r['agents_waiting_after'], '.2f'):>5} "
            f"{r['microbatches_redone']:>6} {r['bytes_moved'] / 1000:>8.0f}  "
            f"{short_stages(r['stages_after'])}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    parser.add_argument("--models", default=None,
                        help=f"comma-separated, of {', '.join(DATASETS)} (default: both)")
    parser.add_argument("--scenarios", default=None,
                        help=f"comma-separated, of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help="comma-separated recovery policies (default: replan,respipe)")
    parser.add_argument("--batches", type=int, default=None,
                        help="batches per run (default: " + ", ".join(
                            f"{m} {n}" for m, n in DEFAULT_BATCHES.items())
                        + "; 4-50 s each)")
    parser.add_argument("--microbatches", type=int, default=8, help="per batch (default 8)")
    parser.add_argument("--kill-at", type=float, default=1 / 3, metavar="FRACTION",
                        help="when to kill, as a fraction of the run's predicted length "
                             "(default 1/3)")
    parser.add_argument("--warmup", type=float, default=WARMUP_S, metavar="S",
                        help=f"seconds after the resumption left out of the throughput after "
                             f"(default {WARMUP_S:g})")
    parser.add_argument("--repartition-every", type=int, default=0, metavar="BATCHES",
                        help="dynamic re-partition checks (default 0: off, so the plan after "
                             "the recovery is the recovery's)")
    parser.add_argument("--chain-every", type=int, default=2, metavar="BATCHES",
                        help="batches between chain replicas (default 2, the product's)")
    parser.add_argument("--global-every", type=int, default=None, metavar="BATCHES",
                        help="batches between replicas uploaded to the server (default: the "
                             "run's batches / 10, at most the product's 10, so the server "
                             "holds a copy before the kill: two adjacent stages lost leave no "
                             "other copy of the first one's layers, and the run fails)")
    parser.add_argument("--plan", default="ftpipehd", metavar="PLANNER",
                        help="the planner of the plan trained, and of the replan policy's "
                             "recovery (default ftpipehd: every device, in order)")
    parser.add_argument("--base-slowdown", type=float, default=BASE_SLOWDOWN, metavar="X",
                        help=f"every agent's slowdown (default {BASE_SLOWDOWN:g}); the slow "
                             f"one runs {SLOW:g}x that")
    parser.add_argument("--no-calibration", dest="calibrate", action="store_false",
                        help="skip each model's first run, fault-free and a third as long, "
                             "which measures every device's fixed costs for the model in a "
                             "pipeline (later plans use them; without it the first measured "
                             "run is planned with the agents' idle probes)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: mlp only, the middle scenario (unless --models or "
                             "--scenarios say otherwise), shorter runs")
    parser.add_argument("--port", type=int, default=0, help="web server port (default: free)")
    parser.add_argument("--var", default=None, metavar="DIR",
                        help="state and logs here (default: a fresh temporary directory)")
    args = parser.parse_args(argv)
    models = ([m for m in args.models.split(",") if m] if args.models is not None
              else ["mlp"] if args.quick else list(DATASETS))
    scenarios = ([s for s in args.scenarios.split(",") if s] if args.scenarios is not None
                 else ["middle"] if args.quick else list(SCENARIOS))
    policies = [p for p in args.policies.split(",") if p]
    if any(m not in DATASETS for m in models) or not models:
        parser.error(f"--models: choose among {', '.join(DATASETS)}")
    if any(s not in SCENARIOS for s in scenarios) or not scenarios:
        parser.error(f"--scenarios: choose among {', '.join(SCENARIOS)}")
    if any(p not in POLICIES for p in policies) or not policies:
        parser.error(f"--policies: choose among {', '.join(POLICIES)}")
    if not 0 < args.kill_at < 1 or args.base_slowdown < 1 or args.microbatches < 1:
        parser.error("--kill-at must be in (0, 1), --base-slowdown at least 1, "
                     "--microbatches positive")
    counts = {m: args.batches or (QUICK_BATCHES if args.quick else DEFAULT_BATCHES)[m]
              for m in models}
    settings = {m: {"chain_every": args.chain_every,
                    "global_every": (args.global_every if args.global_every is not None
                                     else min(10, max(1, n // 10))),
                    "repartition_every": args.repartition_every} for m, n in counts.items()}
    var_dir = args.var or tempfile.mkdtemp(prefix="edgepipe-bench-faults-")
    Path(var_dir).mkdir(parents=True, exist_ok=True)
    say(f"state and logs in {var_dir} (logs: {Path(var_dir) / 'demo' / 'logs'})")
    setup(var_dir)
    from webapp.demo.scenario import DemoAgent, LocalTestbed

    b = args.base_slowdown
    agents = [DemoAgent("ft-fast-a", slowdown=b), DemoAgent(f"ft-slow{SLOW:g}x-b",
                                                            slowdown=b * SLOW),
              DemoAgent("ft-fast-c", slowdown=b), DemoAgent("ft-fast-d", slowdown=b)]
    rows: list[dict[str, Any]] = []
    began = time.monotonic()
    with LocalTestbed(agents=agents, port=args.port or free_port(), say=say) as testbed:
        testbed.measure_links()
        total = len(models) * len(scenarios) * len(policies)
        for model in models:
            spec = testbed.model_spec(model=model, dataset=DATASETS[model], batch_size=32)
            if args.calibrate:
                say(f"{model}: a calibration run")
                calibration_run(testbed, spec, model=model, planner=args.plan,
                                batches=max(1, counts[model] // 3),
                                microbatches=args.microbatches, settings=settings[model])
                restart_agents(testbed)
            for scenario in scenarios:
                for policy in policies:
                    say(f"[{len(rows) + 1}/{total}] {model}, kill {scenario}, {policy}")
                    row = fault_run(testbed, spec, model=model, scenario=scenario,
                                    policy=policy, planner=args.plan,
                                    batches=counts[model], microbatches=args.microbatches,
                                    kill_at=args.kill_at, warmup_s=args.warmup,
                                    settings=settings[model])
                    rows.append(row)
                    say(f"  -> {row['state']}, detected in {fmt(row['detection_s'], '.3f')} s "
                        f"({', '.join(str(x) for x in row['detected_by'])}), recovered in "
                        f"{fmt(row['recovery_s'], '.3f')} s; "
                        f"{fmt(row['throughput_before_sps'], '.0f')} -> "
                        f"{fmt(row['throughput_after_sps'], '.0f')} samples/s "
                        f"(optimal predicts {fmt(row['predicted_optimal_after_sps'], '.0f')})")
                    if len(rows) < total:
                        restart_agents(testbed)
    took = time.monotonic() - began

    print(f"\nFour agents ({', '.join(f'{a.name} {a.slowdown:g}x' for a in agents)}), "
          f"the {args.plan} plan, 1F1B, {args.microbatches} micro-batches of 32 a batch ("
          + ", ".join(f"{m} {n} batches, replicas every {settings[m]['chain_every']} (chain) "
                      f"and {settings[m]['global_every']} (server)"
                      for m, n in counts.items())
          + f"); killed at {args.kill_at:.2g} of the predicted run. Throughputs in samples/s: "
          f"before the kill, after the resumption, the optimal plan's prediction for the "
          f"survivors, ratio = after / optimal, plan = the recovery plan's prediction on the "
          f"profiles, a/plan = after / plan; wait = the cores' worth of time the surviving "
          f"agents' threads were ready to run but waited for a core, after the resumption.")
    print(HEADER)
    print("-" * len(HEADER))
    for row in rows:
        print(table_row(row))
    replan = [r for r in rows if r["policy"] == "replan"]
    recov = [r["recovery_s"] for r in rows if r["recovery_s"] is not None]
    ratios = {p: [r["after_over_optimal"] for r in rows if r["policy"] == p
                  and r["after_over_optimal"] is not None] for p in policies}
    unfinished = [r["run"] for r in rows if r["state"] != "finished"]
    print(f"\nrecovery: max {fmt(max(recov, default=None), '.3f')} s (target <= "
          f"{RECOVERY_TARGET_S:g} s); after / optimal: "
          + "; ".join(f"{p} min {fmt(min(v, default=None), '.2f')} mean "
                      f"{fmt(sum(v) / len(v) if v else None, '.2f')}"
                      for p, v in ratios.items())
          + f" (target >= {RATIO_TARGET:g} for replan); runs not finished: "
          + (", ".join(map(str, unfinished)) or "none") + f"; {took:.0f} s in all")
    print(json.dumps({
        "bench": "faults", "var_dir": var_dir,
        "agents": [{"name": a.name, "slowdown": a.slowdown} for a in agents],
        "batches": counts, "microbatches": args.microbatches, "kill_at": args.kill_at,
        "warmup_s": args.warmup, "plan": args.plan, "settings": settings,
        "seconds": round(took), "loadavg_1min_end": round(os.getloadavg()[0], 2),
        "recovery_s_max": max(recov, default=None),
        "recovery_s_max_replan": max((r["recovery_s"] for r in replan
                                      if r["recovery_s"] is not None), default=None),
        "after_over_optimal_min": {p: min(v, default=None) for p, v in ratios.items()},
        "all_finished": not unfinished,
        "meets_targets_replan": bool(replan) and all(
            r["state"] == "finished" and r["recovery_s"] is not None
            and r["recovery_s"] <= RECOVERY_TARGET_S and r["after_over_optimal"] is not None
            and r["after_over_optimal"] >= RATIO_TARGET for r in replan),
        "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
