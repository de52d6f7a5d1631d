"""How fast any pipeline runtime could train a model's cuts on this machine: each stage's
passes timed alone, and the lower bound on a batch's time they give (bench/peer.py's
"bound" column).

Every stage module of the cuts (``ZooModel.stage``, as the agents and torch's ranks build
them) is run in one fresh process with one torch thread, with nothing sent anywhere: each
micro-batch's forward through every stage in turn, its loss on the last (cross-entropy over
the batch's micro-batches, as both runtimes take it), its backward back through them, and one
SGD step per stage and batch. Each stage's forward and backward time per micro-batch (F_s,
B_s) and its update's per batch (U_s) are those of its fastest batch among the repetitions
after a warm-up: the bench times them on a machine where its own processes still run, and a
repetition slowed by them only ever reads slower. A model with convolutions is timed with its
parameters in NCHW and again channels last (agent.layout: an agent runs a stage in the
faster), and each time is the faster layout's.

A synchronous schedule (GPipe, 1F1B with a flush) runs a batch of M micro-batches on S
stages in no less than

    max over s of  F_0 + ... + F_{s-1} + M (F_s + B_s) + B_{s-1} + ... + B_0 + U_0

(stage s cannot start before the first micro-batch reaches it, must run all M forwards and
backwards, and the next batch starts on stage 0 only after the last gradient has come back to
it and it has applied its update), nor in less than the machine's cores can do all of it:
sum over s of (M (F_s + B_s) + U_s) / cores. An asynchronous 1F1B has no flush: only
max over s of M (F_s + B_s), and the cores' share. Sending costs nothing in the bound, so no
runtime, EdgePipe, torch or other, trains faster than it on these cuts and this machine.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.spawned import run_spawned


@dataclass(frozen=True)
class StageTimes:
    forward_s: float  # per micro-batch
    backward_s: float  # per micro-batch
    update_s: float  # per batch


def batch_bound_s(stages: Sequence[StageTimes], *, microbatches: int, cores: int,
                  synchronous: bool) -> float:
    """The least time a batch of ``microbatches`` can take on ``stages`` (see the module's
    docstring), sending free."""
    m = microbatches
    work = sum(m * (t.forward_s + t.backward_s) + t.update_s for t in stages) / cores
    if not synchronous:
        return max(work, max(m * (t.forward_s + t.backward_s) for t in stages))
    paths = [sum(t.forward_s + t.backward_s for t in stages[:s])
             + m * (stages[s].forward_s + stages[s].backward_s) + stages[0].update_s
             for s in range(len(stages))]
    return max(work, max(paths))


def _measure_main(spec_json: str, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    from agent.data import load_dataset
    from agent.layout import has_conv2d, to_format
    from agent.zoo import build_model

    torch.set_num_threads(1)
    spec = json.loads(spec_json)
    data = load_dataset(spec["dataset"], seed=0)
    model = build_model(spec["model"], input_shape=data.input_shape,
                        num_classes=data.num_classes, seed=0)
    modules = [to_format(model.stage(first, last), spec["layout"])
               for first, last in spec["cuts"]]
    if spec["layout"] != "contiguous" and not any(has_conv2d(m) for m in modules):
        Path(out).write_text("null")  # the same passes as in NCHW: nothing to time
        return
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in modules]
    m_count, warm = spec["microbatches"], spec["warmup"]
    parts = [data.microbatch(k, spec["batch_size"], seed=0) for k in range(m_count)]
    count = len(modules)
    forward, backward, update = [0.0] * count, [0.0] * count, [0.0] * count
    for rep in range(warm + spec["repetitions"]):
        kept = rep >= warm
        for optimizer in optimizers:
            optimizer.zero_grad()
        for x, y in parts:
            inputs, outputs, flowing = [], [], x
            for s, module in enumerate(modules):
                started = time.perf_counter()
                given = flowing.detach().requires_grad_(s > 0)
                produced = module(given)
                if s == count - 1:
                    produced = torch.nn.functional.cross_entropy(produced, y) / m_count
                forward[s] += (time.perf_counter() - started) * kept
                inputs.append(given)
                outputs.append(produced)
                flowing = produced
            gradient = None
            for s in reversed(range(count)):
                started = time.perf_counter()
                outputs[s].backward(gradient)
                gradient = inputs[s].grad
                backward[s] += (time.perf_counter() - started) * kept
        for s, optimizer in enumerate(optimizers):
            started = time.perf_counter()
            optimizer.step()
            update[s] += (time.perf_counter() - started) * kept
    reps = spec["repetitions"]
    Path(out).write_text(json.dumps([
        asdict(StageTimes(forward[s] / reps / m_count, backward[s] / reps / m_count,
                          update[s] / reps)) for s in range(count)]))


def stage_times(*, model: str, dataset: str, cuts: Sequence[Sequence[int]], microbatches: int,
                batch_size: int, repetitions: int = 50, warmup: int = 10, processes: int = 3,
                timeout_s: float = 300.0) -> list[StageTimes]:
    """Each stage's pass and update times for ``cuts`` of ``model``: the fastest of
    ``processes`` fresh processes with one torch thread each (the same passes ran 1.4 to 2.0
    ms in one process and another on this machine, each its own fastest batch), in each
    memory format a stage may run in (agent.layout: channels last only for convolutions),
    each stage's pass in the faster of them."""
    runs = []
    for layout in ("contiguous", "channels_last"):
        spec = json.dumps({"model": model, "dataset": dataset, "cuts": [list(c) for c in cuts],
                           "microbatches": microbatches, "batch_size": batch_size,
                           "repetitions": repetitions, "warmup": warmup, "layout": layout})
        for _ in range(processes):
            timed = _timed_once(model, spec, timeout_s)
            if timed is None:  # no convolution: channels last is NCHW
                break
            runs.append(timed)
    return [StageTimes(min(r[s].forward_s for r in runs), min(r[s].backward_s for r in runs),
                       min(r[s].update_s for r in runs)) for s in range(len(cuts))]


def _timed_once(model: str, spec: str, timeout_s: float) -> list[StageTimes] | None:
    with tempfile.TemporaryDirectory(prefix="edgepipe-bound-") as scratch:
        out = Path(scratch) / "times.json"
        run_spawned([("stage-times", _measure_main, (spec, str(out)))], timeout_s=timeout_s,
                    what=f"timing the stages of {model}")
        times = json.loads(out.read_text())
        return None if times is None else [StageTimes(**t) for t in times]
