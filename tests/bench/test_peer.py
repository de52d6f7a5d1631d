"""bench/peer.py and its baseline, bench/torchpipe.py: torch's pipeline runtime trains exactly
the zoo model the agents train (the same cuts, micro-batches and SGD), and the bench's figures
(CPU of a process group, throughput, ratios) are what they say."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agent.data import load_dataset
from agent.zoo import build_model
from bench.peer import Sample, group_cpu_s, main, pair_figures, stage_pass_ms, steady_figures
from bench.torchpipe import TorchResult, TorchRun, steady_sps, train_torch

BUSY_FOR_HALF_A_CPU_SECOND = """
import time
while time.process_time() < 0.5:
    pass
time.sleep(60)
"""


def reference_weights(run: TorchRun) -> dict[str, torch.Tensor]:
    """The whole model trained in one process: each batch's loss is the mean of its
    micro-batches' mean cross-entropies, then one SGD step."""
    data = load_dataset(run.dataset, seed=run.seed)
    model = build_model(run.model, input_shape=data.input_shape, num_classes=data.num_classes,
                        seed=run.seed).full()
    optimizer = torch.optim.SGD(model.parameters(), lr=run.lr)
    for b in range(run.batches):
        optimizer.zero_grad()
        losses = []
        for m in range(b * run.microbatches, (b + 1) * run.microbatches):
            x, y = data.microbatch(m, run.batch_size, seed=run.seed)
            losses.append(torch.nn.functional.cross_entropy(model(x), y))
        torch.stack(losses).mean().backward()
        optimizer.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1f1b-sync", "gpipe"])
def test_torchs_pipeline_trains_the_model_one_process_would(tmp_path: Path, schedule: str):
    # Execute: two ranks over the MLP's four layers, three batches of four micro-batches
    run = TorchRun(model="mlp", dataset="digits", cuts=((0, 1), (2, 3)), schedule=schedule,
                   microbatches=4, batch_size=16, batches=3, lr=0.5)
    result = train_torch(run, weights_dir=tmp_path)

    # Assert: each rank's layers end where the single-process training ends them (the state
    # dict's keys are the layer's index within the stage: rank 1's "0." is layer 2)
    expected = reference_weights(run)
    for rank, (first, _) in enumerate(run.cuts):
        trained = load_file(str(tmp_path / f"rank{rank}.safetensors"))
        assert trained
        for key, value in trained.items():
            index, rest = key.split(".", 1)
            torch.testing.assert_close(value, expected[f"{int(index) + first}.{rest}"],
                                       rtol=1e-5, atol=1e-6)
    assert len(result.batch_ends_s) == 3 and len(result.losses) == 3
    assert list(result.batch_ends_s) == sorted(result.batch_ends_s)
    assert len(result.cpu_s) == 2 and all(c > 0 for c in result.cpu_s)
    # each rank's passes and update took time in every batch, a part of the loop's
    assert [len(p) for p in result.batch_pass_s] == [3, 3]
    assert all(s > 0 for p in result.batch_pass_s for s in p)
    assert all(sum(p) < result.batch_ends_s[-1] for p in result.batch_pass_s)


@pytest.mark.slow
def test_torchs_pipeline_trains_vgg5_channels_last_as_one_process_would(tmp_path: Path):
    # --torch-layout channels_last: gloo refuses to send a channels-last tensor, so the
    # stages' outputs and inputs' gradients are made contiguous; the model trained is the same
    run = TorchRun(model="vgg5", dataset="digits", cuts=((0, 1), (2, 4)),
                   schedule="1f1b-sync", microbatches=4, batch_size=16, batches=3, lr=0.5,
                   layout="channels_last")
    result = train_torch(run, weights_dir=tmp_path)
    expected = reference_weights(run)
    for rank, (first, _) in enumerate(run.cuts):
        trained = load_file(str(tmp_path / f"rank{rank}.safetensors"))
        # the weights; not the batch norms' running statistics, which PipelineStage's shape
        # inference moves by one forward more (num_batches_tracked 13 for 12 micro-batches)
        weights = {k: v for k, v in trained.items() if k.endswith(("weight", "bias"))}
        assert weights
        for key, value in weights.items():
            index, rest = key.split(".", 1)
            torch.testing.assert_close(value, expected[f"{int(index) + first}.{rest}"],
                                       rtol=1e-4, atol=1e-5)
    assert len(result.losses) == 3


def test_torch_has_no_asynchronous_1f1b_and_needs_two_stages():
    with pytest.raises(ValueError, match="no '1f1b' schedule"):
        train_torch(TorchRun(model="mlp", dataset="digits", cuts=((0, 1), (2, 3)),
                             schedule="1f1b", microbatches=4, batch_size=8, batches=1, lr=0.1))
    with pytest.raises(ValueError, match="at least two stages"):
        train_torch(TorchRun(model="mlp", dataset="digits", cuts=((0, 3),), schedule="gpipe",
                             microbatches=4, batch_size=8, batches=1, lr=0.1))


def test_a_process_groups_cpu_counts_its_busy_process_and_not_an_idle_one():
    busy = subprocess.Popen([sys.executable, "-c", BUSY_FOR_HALF_A_CPU_SECOND],
                            process_group=0)
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            process_group=0)
    try:
        groups = {"busy": busy.pid, "idle": idle.pid}
        used = group_cpu_s(groups)
        deadline_polls = 0
        while used["busy"] < 0.45 and deadline_polls < 600:  # up to a minute on a loaded box
            subprocess.run(["sleep", "0.1"], check=True)
            used, deadline_polls = group_cpu_s(groups), deadline_polls + 1
        assert used["busy"] >= 0.45, used  # clock ticks round it down
        assert used["idle"] < 0.3, used
        assert group_cpu_s({"gone": 2**22 + 12345}) == {"gone": 0.0}
    finally:
        for process in (busy, idle):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_steady_throughput_leaves_out_fill_and_drain():
    # ten completions: a slow first (fill) and last (drain), one a second in between
    ends = [5.0, 6, 7, 8, 9, 10, 11, 12, 13, 30]
    assert steady_sps(ends, 256) == pytest.approx(256.0)  # completions 2..7 of 0..9
    assert steady_sps([1.0], 256) == 0.0 and steady_sps([2.0, 2.0], 256) == 0.0


def test_a_pairs_figures():
    ours = {"sps": 3000.0, "cpu_s": {"web": 1.0, "worker": 0.2, "agent-peer-0": 3.0},
            "events": 20_000, "makespan_s": 10.0, "pass_ms": [2.0, 2.5],
            "steady": {"cpu_ms": 4.5, "cpu_ms:web": 1.0, "cpu_ms:agent-peer-0": 3.5,
                       "web_cpu_ms": 1.0, "events_per_s": 2000.0,
                       "web_cores": 0.08, "web_cores_per_1000_events_s": 0.04}}
    theirs = {"sps": 2500.0, "cpu_s": 3.2, "steady_cpu_s": 0.024, "pass_ms": [2.25, 1.0]}
    pair = pair_figures(ours, theirs, microbatches=800)
    # the slowest stage's passes, each stage's, and the time between micro-batches of 32
    assert (pair["edgepipe_pass_ms"], pair["torch_pass_ms"]) == (2.5, 2.25)
    assert pair["edgepipe_pass_ms:0"] == 2.0 and pair["torch_pass_ms:1"] == 1.0
    assert pair["edgepipe_period_ms"] == pytest.approx(32 / 3.0)
    assert pair["torch_period_ms"] == pytest.approx(32 / 2.5)
    assert pair["ratio"] == pytest.approx(1.2)
    assert pair["edgepipe_cpu_ms"] == 4.5 and pair["web_cpu_ms"] == 1.0
    assert pair["cpu_ms:agent-peer-0"] == 3.5
    assert pair["torch_cpu_ms"] == pytest.approx(3.0)  # 24 ms a batch of 8
    assert pair["web_cores_per_1000_events_s"] == 0.04
    assert pair["edgepipe_cpu_ms_run"] == pytest.approx(4200 / 800)
    assert pair["torch_cpu_ms_run"] == pytest.approx(4.0)
    assert pair["web_cpu_ms_run"] == pytest.approx(1.25)
    # 0.1 of a core taking in 2,000 events/s: 0.05 cores per 1,000 events/s
    assert pair["web_cores_per_1000_events_s_run"] == pytest.approx(0.05)


def test_the_steady_figures_leave_out_the_runs_start_and_end():
    # busy at the start (deploying) and at the end; in between the web server used 0.1 of a
    # core and the agent 0.4 while 1,000 events a second were stored, 10 per micro-batch
    def sample(at: float, web: float, agent: float, events: int) -> Sample:
        return Sample(at, {"web": web, "agent-peer-0": agent}, events)

    samples = [sample(0.0, 0.0, 0.0, 0), sample(1.0, 0.9, 0.9, 0), sample(2.0, 1.0, 1.0, 1000),
               sample(3.0, 1.1, 1.4, 2000), sample(4.0, 1.2, 1.8, 3000),
               sample(5.0, 1.3, 2.2, 4000), sample(6.0, 2.5, 3.0, 5000)]
    steady = steady_figures(samples, events_per_microbatch=10.0)
    assert steady["web_cores"] == pytest.approx(0.1)
    assert steady["events_per_s"] == pytest.approx(1000.0)
    assert steady["web_cores_per_1000_events_s"] == pytest.approx(0.1)
    assert steady["cpu_ms"] == pytest.approx(5.0)  # 0.5 cores over 100 micro-batches a second
    assert steady["web_cpu_ms"] == pytest.approx(1.0)
    # each process group's share, which the pair's figures carry on
    assert steady["cpu_ms:web"] == pytest.approx(1.0)
    assert steady["cpu_ms:agent-peer-0"] == pytest.approx(4.0)
    assert steady_figures(samples[:2], events_per_microbatch=10.0)["cpu_ms"] == 0.0


def test_a_stages_pass_times_leave_out_fill_and_drain():
    # 10 micro-batches: 2..7 count; stage 1's forward of 1 and backward of 8 do not
    events = [(0, m, 1.0 * m, 1.0 * m + 0.002) for m in range(10)]
    events += [(1, 1, 0.0, 5.0), (1, 4, 0.0, 0.003), (1, 4, 1.0, 1.003), (1, 8, 0.0, 5.0)]
    assert stage_pass_ms(events, stages=3, microbatches=10) == pytest.approx([2.0, 1.0, 0.0])


def test_torchs_steady_cpu_leaves_out_the_first_and_last_batches():
    result = TorchResult(batch_ends_s=tuple(float(b) for b in range(1, 11)), cpu_s=(9.0, 4.0),
                         losses=(1.0,) * 10,
                         batch_cpu_s=((5.0, 5.5, 6.0, 6.5, 7.0, 7.5, 8.0, 8.5, 8.75, 9.0),
                                      tuple(0.25 * b + 1.5 for b in range(1, 11))))
    # batches 2..7: rank 0 0.5 s a batch, rank 1 0.25
    assert result.steady_cpu_per_batch_s() == pytest.approx(0.75)


def test_torchs_steady_pass_times_leave_out_the_first_and_last_batches():
    result = TorchResult(batch_ends_s=tuple(float(b) for b in range(1, 11)), cpu_s=(9.0, 4.0),
                         losses=(1.0,) * 10,
                         batch_pass_s=((9.0, 9.0, 1.0, 2.0, 2.0, 1.0, 2.0, 1.0, 9.0, 9.0),
                                       (0.5,) * 10))
    assert result.steady_pass_per_batch_s() == pytest.approx((1.5, 0.5))


@pytest.mark.parametrize(("argv", "says"), [
    (["--models", "resnet"], "--models: resnet is not one of mlp, vgg5"),
    (["--schedules", "pipedream"], "--schedules: pipedream is not one of 1f1b-sync, gpipe"),
    (["--stages", "4"], "--stages: 4 is not one of 2, 3"),
    (["--pairs", "0"], "--pairs must be at least 1"),
])
def test_bad_options_are_refused_before_anything_starts(argv, says):
    with pytest.raises(SystemExit, match=says):
        main(argv)
