"""The PipeLearn demo (``manage.py demo --pipelearn``): a local testbed of one fast server and
a few devices of varied speed and links, a model profiled on every one, a PipeLearn run
created through POST /api/runs/pipelearn/ and planned with PipeLearn and its baselines SFL
and FL (each device's split P and parallel batch number N, and the predicted epoch time), one
method trained. Headless, it waits for the run's end and returns its summary
(webapp.runs.pipelearn_selectors.pipelearn_summary) with each epoch's held-out accuracy, the
measured epoch time against the predicted one and each device's and the server's idle share.
bench/pipelearn_runtime.py trains the three methods one after the other with these
functions."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.zoo import MODELS
from orchestrator.pipelearn_plan import METHODS
from orchestrator.schedule import MAX_MICROBATCHES
from webapp.demo.client import DemoError, option_error
from webapp.demo.demo import stop_run, timed
from webapp.demo.scenario import FINAL_STATES, DemoAgent, LocalTestbed, chosen_plan
from webapp.demo.split import plan_split_run, wait_evaluated
from webapp.demo.triggers import When
from webapp.runs.models import LR_MAX, MOMENTUM_MAX, Run
from webapp.runs.models import TimelineEvent as TimelineRow
from webapp.runs.pipelearn_selectors import pipelearn_summary

MAX_DEVICES = 15  # each agent is a process with torch loaded, on this machine (and the server)
MAX_BATCH = 4096  # B (webapp.runs.services.pipelearn.MAX_BATCH)
SERVER = "pl-server"
# the devices, in turn: (slowdown, link Mbit/s or None: this machine's, latency ms), as the
# split demo's clients
DEVICE_KINDS = ((1.0, None, 0.0), (2.0, 20.0, 5.0), (3.0, None, 0.0), (1.5, 50.0, 2.0))


def device_agents(count: int, *, slowdown: float = 1.0) -> tuple[DemoAgent, ...]:
    """``count`` devices of the DEVICE_KINDS in turn, each ``slowdown`` times slower still
    (names unlike the other demos': an agent keeps its enrolment under
    var/demo/agents/<name>)."""
    agents = []
    for k in range(count):
        kind, link, latency = DEVICE_KINDS[k % len(DEVICE_KINDS)]
        agents.append(DemoAgent(f"pl-device-{k + 1}", slowdown=kind * slowdown,
                                bandwidth_mbps=link, latency_ms=latency))
    return tuple(agents)


def server_agent(*, slowdown: float = 1.0) -> DemoAgent:
    return DemoAgent(SERVER, slowdown=slowdown)


@dataclass(frozen=True)
class PipelearnDemoOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "mlp"
    dataset: str = "digits"
    batch_size: int = 32  # B, the samples of one iteration of a device
    devices: int = 4
    batches: int = 10  # iterations of every device an epoch
    epochs: int = 3
    method: str = "pipelearn"  # the plan trained
    shard_split: str = "iid"
    lr: float | None = None
    momentum: float | None = None
    headless: bool = False
    run_timeout_s: float = 900.0
    kill_agents: tuple[str, ...] = ()  # fault injection: these agents are killed (SIGKILL)
    kill_agent_at_batch: int | None = None  # once some device trained this many micro-batches


# the API's fields (POST /api/runs/pipelearn/) by the demo's options
OPTION_OF_FIELD = {"batch_size": "--batch-size", "batches": "--batches", "epochs": "--epochs",
                   "shard_split": "--shard-split", "algorithms": "--method",
                   "clients": "--devices", "server": "--devices", "lr": "--lr",
                   "momentum": "--momentum", "model_spec": "--model", "model": "--model",
                   "dataset": "--dataset"}


def check_options(o: PipelearnDemoOptions) -> None:
    """What the demo checks itself, before any process starts (the rest goes to the API,
    whose 400 answer option_error names)."""
    if not 1 <= o.devices <= MAX_DEVICES:
        raise DemoError(f"--devices must be from 1 to {MAX_DEVICES} (each a process with torch "
                        f"loaded, beside the server's), got {o.devices}")
    if o.model not in MODELS:  # an agent refuses to profile another, and the demo would wait
        raise DemoError(f"--model must be one of {', '.join(MODELS)}, got {o.model!r}")
    if o.method not in METHODS:
        raise DemoError(f"--method must be {', '.join(METHODS)}, got {o.method!r}")
    if not 1 <= o.batch_size <= MAX_BATCH:
        raise DemoError(f"--batch-size must be from 1 to {MAX_BATCH}, got {o.batch_size}")
    if o.batches < 1:
        raise DemoError(f"--batches must be at least 1 (iterations an epoch), got {o.batches}")
    if o.epochs < 1:
        raise DemoError(f"--epochs must be at least 1, got {o.epochs}")
    if o.batch_size * o.batches * o.epochs > MAX_MICROBATCHES:
        raise DemoError(f"--epochs and --batches: {o.epochs:,} epochs of {o.batches:,} "
                        f"iterations of up to {o.batch_size} micro-batches make more than "
                        f"the {MAX_MICROBATCHES:,} micro-batches a run trains")
    if o.lr is not None and not 0 < o.lr <= LR_MAX:
        raise DemoError(f"--lr must be above 0 and at most {LR_MAX:g}, got {o.lr:g}")
    if o.momentum is not None and not 0 <= o.momentum <= MOMENTUM_MAX:
        raise DemoError(f"--momentum must be from 0 to {MOMENTUM_MAX}, got {o.momentum:g}")
    names = {a.name for a in (server_agent(), *device_agents(o.devices))}
    for name in o.kill_agents:
        if name not in names:
            raise DemoError(f"--kill-agent: no agent named {name!r}; the agents: "
                            f"{', '.join(sorted(names))}")
    if bool(o.kill_agents) != (o.kill_agent_at_batch is not None):
        raise DemoError("--kill-agent NAME and --kill-agent-at-batch N go together with "
                        "--pipelearn")


def create_pipelearn_run(testbed: LocalTestbed, o: PipelearnDemoOptions, spec: int,
                         server: dict[str, Any], devices: list[dict[str, Any]],
                         algorithms: tuple[str, ...] = METHODS, label: str = "demo") -> int:
    """POST /api/runs/pipelearn/: the run's id; a setting the API refuses is a DemoError
    naming the demo's option."""
    payload: dict[str, Any] = {
        "name": f"{label}: pipelearn {o.model} on {o.dataset}, {len(devices)} devices",
        "model_spec": spec, "server": server["id"], "clients": [d["id"] for d in devices],
        "algorithms": list(algorithms), "batch_size": o.batch_size, "batches": o.batches,
        "epochs": o.epochs, "shard_split": o.shard_split}
    for setting, value in (("lr", o.lr), ("momentum", o.momentum)):
        if value is not None:
            payload[setting] = value
    try:
        return int(testbed.api.post("/api/runs/pipelearn/", payload)["id"])
    except DemoError as exc:
        raise option_error(exc, OPTION_OF_FIELD) from None


def plan_pipelearn_run(testbed: LocalTestbed, run_id: int) -> dict[str, Any]:
    """Plan the run with each of its methods (as the split demo does); the plans'
    comparison, with each method's plan document under ``documents`` (by method)."""
    compared = plan_split_run(testbed, run_id)
    plans = testbed.api.get(f"/api/runs/{run_id}/plans/")
    compared["documents"] = {p["algorithm"]: p.get("document") or {} for p in plans}
    return compared


def profile_microbatches(testbed: LocalTestbed, options: PipelearnDemoOptions,
                         document: dict[str, Any], clients: list[dict[str, Any]]) -> list[str]:
    """Have each device whose micro-batches differ from B profile the model at their size,
    one device at a time (LocalTestbed.model_spec), before the run: the profile keeps this
    machine's warm times at that size, by which the emulated device paces its passes. Without
    it every device measures them when the run is deployed, all at once on this machine's
    shared cores, up to 3x what they are alone, and runs that much slower than the profile
    the plan was made with (docs/benchmarks.md, "PipeLearn trained against FL and SFL"). The
    devices profiled, by name and size."""
    done = []
    for client in clients:
        mine = (document.get("devices") or {}).get(client["uid"]) or {}
        size = int(mine.get("minibatch") or options.batch_size)
        if size != options.batch_size:
            testbed.model_spec(model=options.model, dataset=options.dataset, batch_size=size,
                               devices=[client])
            done.append(f"{client['name']} ({size})")
    return done


def describe_plans(compared: dict[str, Any], names: dict[str, str]) -> list[str]:
    """Per method its predicted epoch time and each device's P and N (and B // N)."""
    lines = []
    by_method = {row["algorithm"]: row for row in compared["rows"]}
    for method in METHODS:
        row = by_method.get(method)
        if row is None:
            continue
        document = compared["documents"].get(method) or {}
        if row["status"] != "done" or not document:
            lines.append(f"  {method:<9} {row['status']}: {row['error'] or '-'}")
            continue
        devices = document.get("devices") or {}
        per_device = ", ".join(
            f"{names.get(uid, uid)} P={d['split']} N={d['parallel_batches']}"
            f" (micro-batches of {d['minibatch']})"
            for uid, d in devices.items())
        lines.append(f"  {method:<9} predicted epoch {document['epoch_s']:.3f} s: {per_device}")
    return lines


COMPUTE_KINDS = ("forward", "backward", "update", "aggregate")


def _document(run: Run) -> dict[str, Any]:
    plan = run.chosen_plan
    return plan.document if plan is not None and isinstance(plan.document, dict) else {}


def epoch_ends(run: Run) -> list[float]:
    """When each epoch ended on the whole testbed: the last compute event (pass, update,
    FedAvg) of the epoch's micro-batches over every pipeline, on the run's clock. The run
    summary's epochs end with the FedAvgs alone, and a device that shares its layer range
    with no other has none (its pipeline is in no aggregation group): its epochs are left
    out there, here not."""
    counts = (_document(run).get("run_plan") or {}).get("microbatches") or []
    ends: dict[int, float] = {}
    rows = TimelineRow.objects.filter(run=run, kind__in=COMPUTE_KINDS).values_list(
        "pipeline", "microbatch", "end")
    for pipeline, microbatch, end in rows:
        if pipeline < len(counts):
            k = microbatch // max(1, int(counts[pipeline]) // max(1, run.epochs))
            ends[k] = max(ends.get(k, 0.0), end)
    out: list[float] = []
    for k in sorted(e for e in ends if e < run.epochs):
        out.append(max(ends[k], out[-1] if out else 0.0))
    return out


def unaveraged(run: Run) -> list[str]:
    """The parts FedAvg never averages: ``"<device>"`` (its own layers) or ``"<server> for
    <device>"`` (the server's copy of its rest) in no aggregation group of the plan, as when
    no other device has the same split P."""
    document = _document(run)
    run_plan = document.get("run_plan") or {}
    clients = list(document.get("clients") or [])
    grouped = {tuple(m) for g in run_plan.get("groups") or [] for m in g.get("members") or []}
    out = []
    for j, pipeline in enumerate(run_plan.get("pipelines") or []):
        for k, stage in enumerate(pipeline.get("stages") or []):
            if (j, k) not in grouped and j < len(clients):
                out.append(clients[j] if k == 0 else f"{stage['devices'][0]} for {clients[j]}")
    return out


def idle_fractions(summary: dict[str, Any]) -> dict[str, float]:
    """Each device's idle share of its busy and idle time over the run (the server's too)."""
    out = {}
    for device, idle in (summary.get("idle_s") or {}).items():
        total = idle["busy_s"] + idle["idle_s"]
        out[device] = idle["idle_s"] / total if total > 0 else math.nan
    return out


def with_figures(summary: dict[str, Any], run: Run) -> dict[str, Any]:
    """The summary with each epoch's time on the whole testbed (``epoch_s_testbed``, from
    epoch_ends, and its median), measured over predicted (``epoch_ratio``, the median
    epoch's), the parts no FedAvg averages (``unaveraged``) and each device's idle share
    (``idle_fraction``)."""
    ends = epoch_ends(run)
    spans = [b - a for a, b in zip([0.0, *ends[:-1]], ends, strict=True)]
    median = statistics.median(spans) if spans else None
    predicted = summary.get("epoch_s_predicted")
    return {**summary, "epoch_s_testbed": spans, "epoch_s_testbed_median": median,
            "epoch_ratio": median / predicted if median and predicted else None,
            "unaveraged": unaveraged(run), "idle_fraction": idle_fractions(summary)}


def describe_summary(summary: dict[str, Any], names: dict[str, str]) -> list[str]:
    """Each epoch's held-out accuracy and time; measured against predicted; idle shares."""
    lines = []
    accuracy = summary.get("test_accuracy") or []
    for k, epoch_s in enumerate(summary.get("epoch_s_testbed") or []):
        held = (f", held-out accuracy {accuracy[k]:.1%}" if k < len(accuracy)
                and accuracy[k] is not None else "")
        lines.append(f"  epoch {k + 1}: {epoch_s:.3f} s{held}")
    if summary.get("epoch_ratio") is not None:
        lines.append(f"  epoch time: measured {summary['epoch_s_testbed_median']:.3f} s "
                     f"(median), predicted {summary['epoch_s_predicted']:.3f} s (x"
                     f"{summary['epoch_ratio']:.2f})")
    if summary.get("unaveraged"):
        lines.append("  averaged by no FedAvg (no other device has the same split): " + ", ".join(
            " for ".join(names.get(u, u) for u in part.split(" for "))
            for part in summary["unaveraged"]))
        if summary.get("epoch_s_median") is not None:
            lines.append(f"  (the run summary's epochs, FedAvgs only: median "
                         f"{summary['epoch_s_median']:.3f} s)")
    server = summary.get("server")
    shares = summary.get("idle_fraction") or {}
    for device in sorted(shares, key=lambda d: (d == server, names.get(d, d))):
        role = " (server)" if device == server else ""
        lines.append(f"  idle {names.get(device, device)}{role}: {shares[device]:.1%}")
    return lines


def train_plan(testbed: LocalTestbed, run_id: int, plan_id: int, *, timeout_s: float,
               say: Callable[[str], None],
               kill: tuple[tuple[DemoAgent, ...], int] | None = None) -> dict[str, Any]:
    """Start the plan, wait for the run's end and its epochs' held-out accuracy (as the split
    demo waits for its rounds'); the summary with_figures. ``kill``: agents killed (SIGKILL)
    once some device has trained that many micro-batches."""
    testbed.start(run_id, plan_id)
    if kill is not None:
        when = When(batches=kill[1])
        say(f"fault injection: {', '.join(a.name for a in kill[0])} will be killed once a "
            f"device has trained {kill[1]} micro-batches")
        testbed.kill_agent_at(run_id, list(kill[0]), when)
    testbed.wait_state(run_id, FINAL_STATES, timeout_s)
    wait_evaluated(testbed, run_id, say)
    run = Run.objects.get(pk=run_id)
    return with_figures(pipelearn_summary(run=run), run)


def run_pipelearn_demo(options: PipelearnDemoOptions, *, say: Callable[[str], None] = print
                       ) -> dict[str, Any] | None:
    """The PipeLearn demo. Headless, it returns the run's summary (with_figures); otherwise it
    trains the run and then waits until interrupted."""
    o = options
    check_options(o)
    devices = device_agents(o.devices)
    say = timed(say)
    with LocalTestbed(agents=(server_agent(), *devices), host=o.host, port=o.port,
                      say=say) as testbed:
        server, clients = testbed.devices[0], testbed.devices[1:]
        names = {d["uid"]: d["name"] for d in testbed.devices}
        try:
            spec = int(testbed.api.post("/api/model-specs/", {
                "model": o.model, "dataset": o.dataset, "batch_size": o.batch_size})["id"])
        except DemoError as exc:
            raise option_error(exc, OPTION_OF_FIELD) from None
        # the settings go to the API first: a refused one ends the demo before any work
        run_id = create_pipelearn_run(testbed, o, spec, server, clients)
        links = testbed.measure_links()
        say(f"a server and {len(clients)} devices online, {len(links)} links measured; "
            f"profiling {o.model} on {o.dataset}")
        testbed.model_spec(model=o.model, dataset=o.dataset, batch_size=o.batch_size)
        say(f"PipeLearn run {run_id}: {o.epochs} epochs of {o.batches} iterations of "
            f"{o.batch_size} samples on every device ({o.shard_split} shards), FedAvg after "
            "each; planning PipeLearn, SFL and FL")
        compared = plan_pipelearn_run(testbed, run_id)
        for line in describe_plans(compared, names):
            say(line)
        row = chosen_plan(compared, o.method)
        profiled = profile_microbatches(testbed, o, compared["documents"][o.method], clients)
        if profiled:
            say("profiled at their micro-batch size (the emulated devices pace by it): "
                + ", ".join(profiled))
        say(f"starting the {o.method} plan" + (
            ": every device trains the whole model" if o.method == "fl" else
            f": {server['name']} trains a copy of every device's last layers"))
        if not o.headless:
            testbed.start(run_id, row["plan"])
            say(f"training: open {testbed.url}/runs/{run_id}/ to watch it live; Ctrl-C stops "
                "the demo")
            try:
                while True:
                    testbed.check_children()
                    time.sleep(1.0)
            except KeyboardInterrupt:
                stop_run(testbed, run_id, say)
                raise
        kill = ((tuple(testbed.agent_named(n) for n in o.kill_agents), o.kill_agent_at_batch)
                if o.kill_agents and o.kill_agent_at_batch is not None else None)
        summary = train_plan(testbed, run_id, row["plan"], timeout_s=o.run_timeout_s, say=say,
                             kill=kill)
        if summary["state"] != Run.State.FINISHED:
            say(f"  the run ended {summary['state']}: {summary['error']}")
        for line in describe_summary(summary, names):
            say(line)
        return summary
