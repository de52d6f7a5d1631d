"""EdgePipe's agents against PyTorch's own pipeline runtime, on the same model, cuts and data.

    .venv/bin/python bench/peer.py [--models mlp,vgg5] [--stages 2,3]
                                   [--schedules 1f1b-sync,gpipe,1f1b] [--pairs 3]
                                   [--batches N]

Starts the web server, a Celery worker and three agents on this machine (none slowed down, one
torch thread each), profiles each model on digits, then for every configuration (model x stage
count x schedule) runs ``--pairs`` pairs, alternating which side goes first: EdgePipe trains a
run of the ``uniform`` plan over the first S agents (equal layer counts, in order), and
``torch.distributed.pipelining`` trains the same cuts (bench/torchpipe.py: PipelineStage over
the zoo's stage modules, Schedule1F1B for ``1f1b-sync`` and ``ScheduleGPipe`` for ``gpipe``,
gloo on 127.0.0.1, one process per stage, one torch thread each). Both train batches of 8
micro-batches of 32 with plain SGD at the same learning rate, on the same micro-batches.
EdgePipe's agents run a convolutional stage with its weights channels last where they time
that faster (agent.layout); torch's ranks keep NCHW, as torch's runtime comes, unless
``--torch-layout channels_last`` gives them the same layout.
EdgePipe's asynchronous ``1f1b`` (PipeDream/FTPipeHD) is reported beside torch's Schedule1F1B,
which is synchronous.

Reported per configuration, with the spread over pairs: samples/s in the steady state (the
middle 60% of the last stage's completions) of each side and their ratio (measured side by
side, pair by pair); the most any runtime could train on these cuts here ("bound":
bench/bound.py, each stage's passes timed alone, sending free); CPU per micro-batch of each
system while it trains (EdgePipe: the web server, the worker and the agents between the
times a fifth and four fifths of the run's events were stored, read from the database every
half second; torch: its ranks over the middle 60% of their batches), of which EdgePipe's web
server (each of EdgePipe's process groups' share is on each pair's line and in the JSON as
``cpu_ms:<group>``); and the web server's cores per 1,000 timeline events a second, in that
window and, "(run)", over the whole run, whose start and end do not grow with the events;
the slowest stage's milliseconds a micro-batch in its passes and updates while it trains
("passes": EdgePipe's from the run's timeline events, torch's timed around PipelineStage's
forward_one_chunk, backward_one_chunk and the optimizer's step, the middle 60% of each; every
stage's in the JSON as ``*_pass_ms:<stage>``) beside the time between micro-batches
("period"), which tells the passes' own slowdown in the run from the runtime's gaps.
The JSON line also holds each system's CPU over the whole run (``_run``: EdgePipe's from the
run's start to its end, torch's over its training loop). The run's end is awaited in the
database, not through the web server's API, whose polling a user's page does not do. Prints
a table and, last, one JSON line. Runs on the embedded default, in a fresh var directory
whose path it prints.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bound import StageTimes, batch_bound_s, stage_times  # noqa: E402  (the path above makes them importable)
from bench.testbed import free_port, setup_django  # noqa: E402
from bench.torchpipe import TORCH_SCHEDULES, TorchRun, steady_sps, train_torch  # noqa: E402

SCHEDULES = ("1f1b-sync", "gpipe", "1f1b")
TORCH_FOR = {"1f1b-sync": "1f1b-sync", "gpipe": "gpipe", "1f1b": "1f1b-sync"}
DEFAULT_BATCHES = {"mlp": 600, "vgg5": 400}
MICROBATCHES, BATCH_SIZE, LR = 8, 32, 0.05


def group_cpu_s(pgids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) used so far by every live process of each process group
    (the testbed starts each child as a group leader, so a group is a child and everything it
    started: Celery's pool process, daphne's threads)."""
    tick = os.sysconf("SC_CLK_TCK")
    by_group = {pgid: name for name, pgid in pgids.items()}
    used = dict.fromkeys(pgids, 0.0)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        name = by_group.get(int(fields[2]))
        if name is not None:
            used[name] += (int(fields[11]) + int(fields[12])) / tick
    return used


@dataclass(frozen=True)
class Config:
    model: str
    stages: int
    schedule: str

    @property
    def label(self) -> str:
        return f"{self.model} {self.stages} stages {self.schedule}"


def train_edgepipe(testbed: Any, spec: int, config: Config, *, batches: int
                   ) -> dict[str, Any]:
    """One EdgePipe run of the uniform plan over the testbed's first ``config.stages`` agents:
    its cuts, steady samples/s, CPU seconds per process group over the run and event count."""
    from webapp.demo.scenario import chosen_plan
    from webapp.runs.models import Plan, Run, TimelineEvent
    from webapp.runs.summaries import run_summary

    compared = testbed.plan(spec, devices=testbed.devices[:config.stages],
                            algorithms=["uniform"], schedule=config.schedule,
                            name=f"peer: {config.label}", microbatches=MICROBATCHES,
                            batches=batches, chain_every=0, global_every=0,
                            repartition_every=0, lr=LR)
    row = chosen_plan(compared, "uniform")
    document = Plan.objects.get(pk=row["plan"]).document
    cuts = tuple(tuple(s["layers"]) for s in document["stages"])
    if len(cuts) != config.stages:
        raise SystemExit(f"{config.label}: the uniform plan has {len(cuts)} stages")
    groups = {name: child.process.pid for name, child in testbed.processes.children.items()}
    before = group_cpu_s(groups)
    testbed.start(compared["run"], row["plan"])
    samples = sampled_until_final(testbed, compared["run"], groups)
    after = group_cpu_s(groups)
    summary: dict[str, Any] = run_summary(run=Run.objects.get(pk=compared["run"]))
    if summary["state"] != "finished":
        raise SystemExit(f"{config.label}: the run ended {summary['state']}: "
                         f"{summary['error']}")
    cpu = {name: after[name] - before[name] for name in groups}
    events = TimelineEvent.objects.filter(run_id=compared["run"], kind__in=PASS_KINDS)
    passes = stage_pass_ms(events.values_list("stage", "microbatch", "start", "end"),
                           stages=config.stages, microbatches=batches * MICROBATCHES)
    return {"cuts": cuts, "sps": summary["throughput_steady_sps"], "cpu_s": cpu,
            "pass_ms": passes,
            "events": summary["events"], "makespan_s": summary["makespan_s"],
            "steady": steady_figures(samples, events_per_microbatch=summary["events"] / (
                batches * MICROBATCHES)),
            "loss_first": summary["loss_first"], "loss_last": summary["loss_last"]}


PASS_KINDS = ("forward", "backward", "update")


def stage_pass_ms(events: Iterable[tuple[int, int, float, float]], *, stages: int,
                  microbatches: int, skip: float = 0.2) -> list[float]:
    """Each stage's milliseconds a micro-batch in its passes and updates, from its timeline
    events (stage, micro-batch, start, end) of the middle micro-batches (leaving out the first
    and last ``skip`` of them: fill and drain)."""
    first, final = int(microbatches * skip), microbatches - int(microbatches * skip)
    busy = [0.0] * stages
    for stage, microbatch, start, end in events:
        if first <= microbatch < final:
            busy[stage] += end - start
    return [1e3 * b / max(1, final - first) for b in busy]


@dataclass(frozen=True)
class Sample:
    at_s: float  # monotonic
    cpu_s: Mapping[str, float]  # each process group's CPU seconds so far
    events: int  # the run's timeline events stored so far


def sampled_until_final(testbed: Any, run_id: int, groups: Mapping[str, int], *,
                        every_s: float = 0.5, timeout_s: float = 900.0) -> list[Sample]:
    """Wait for the run to end, reading its state and stored events from the database (not
    through the web server, whose cost is measured) and the CPU of every process group every
    ``every_s``."""
    from webapp.demo.scenario import FINAL_STATES
    from webapp.runs.models import Run, TimelineEvent

    samples: list[Sample] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        testbed.check_children()
        state = Run.objects.values_list("state", flat=True).get(pk=run_id)
        samples.append(Sample(time.monotonic(), group_cpu_s(groups),
                              TimelineEvent.objects.filter(run_id=run_id).count()))
        if state in FINAL_STATES:
            return samples
        time.sleep(every_s)
    raise SystemExit(f"run {run_id} did not end in {timeout_s:.0f} s")


def steady_figures(samples: Sequence[Sample], *, events_per_microbatch: float,
                   skip: float = 0.2) -> dict[str, float]:
    """What EdgePipe's processes used while the run trained: between the samples where the
    first ``skip`` and the last ``skip`` of its events had been stored (not its start,
    deployment and end, which torch's figures leave out too), the CPU ms per micro-batch of
    all of them and of the web server, the events stored per second and the web server's
    cores per 1,000 of them (0s when too few samples fall in between)."""
    final = samples[-1].events if samples else 0
    inside = [s for s in samples if skip * final <= s.events <= (1 - skip) * final]
    if (len(inside) < 2 or inside[-1].at_s <= inside[0].at_s
            or inside[-1].events <= inside[0].events or events_per_microbatch <= 0):
        return dict.fromkeys(("cpu_ms", "web_cpu_ms", "events_per_s", "web_cores",
                              "web_cores_per_1000_events_s"), 0.0)
    first, last = inside[0], inside[-1]
    span, stored = last.at_s - first.at_s, last.events - first.events
    used = {name: last.cpu_s[name] - first.cpu_s[name] for name in last.cpu_s}
    microbatches = stored / events_per_microbatch
    web_cores = used.get("web", 0.0) / span
    rate = stored / span
    return {"cpu_ms": 1e3 * sum(used.values()) / microbatches,
            **{f"cpu_ms:{name}": 1e3 * cpu / microbatches for name, cpu in used.items()},
            "web_cpu_ms": 1e3 * used.get("web", 0.0) / microbatches,
            "events_per_s": rate, "web_cores": web_cores,
            "web_cores_per_1000_events_s": 1000 * web_cores / rate}


def train_peer(config: Config, cuts: Sequence[tuple[int, int]], *, batches: int,
               layout: str = "contiguous") -> dict[str, Any]:
    run = TorchRun(model=config.model, dataset="digits", cuts=tuple(cuts),
                   schedule=TORCH_FOR[config.schedule], microbatches=MICROBATCHES,
                   batch_size=BATCH_SIZE, batches=batches, lr=LR, layout=layout)
    result = train_torch(run)
    return {"sps": steady_sps(result.batch_ends_s, MICROBATCHES * BATCH_SIZE),
            "pass_ms": [1e3 * s / MICROBATCHES for s in result.steady_pass_per_batch_s()],
            "cpu_s": result.cpu_total_s, "steady_cpu_s": result.steady_cpu_per_batch_s(),
            "loss_first": result.losses[0], "loss_last": result.losses[-1]}


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def pair_figures(ours: dict[str, Any], theirs: dict[str, Any], *, microbatches: int
                 ) -> dict[str, float]:
    """A pair's side-by-side figures: the throughput ratio; CPU ms per micro-batch of each
    system while it trained (EdgePipe's all processes, and its web server alone; torch's ranks
    over the middle batches) and over the whole run (``_run``: EdgePipe's from the run's start
    to its end, torch's over its training loop); the web server's cores per 1,000 events/s
    while the run trained, and over the whole run."""
    steady = ours["steady"]
    ours_cpu = sum(ours["cpu_s"].values())
    web_cpu = ours["cpu_s"].get("web", 0.0)
    events_per_s = ours["events"] / ours["makespan_s"] if ours["makespan_s"] else 0.0
    web_cores = web_cpu / ours["makespan_s"] if ours["makespan_s"] else 0.0
    return {"ratio": ours["sps"] / theirs["sps"] if theirs["sps"] else 0.0,
            "edgepipe_sps": ours["sps"], "torch_sps": theirs["sps"],
            "edgepipe_cpu_ms": steady["cpu_ms"],
            **{key: value for key, value in steady.items() if key.startswith("cpu_ms:")},
            "torch_cpu_ms": 1e3 * theirs["steady_cpu_s"] / MICROBATCHES,
            # the slowest stage's passes and updates a micro-batch while it trained, and the
            # time between micro-batches (the steady throughput's), of each system
            "edgepipe_pass_ms": max(ours["pass_ms"], default=0.0),
            "torch_pass_ms": max(theirs["pass_ms"], default=0.0),
            **{f"edgepipe_pass_ms:{k}": ms for k, ms in enumerate(ours["pass_ms"])},
            **{f"torch_pass_ms:{k}": ms for k, ms in enumerate(theirs["pass_ms"])},
            "edgepipe_period_ms": 1e3 * BATCH_SIZE / ours["sps"] if ours["sps"] else 0.0,
            "torch_period_ms": 1e3 * BATCH_SIZE / theirs["sps"] if theirs["sps"] else 0.0,
            "web_cpu_ms": steady["web_cpu_ms"],
            "events_per_s": steady["events_per_s"],
            "web_cores_per_1000_events_s": steady["web_cores_per_1000_events_s"],
            "edgepipe_cpu_ms_run": 1e3 * ours_cpu / microbatches,
            "torch_cpu_ms_run": 1e3 * theirs["cpu_s"] / microbatches,
            "web_cpu_ms_run": 1e3 * web_cpu / microbatches,
            "events_per_s_run": events_per_s,
            "web_cores_per_1000_events_s_run": (1000 * web_cores / events_per_s
                                                if events_per_s else 0.0)}


@functools.cache
def timed_stages(model: str, cuts: tuple[tuple[int, int], ...]) -> list[StageTimes]:
    """The stages' pass times of these cuts (bench/bound.py), timed once for all schedules."""
    return stage_times(model=model, dataset="digits", cuts=cuts, microbatches=MICROBATCHES,
                       batch_size=BATCH_SIZE)


def run_config(testbed: Any, spec: int, config: Config, *, pairs: int, batches: int,
               say: Callable[[str], None], torch_layout: str = "contiguous"
               ) -> dict[str, Any]:
    figures: list[dict[str, float]] = []
    cuts: tuple[tuple[int, int], ...] | None = None
    for k in range(pairs):
        if cuts is None or k % 2 == 0:  # alternate which side goes first
            ours = train_edgepipe(testbed, spec, config, batches=batches)
            theirs = train_peer(config, ours["cuts"], batches=batches, layout=torch_layout)
        else:
            theirs = train_peer(config, cuts, batches=batches, layout=torch_layout)
            ours = train_edgepipe(testbed, spec, config, batches=batches)
        if cuts is not None and ours["cuts"] != cuts:
            raise SystemExit(f"{config.label}: the uniform plan changed its cuts from {cuts} "
                             f"to {ours['cuts']}")
        cuts = ours["cuts"]
        pair = pair_figures(ours, theirs, microbatches=batches * MICROBATCHES)
        figures.append(pair)
        say(f"  {config.label} pair {k + 1}: EdgePipe {pair['edgepipe_sps']:.0f} sps, torch "
            f"{pair['torch_sps']:.0f} sps ({pair['ratio']:.2f}x); CPU/micro-batch "
            f"{pair['edgepipe_cpu_ms']:.2f} vs {pair['torch_cpu_ms']:.2f} ms ("
            + ", ".join(f"{key[7:]} {value:.2f}" for key, value in pair.items()
                        if key.startswith("cpu_ms:")) + ")")
    times = timed_stages(config.model, cuts or ())
    bound_s = batch_bound_s(times, microbatches=MICROBATCHES, cores=os.cpu_count() or 1,
                            synchronous=config.schedule != "1f1b")
    return {"model": config.model, "stages": config.stages, "schedule": config.schedule,
            "torch_schedule": TORCH_SCHEDULES[TORCH_FOR[config.schedule]],
            "cuts": [list(c) for c in cuts or ()], "pairs": figures,
            "stage_times_ms": [{k: 1e3 * v for k, v in asdict(t).items()} for t in times],
            "bound_sps": MICROBATCHES * BATCH_SIZE / bound_s,
            **{key: spread([f.get(key, 0.0) for f in figures]) for key in figures[0]}}


def table(rows: Sequence[dict[str, Any]]) -> str:
    header = (f"{'model':5} {'S':>1} {'schedule':9} {'torch':13} {'EdgePipe sps':>12} "
              f"{'torch sps':>9} {'bound':>6} {'ratio (min-max)':>16} {'CPU ms/mb EP':>12} "
              f"{'torch':>6} {'web':>5} {'ev/s':>6} {'web/1k ev/s':>11} {'(run)':>6} "
              f"{'passes ms EP':>12} {'torch':>6} {'period EP':>9} {'torch':>6}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['model']:5} {r['stages']:>1} {r['schedule']:9} {r['torch_schedule']:13} "
            f"{r['edgepipe_sps']['median']:>12.0f} {r['torch_sps']['median']:>9.0f} "
            f"{r['bound_sps']:>6.0f} "
            f"{r['ratio']['median']:>5.2f} ({r['ratio']['min']:.2f}-{r['ratio']['max']:.2f})"
            f" {r['edgepipe_cpu_ms']['median']:>12.2f} {r['torch_cpu_ms']['median']:>6.2f} "
            f"{r['web_cpu_ms']['median']:>5.2f} {r['events_per_s']['median']:>6.0f} "
            f"{r['web_cores_per_1000_events_s']['median']:>11.3f} "
            f"{r['web_cores_per_1000_events_s_run']['median']:>6.3f} "
            f"{r['edgepipe_pass_ms']['median']:>12.2f} {r['torch_pass_ms']['median']:>6.2f} "
            f"{r['edgepipe_period_ms']['median']:>9.2f} {r['torch_period_ms']['median']:>6.2f}")
    return "\n".join(lines)


def parse_list(text: str, known: Sequence[str], flag: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in items if t not in known]
    if unknown or not items:
        raise SystemExit(f"{flag}: {unknown[0] if unknown else 'nothing'} is not one of "
                         f"{', '.join(known)}")
    return items


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,vgg5", help="zoo models (default mlp,vgg5)")
    parser.add_argument("--stages", default="2,3", help="stage counts (default 2,3)")
    parser.add_argument("--schedules", default=",".join(SCHEDULES),
                        help=f"EdgePipe schedules (default {','.join(SCHEDULES)}; 1f1b is "
                             "compared with torch's Schedule1F1B, which is synchronous)")
    parser.add_argument("--pairs", type=int, default=3,
                        help="alternating EdgePipe/torch pairs per configuration (default 3)")
    parser.add_argument("--batches", type=int, default=None,
                        help="batches of 8 micro-batches per run (default: mlp "
                             f"{DEFAULT_BATCHES['mlp']}, vgg5 {DEFAULT_BATCHES['vgg5']})")
    parser.add_argument("--port", type=int, default=None, help="web server port (default: free)")
    parser.add_argument("--server-nice", type=int, default=None, metavar="N",
                        help="how much lower the web server's and worker's CPU priority is "
                             "than the agents' (default: the testbed's, "
                             "webapp.demo.scenario.SERVER_NICE; 0: the same)")
    parser.add_argument("--torch-layout", choices=("contiguous", "channels_last"),
                        default="contiguous",
                        help="the memory format of torch's stage modules (default contiguous, "
                             "NCHW, as torch's runtime comes; channels_last gives it the "
                             "layout EdgePipe's agents take where they time it faster)")
    args = parser.parse_args(argv)
    models = parse_list(args.models, ("mlp", "vgg5"), "--models")
    stages = [int(s) for s in parse_list(args.stages, ("2", "3"), "--stages")]
    schedules = parse_list(args.schedules, SCHEDULES, "--schedules")
    if args.pairs < 1 or (args.batches is not None and args.batches < 5):
        raise SystemExit("--pairs must be at least 1 and --batches at least 5")
    if args.server_nice is not None and args.server_nice < 0:
        raise SystemExit("--server-nice must be at least 0")
    var_dir = tempfile.mkdtemp(prefix="edgepipe-peer-")
    print(f"state and logs in {var_dir}", file=sys.stderr)
    setup_django(var_dir)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per poll of the run
    from webapp.demo.scenario import SERVER_NICE, DemoAgent, LocalTestbed

    def say(line: str) -> None:
        print(line, file=sys.stderr)

    agents = [DemoAgent(f"peer-{k}") for k in range(max(stages))]
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    server_nice = SERVER_NICE if args.server_nice is None else args.server_nice
    with LocalTestbed(agents=agents, port=args.port or free_port(), say=say,
                      server_nice=server_nice) as testbed:
        testbed.measure_links()
        for model in models:
            spec = testbed.model_spec(model=model, dataset="digits", batch_size=BATCH_SIZE)
            batches = args.batches or DEFAULT_BATCHES[model]
            for count in stages:
                for schedule in schedules:
                    rows.append(run_config(testbed, spec, Config(model, count, schedule),
                                           pairs=args.pairs, batches=batches, say=say,
                                           torch_layout=args.torch_layout))
    print(table(rows))
    print(json.dumps({"bench": "peer", "microbatches": MICROBATCHES, "batch_size": BATCH_SIZE,
                      "lr": LR, "pairs": args.pairs, "torch_layout": args.torch_layout,
                      "server_nice": server_nice,
                      "wall_s": time.monotonic() - started,
                      "configs": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
