"""Split learning's U-shaped pipeline on real stages, real data and real ZeroMQ: a client holds
part-1 and part-3 of the model, a helper part-2; the labels never leave the client. And the
shards a run cuts its training set in, one a client."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from agent.data import DataError, load_dataset
from agent.executor import Clock, Metric, StageExecutor
from agent.launch import reads_data
from agent.transport import SendRecord
from agent.turns import Turn, TurnError, Turnstile
from agent.zoo import build_model
from orchestrator.errors import FormatError
from orchestrator.events import TimelineEvent
from orchestrator.planformat import Stage, check_stages, u_shaped
from orchestrator.protocol import ProtocolError, StageSpec
from tests.agent.stages import connected_planes, run_stages

DIGITS = load_dataset("digits")
LAYERS = ((0, 0), (1, 2), (3, 3))  # the MLP's four layers: part-1, part-2, part-3


@dataclass
class Trained:
    weights: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # by stage
    losses: list[float] = field(default_factory=list)
    sends: list[SendRecord] = field(default_factory=list)


def spec(stage: int, devices: Sequence[str], microbatches: int = 16, flush_every: int = 4,
         **extra: object) -> StageSpec:
    return StageSpec(run=1, device=devices[stage], stage=stage, layers=LAYERS[stage],
                     model="mlp", dataset="digits", batch_size=16, schedule="gpipe",
                     stage_devices=tuple((d,) for d in devices),
                     stage_times_s=((1.0,),) * len(devices), microbatches=microbatches,
                     flush_every=flush_every,
                     lr=0.05, receive_timeout_s=30, **extra)  # type: ignore[arg-type]


def train(devices: Sequence[str], **extra: object) -> Trained:
    """Train the MLP on the digits over three stages served by ``devices`` (a device may hold
    two), each stage on its own thread and model copy built from one seed."""
    torch.set_num_threads(1)
    planes = connected_planes(sorted(set(devices)))
    trained = Trained()
    for plane in planes.values():
        plane.on_send = trained.sends.append
    clock = Clock(started_at=time.time())
    metrics: list[Metric] = []
    errors: list[BaseException] = []
    modules = {k: build_model("mlp", input_shape=DIGITS.input_shape, num_classes=10,
                              seed=0).stage(*LAYERS[k]) for k in range(3)}

    def run(k: int) -> None:
        stage = spec(k, devices, **extra)
        data = DIGITS if stage.shard is None else DIGITS.shard(*stage.shard,
                                                               split=stage.shard_split)
        try:
            StageExecutor(stage, module=modules[k], plane=planes[devices[k]], clock=clock,
                          dataset=data if reads_data(stage) else None,
                          on_event=lambda e: None, on_metric=metrics.append).run()
            trained.weights[k] = [p.detach().clone() for p in modules[k].parameters()]
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    run_stages(run, 3, planes.values())
    assert not errors, errors
    trained.losses = [m.value for m in sorted(metrics, key=lambda m: m.microbatch)
                      if m.name == "loss"]
    return trained


def test_a_client_trains_parts_1_and_3_and_its_labels_never_leave_it() -> None:
    split = train(["client", "helper", "client"])
    chain = train(["a", "b", "c"])
    # the same training, bit for bit, as a chain whose labels ride to its last stage
    for k in range(3):
        assert all(torch.equal(x, y) for x, y in zip(split.weights[k], chain.weights[k],
                                                     strict=True)), k
    assert split.losses == chain.losses and len(split.losses) == 16
    # no message carries labels in the split run; the chain's activations did
    assert {s.peer for s in split.sends} == {"client", "helper"}
    assert all(s.header.labels is None for s in split.sends)
    assert any(s.header.labels for s in chain.sends if s.peer == "b")


def test_a_client_trains_on_its_shard_only() -> None:
    whole = train(["client", "helper", "client"])
    own = train(["client", "helper", "client"], shard=(1, 3), shard_split="label-skew")
    assert own.losses != whole.losses  # other micro-batches: the shard's own samples
    assert all(np.isfinite(own.losses))


def test_u_shaped_pipelines_and_what_is_refused() -> None:
    assert u_shaped([("c",), ("h",), ("c",)])
    assert u_shaped([("c",), ("h1", "h2"), ("x",), ("c",)])
    assert not u_shaped([("c",), ("c",)])  # two stages: no middle
    assert not u_shaped([("c", "d"), ("h",), ("c", "d")])  # replicated ends
    assert not u_shaped([("c",), ("c",), ("c",)])  # the client in the middle too
    assert not u_shaped([("c",), ("h",), ("h",), ("c",)])  # a middle device twice
    check_stages([Stage((0, 0), ("c",)), Stage((1, 2), ("h",)), Stage((3, 3), ("c",))],
                 num_layers=4, device_ids=["c", "h"])
    with pytest.raises(FormatError, match=r"stages\[2\]\.devices\[0\].*already serves stage 1"):
        check_stages([Stage((0, 0), ("c",)), Stage((1, 2), ("h",)), Stage((3, 3), ("h",))],
                     num_layers=4, device_ids=["c", "h"])
    with pytest.raises(ProtocolError, match="stage_devices"):
        spec(0, ["c", "h", "h"])
    with pytest.raises(ProtocolError, match="shard"):
        spec(0, ["c", "h", "c"], shard=(3, 3))
    with pytest.raises(ProtocolError, match="shard_split"):
        spec(0, ["c", "h", "c"], shard=(0, 3), shard_split="by-label")
    again = StageSpec.from_json(spec(2, ["c", "h", "c"], shard=(0, 3),
                                     shard_split="label-skew").to_json())
    assert again.shard == (0, 3) and again.shard_split == "label-skew" and again.u_shaped
    assert reads_data(again) and not reads_data(spec(1, ["c", "h", "c"]))
    assert not reads_data(spec(2, ["a", "b", "c"]))  # a chain's labels ride along


@pytest.mark.parametrize("split", ["iid", "label-skew"])
def test_shards_are_disjoint_cover_the_training_set_and_keep_the_held_out_set(split: str
                                                                              ) -> None:
    shards = [DIGITS.shard(i, 4, split=split, seed=3) for i in range(4)]
    rows = np.concatenate([s.x_train.reshape(len(s.x_train), -1) for s in shards])
    assert len(rows) == len(DIGITS.x_train)
    assert len(np.unique(rows, axis=0)) == len(np.unique(DIGITS.x_train.reshape(
        len(DIGITS.x_train), -1), axis=0))
    assert sorted(np.concatenate([s.y_train for s in shards]).tolist()) == sorted(
        DIGITS.y_train.tolist())
    assert all(np.array_equal(s.y_test, DIGITS.y_test) for s in shards)
    classes = [len(set(s.y_train.tolist())) for s in shards]
    if split == "iid":
        assert min(classes) == 10
    else:  # each holds about a quarter of the classes
        assert max(classes) <= 4
    assert DIGITS.shard(2, 4, split=split, seed=3).y_train.tolist() == shards[2].y_train.tolist()


def test_a_shard_that_cannot_be_cut_is_refused() -> None:
    with pytest.raises(DataError, match="shard 4 of 4 does not exist"):
        DIGITS.shard(4, 4)
    with pytest.raises(DataError, match="unknown shard split 'by-label'"):
        DIGITS.shard(0, 4, split="by-label")
    with pytest.raises(DataError, match="leave some empty"):
        DIGITS.shard(0, 10**6)


Task = tuple[int, str] | tuple[int, str, int, int]  # (pipeline, kind[, first, last layer])
PART2 = LAYERS[1]


def train_clients(order: Sequence[Task] | None, *, microbatches: Sequence[int] = (8, 8)
                  ) -> tuple[list[TimelineEvent], dict[int, list[torch.Tensor]]]:
    """Two clients' U-shaped pipelines sharing one helper, which takes its passes in
    ``order`` (one micro-batch's tasks: (pipeline, kind), or (pipeline, kind, first, last)
    for a part of a pass over those layers); None: as their inputs come. The helper's
    timeline events and each pipeline's part-2 weights at the end."""
    torch.set_num_threads(1)
    clients = [f"client-{j}" for j in range(len(microbatches))]
    planes = connected_planes([*clients, "helper"])
    clock = Clock(started_at=time.time())
    events: list[TimelineEvent] = []
    errors: list[BaseException] = []
    weights: dict[int, list[torch.Tensor]] = {}
    turns = () if order is None else tuple(
        (t[0], t[1], microbatches[t[0]], *(t[2:] if len(t) == 4 else PART2)) for t in order)
    turnstile = None if order is None else Turnstile([Turn(*t[:3]) for t in turns])
    stages = [(j, k) for j in range(len(clients)) for k in range(3)]
    # built here: the global random state a model is initialised from is not threads'
    modules = {(j, k): build_model("mlp", input_shape=DIGITS.input_shape, num_classes=10,
                                   seed=j).stage(*LAYERS[k]) for j, k in stages}

    def run(i: int) -> None:
        j, k = stages[i]
        devices = [clients[j], "helper", clients[j]]
        module = modules[(j, k)]
        try:
            # one micro-batch of each client at a time, as in the split-learning schedule
            stage = spec(k, devices, microbatches[j], 1, pipeline=j,
                         turns=turns if k == 1 else ())
            StageExecutor(stage, module=module, plane=planes[devices[k]], clock=clock,
                          dataset=DIGITS if reads_data(stage) else None,
                          on_event=events.append, on_metric=lambda m: None,
                          turns=turnstile if k == 1 else None).run()
            if k == 1:
                weights[j] = [t.detach().clone() for t in module.parameters()]
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    run_stages(run, len(stages), planes.values())
    assert not errors, errors
    return sorted((e for e in events if e.device == "helper"), key=lambda e: e.start), weights


def passes(events: Sequence[TimelineEvent], microbatch: int) -> list[tuple[int, str]]:
    return [(e.pipeline, e.kind) for e in events
            if e.microbatch == microbatch and e.kind in ("forward", "backward")]


@pytest.mark.parametrize("order", [
    [(1, "forward"), (0, "forward"), (1, "backward"), (0, "backward")],
    [(0, "forward"), (1, "forward"), (0, "backward"), (1, "backward")],
])
def test_a_helper_takes_its_clients_passes_in_the_schedules_order(
        order: list[tuple[int, str]]) -> None:
    events, _ = train_clients(order)
    for m in range(8):
        assert passes(events, m) == order, m
    # one pass at a time: the helper's passes never overlap
    timed = [e for e in events if e.kind in ("forward", "backward")]
    assert all(a.end <= b.start for a, b in itertools.pairwise(timed))


def test_a_client_with_fewer_micro_batches_leaves_the_order_when_it_ends() -> None:
    order = [(0, "forward"), (1, "forward"), (1, "backward"), (0, "backward")]
    events, _ = train_clients(order, microbatches=(4, 8))
    assert passes(events, 3) == order
    assert passes(events, 5) == [(1, "forward"), (1, "backward")]


def test_a_preempted_pass_runs_in_parts_between_layers_and_trains_the_same() -> None:
    # client 0's forward preempted by client 1's after part-2's first layer, its backward by
    # nothing but cut elsewhere: the last layer, then the first
    order: list[Task] = [(0, "forward", 1, 1), (1, "forward"), (0, "forward", 2, 2),
                         (1, "backward"), (0, "backward", 2, 2), (0, "backward", 1, 1)]
    events, weights = train_clients(order)
    for m in range(8):
        assert passes(events, m) == [(t[0], t[1]) for t in order], m
    timed = [e for e in events if e.kind in ("forward", "backward")]
    assert all(a.end <= b.start for a, b in itertools.pairwise(timed))
    # the same training, bit for bit, as whole passes: the parts compute what one pass does
    _, whole = train_clients([(0, "forward"), (1, "forward"), (1, "backward"), (0, "backward")])
    for j in (0, 1):
        assert all(torch.equal(got, expected) for got, expected in zip(weights[j], whole[j],
                                                                       strict=True)), j


def test_a_turnstile_refuses_what_is_not_in_its_order() -> None:
    with pytest.raises(TurnError, match="micro-batch count once"):
        Turnstile([Turn(0, "forward", 4), Turn(0, "forward", 8)])
    with pytest.raises(TurnError, match="forward or backward"):
        Turnstile([Turn(0, "update", 4)])
    gate = Turnstile([Turn(0, "forward", 2), Turn(1, "forward", 2), Turn(0, "forward", 2)])
    with pytest.raises(TurnError, match="part 0 of the backward of pipeline 0 is not in"):
        gate.wait(0, "backward", 0, timeout_s=1)
    with pytest.raises(TurnError, match=r"waited 0\.3 s for its turn, held by the forward of "
                                        r"micro-batch 0 of pipeline 0"):
        gate.wait(1, "forward", 0, timeout_s=0.3)
    gate.wait(0, "forward", 0, timeout_s=1)
    gate.done(0, "forward", 0)
    gate.wait(1, "forward", 0, timeout_s=1)
    gate.done(1, "forward", 0)
    gate.wait(0, "forward", 0, 1, timeout_s=1)  # the second part of pipeline 0's forward


@pytest.mark.parametrize(("turns", "says"), [
    (((1, "forward", 16, 1, 2), (1, "backward", 16, 1, 2)), "this stage's forward must cover"),
    (((0, "forward", 16, 1, 2), (0, "backward", 16, 1, 1)), "this stage's backward must cover"),
    (((0, "forward", 16, 2, 2), (0, "forward", 16, 1, 1), (0, "backward", 16, 1, 2)),
     "in the pass's order"),
    (((0, "forward", 16, 1, 2), (0, "backward", 16, 1, 1), (0, "backward", 16, 2, 2)),
     "in the pass's order"),
    (((0, "forward", 16, 1, 2), (0, "backward", 16, 1, 2), (1, "forward", 8, 1, 2),
      (1, "forward", 4, 1, 2)), "one micro-batch count"),
    (((0, "forward", 8, 1, 2), (0, "backward", 8, 1, 2)), "trains 16 micro-batches"),
    (((0, "update", 16, 1, 2),), "each is (pipeline, forward or backward"),
])
def test_a_stage_spec_refuses_turns_it_cannot_follow(turns: tuple[tuple[int, str, int, int,
                                                                        int], ...],
                                                     says: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(says)):
        spec(1, ["c", "h", "c"], flush_every=1, turns=turns)


def test_turns_round_trip_and_go_with_one_micro_batch_a_batch() -> None:
    turns = ((0, "forward", 16, 1, 1), (0, "forward", 16, 2, 2), (0, "backward", 16, 1, 2))
    again = StageSpec.from_json(spec(1, ["c", "h", "c"], flush_every=1, turns=turns).to_json())
    assert again.turns == turns
    with pytest.raises(ProtocolError, match="turns: go with a synchronous schedule"):
        spec(1, ["c", "h", "c"], turns=((0, "forward", 16, 1, 2), (0, "backward", 16, 1, 2)))
    with pytest.raises(ProtocolError, match="only a stage between two others"):
        spec(0, ["c", "h", "c"], flush_every=1, turns=(
            (0, "forward", 16, 0, 0), (0, "backward", 16, 0, 0), (0, "backward", 16, 0, 0)))


def train_two_clients(*, batch_sync: bool, microbatches: int = 6) -> list[TimelineEvent]:
    """Two clients on helpers of their own, the second client 6x slower; their part-1 stages
    form an aggregation group (one round, at the end), with or without the batch barrier."""
    torch.set_num_threads(1)
    devices = [["client-0", "helper-0", "client-0"], ["client-1", "helper-1", "client-1"]]
    planes = connected_planes(["client-0", "client-1", "helper-0", "helper-1"])
    clock = Clock(started_at=time.time())
    events: list[TimelineEvent] = []
    errors: list[BaseException] = []
    stages = [(j, k) for j in range(2) for k in range(3)]
    modules = {(j, k): build_model("mlp", input_shape=DIGITS.input_shape, num_classes=10,
                                   seed=0).stage(*LAYERS[k]) for j, k in stages}
    group = (("client-0", 0, 0), ("client-1", 1, 0))

    def run(i: int) -> None:
        j, k = stages[i]
        grouped: dict[str, object] = ({"round_every": microbatches, "group": group,
                                       "batch_sync": batch_sync} if k == 0 else {})
        stage = spec(k, devices[j], microbatches, 1, pipeline=j, **grouped)
        try:
            StageExecutor(stage, module=modules[(j, k)], plane=planes[devices[j][k]],
                          clock=clock, dataset=DIGITS if reads_data(stage) else None,
                          on_event=events.append, on_metric=lambda m: None,
                          slowdown=6.0 if j == 1 and k != 1 else 1.0).run()
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    run_stages(run, len(stages), planes.values())
    assert not errors, errors
    return events


def runs_ahead(events: Sequence[TimelineEvent], microbatches: int) -> int:
    """Batches some client began before every client had finished the one before."""
    def part1(kind: str, m: int) -> list[TimelineEvent]:
        return [e for e in events if e.stage == 0 and e.kind == kind and e.microbatch == m]

    return sum(min(e.start for e in part1("forward", m))
               < max(e.end for e in part1("backward", m - 1)) for m in range(1, microbatches))


def test_a_batch_barrier_releases_each_batch_to_every_client_at_once() -> None:
    # without it the fast client runs batches ahead of the slow one; with it none begins a
    # batch before both finished the one before (the split-learning paper's batch)
    assert runs_ahead(train_two_clients(batch_sync=False), 6) >= 3
    assert runs_ahead(train_two_clients(batch_sync=True), 6) == 0
    with pytest.raises(ProtocolError, match="batch_sync"):
        spec(2, ["c", "h", "c"], 4, 1, batch_sync=True)
