"""PyTorch's own pipeline runtime on EdgePipe's zoo stages: the baseline of bench/peer.py.

One process per stage, gloo over 127.0.0.1, one torch thread each; each process builds the
zoo model with the seed the agents use, keeps its stage's layers (``ZooModel.stage``, the
cuts of the EdgePipe plan it is compared with) and trains them with
``torch.distributed.pipelining``: a ``PipelineStage`` driven by ``Schedule1F1B`` (synchronous
1F1B, EdgePipe's ``1f1b-sync``) or ``ScheduleGPipe``, ``microbatches`` micro-batches of
``batch_size`` per batch, cross-entropy averaged over the batch's micro-batches, plain SGD
after each batch. The data are the agents' (agent.data): batch b holds micro-batches
b x microbatches .. (b + 1) x microbatches - 1 of the run's seed, in order.

Each rank writes what it measured (the end of every batch and its CPU seconds by then, its
seconds in its stage's passes and update in each batch, the last stage's losses) as JSON,
and its stage's weights as safetensors when asked, to a directory the parent reads: nothing
crosses between the processes as pickle.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.spawned import run_spawned
from bench.testbed import free_port

TORCH_SCHEDULES = {"1f1b-sync": "Schedule1F1B", "gpipe": "ScheduleGPipe"}


@dataclass(frozen=True)
class TorchRun:
    """One training run of torch's pipeline runtime."""

    model: str
    dataset: str
    cuts: tuple[tuple[int, int], ...]  # each rank's layers, first..last inclusive
    schedule: str  # a key of TORCH_SCHEDULES
    microbatches: int
    batch_size: int
    batches: int
    lr: float
    seed: int = 0
    # the stage modules' memory format (agent.layout): torch's runtime as it comes uses NCHW;
    # "channels_last" gives it the layout EdgePipe's agents may choose, to tell the two apart
    layout: str = "contiguous"


@dataclass(frozen=True)
class TorchResult:
    batch_ends_s: tuple[float, ...]  # the last rank's batch ends, from the loop's start
    cpu_s: tuple[float, ...]  # each rank's CPU seconds over its training loop
    losses: tuple[float, ...]  # the mean loss of each batch
    # each rank's CPU seconds from the loop's start to the end of each batch
    batch_cpu_s: tuple[tuple[float, ...], ...] = ()
    # each rank's seconds in its stage's passes and update in each batch: the forwards and
    # backwards PipelineStage ran (forward_one_chunk, backward_one_chunk) and optimizer.step
    batch_pass_s: tuple[tuple[float, ...], ...] = ()

    @property
    def cpu_total_s(self) -> float:
        return sum(self.cpu_s)

    def steady_cpu_per_batch_s(self, skip: float = 0.2) -> float:
        """All ranks' CPU seconds per batch over the middle batches (leaving out the first
        and last ``skip`` of them, as :func:`steady_sps` does); the whole loop's when there
        are too few."""
        count = min((len(c) for c in self.batch_cpu_s), default=0)
        first, final = int(count * skip), count - 1 - int(count * skip)
        if final - first < 1:
            return self.cpu_total_s / max(1, len(self.batch_ends_s))
        return sum(c[final] - c[first] for c in self.batch_cpu_s) / (final - first)

    def steady_pass_per_batch_s(self, skip: float = 0.2) -> tuple[float, ...]:
        """Each rank's seconds in its passes and update per batch over the middle batches
        (the whole loop's when there are too few)."""
        out = []
        for per_batch in self.batch_pass_s:
            first, final = int(len(per_batch) * skip), len(per_batch) - int(len(per_batch) * skip)
            middle = per_batch[first:final] or per_batch
            out.append(sum(middle) / max(1, len(middle)))
        return tuple(out)


def steady_sps(ends: Sequence[float], samples_per_end: int, skip: float = 0.2) -> float:
    """Samples per second between completions, leaving out the first and last ``skip`` of them
    (fill and drain), as orchestrator.events.steady_throughput_sps does; 0 when too few."""
    ends = sorted(ends)
    first, final = int(len(ends) * skip), len(ends) - 1 - int(len(ends) * skip)
    if final - first < 1 or ends[final] <= ends[first]:
        return 0.0
    return (final - first) * samples_per_end / (ends[final] - ends[first])


def _sent_contiguous(module: Any) -> Any:
    """``module`` with its output and its input's gradient made contiguous: torch's
    PipelineStage sends both over gloo as they come, and gloo refuses a channels-last tensor
    ("input tensor has to be contiguous")."""
    import torch

    class GradContiguous(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            return grad.contiguous()

    class Sent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(GradContiguous.apply(x)).contiguous()

    return Sent()


def _rank_main(rank: int, world: int, port: int, run_json: str, out: str, save: bool) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    from torch.distributed import pipelining

    from agent.data import load_dataset
    from agent.layout import to_format
    from agent.zoo import build_model

    torch.set_num_threads(1)
    run = TorchRun(**{**json.loads(run_json), "cuts": tuple(
        tuple(c) for c in json.loads(run_json)["cuts"])})
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            init_method=f"tcp://127.0.0.1:{port}")
    try:
        data = load_dataset(run.dataset, seed=run.seed)
        model = build_model(run.model, input_shape=data.input_shape,
                            num_classes=data.num_classes, seed=run.seed)
        first, last = run.cuts[rank]
        layers = to_format(model.stage(first, last), run.layout)
        module = layers if run.layout == "contiguous" else _sent_contiguous(layers)
        stage = pipelining.PipelineStage(module, rank, world, torch.device("cpu"))
        schedule_class = getattr(pipelining, TORCH_SCHEDULES[run.schedule])
        schedule = schedule_class(stage, n_microbatches=run.microbatches,
                                  loss_fn=torch.nn.functional.cross_entropy)
        optimizer = torch.optim.SGD(module.parameters(), lr=run.lr)
        in_passes = [0.0]  # this batch's seconds in the stage's passes and update so far

        def timed(method: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                began = time.perf_counter()
                try:
                    return method(*args, **kwargs)
                finally:
                    in_passes[0] += time.perf_counter() - began
            return call

        # the schedules call these on the stage for each micro-batch's forward and backward
        stage.forward_one_chunk = timed(stage.forward_one_chunk)  # type: ignore[method-assign]
        stage.backward_one_chunk = timed(stage.backward_one_chunk)  # type: ignore[method-assign]
        step = timed(optimizer.step)
        passes: list[float] = []
        ends: list[float] = []
        cpus: list[float] = []
        batch_losses: list[float] = []
        dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        for b in range(run.batches):
            parts = [data.microbatch(m, run.batch_size, seed=run.seed)
                     for m in range(b * run.microbatches, (b + 1) * run.microbatches)]
            optimizer.zero_grad()
            in_passes[0] = 0.0
            if rank == 0:
                schedule.step(torch.cat([x for x, _ in parts]))
            elif rank == world - 1:
                losses: list[torch.Tensor] = []
                schedule.step(target=torch.cat([y for _, y in parts]), losses=losses)
                batch_losses.append(float(torch.stack(losses).detach().mean()))
            else:
                schedule.step()
            step()
            passes.append(in_passes[0])
            ends.append(time.perf_counter() - start)
            cpus.append(time.process_time() - cpu_start)
        cpu = time.process_time() - cpu_start
        dist.barrier()
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(
            {"ends": ends, "cpu_s": cpu, "cpus": cpus, "losses": batch_losses,
             "passes": passes}))
        if save:
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in layers.state_dict().items()},
                      str(Path(out) / f"rank{rank}.safetensors"))
    finally:
        dist.destroy_process_group()


def train_torch(run: TorchRun, *, weights_dir: Path | None = None,
                timeout_s: float = 600.0) -> TorchResult:
    """Train ``run`` on torch's pipeline runtime, one process per cut; with ``weights_dir``
    each rank leaves its stage's trained weights there as ``rank{r}.safetensors``."""
    if run.schedule not in TORCH_SCHEDULES:
        raise ValueError(f"torch has no {run.schedule!r} schedule to compare with; "
                         f"known: {', '.join(TORCH_SCHEDULES)}")
    if len(run.cuts) < 2:
        raise ValueError("torch's pipeline schedules need at least two stages")
    world = len(run.cuts)
    with tempfile.TemporaryDirectory(prefix="torchpipe-") as scratch:
        out = Path(weights_dir) if weights_dir is not None else Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        port = free_port()
        run_json = json.dumps(asdict(run))
        run_spawned([(f"torchpipe-{r}", _rank_main,
                      (r, world, port, run_json, str(out), weights_dir is not None))
                     for r in range(world)], timeout_s=timeout_s, what="torch's pipeline")
        measured: list[dict[str, Any]] = [json.loads((out / f"rank{r}.json").read_text())
                                          for r in range(world)]
    return TorchResult(batch_ends_s=tuple(measured[-1]["ends"]),
                       cpu_s=tuple(m["cpu_s"] for m in measured),
                       losses=tuple(measured[-1]["losses"]),
                       batch_cpu_s=tuple(tuple(m["cpus"]) for m in measured),
                       batch_pass_s=tuple(tuple(m["passes"]) for m in measured))
