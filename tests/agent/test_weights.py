"""Checkpoints, replicas and resuming: weights saved by one stage layout load into another, and a
pipeline resumed at a checkpoint trains exactly as if it had never stopped."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence

import pytest
import torch

from agent.data import load_dataset
from agent.executor import Clock, StageError, StageExecutor
from agent.transport import DataPlane
from agent.weights import (
    Entry,
    WeightError,
    WeightStore,
    from_bytes,
    load_layer_state,
    momentum_state,
    snapshot,
    state_refs,
    to_bytes,
)
from agent.zoo import build_model
from orchestrator.events import TimelineEvent
from orchestrator.protocol import ProtocolError, StageSpec
from tests.agent.stages import run_stages

DIGITS = load_dataset("digits")


def mlp(seed: int = 0):  # type: ignore[no-untyped-def]
    return build_model("mlp", input_shape=DIGITS.input_shape, num_classes=10, seed=seed)


def test_weights_saved_by_one_layout_load_into_another() -> None:
    source, target = mlp(seed=1), mlp(seed=2)
    saved = {**snapshot(state_refs(source.stage(0, 1), 0)),
             **snapshot(state_refs(source.stage(2, 3), 2))}
    stage = target.stage(1, 2)
    load_layer_state(stage, 1, saved)
    for a, b in zip(stage.parameters(), source.stage(1, 2).parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(WeightError, match="no weights for 3"):
        load_layer_state(target.stage(3, 3), 3, snapshot(state_refs(source.stage(0, 2), 0)))


def test_safetensors_round_trip_and_refusals() -> None:
    tensors = snapshot(state_refs(mlp().stage(1, 2), 1))
    blob = to_bytes(tensors, run=7, first=1, last=2, applied=16)
    back = from_bytes(blob, first=1, last=2)
    assert back.keys() == tensors.keys()
    assert all(torch.equal(back[k], tensors[k]) for k in tensors)
    with pytest.raises(WeightError, match=r"outside layers 2\.\.2"):
        from_bytes(blob, first=2, last=2)
    for garbage in (b"", b"\x05\x00\x00\x00\x00\x00\x00\x00{}", b"\xff" * 64):
        with pytest.raises(WeightError):
            from_bytes(garbage, first=0, last=3)


def entry(layers: tuple[int, int], applied: int, kind: str = "own", *, pinned: bool = True,
          value: float = 0.0) -> Entry:
    tensors = {f"{i}.w": torch.full((2,), value + i) for i in range(layers[0], layers[1] + 1)}
    return Entry(layers=layers, applied=applied, kind=kind, tensors=tensors, pinned=pinned)


def test_the_store_keeps_the_two_newest_replication_points_of_each_kind() -> None:
    store = WeightStore()
    for applied in (8, 16, 24):
        store.add(entry((0, 1), applied))
        store.add(entry((2, 3), applied, "replica"))
    store.add(entry((0, 1), 25, pinned=False))  # the rollback window is kept apart
    assert {(tuple(h["layers"]), h["applied"], h["kind"]) for h in store.holdings()} == {
        ((0, 1), 16, "own"), ((0, 1), 24, "own"), ((0, 1), 25, "own"),
        ((2, 3), 16, "replica"), ((2, 3), 24, "replica")}
    store.trim_window((0, 1), floor=30, current=31)
    assert {h["applied"] for h in store.holdings() if h["kind"] == "own"} == {16, 24}


def test_a_part_merges_own_weights_and_replicas_or_is_missing() -> None:
    store = WeightStore()
    store.add(entry((0, 1), 16, value=10))
    store.add(entry((2, 3), 16, "replica", value=20))
    part = store.part(1, 2, 16)
    assert part is not None and sorted(part) == ["1.w", "2.w"]
    assert part["2.w"][0].item() == 22
    assert store.part(0, 3, 8) is None
    store.add(entry((2, 2), 8))
    assert store.part(1, 2, 8) is None  # layer 1 has no copy at 8


def train(layers: Sequence[tuple[int, int]], *, microbatches: int, first_microbatch: int = 0,
          start: dict[str, torch.Tensor] | None = None, chain_every: int = 0,
          momentum: float = 0.0) -> tuple[torch.Tensor, list[WeightStore], list[list[int]]]:
    """Train the MLP on digits through a real ZeroMQ pipeline of ``layers`` (GPipe flushing
    every micro-batch: no staleness, so the result does not depend on the layout); returns the
    final weights, each stage's store and the micro-batches each stage updated."""
    net = mlp()
    if start is not None:
        for first, last in layers:
            load_layer_state(net.stage(first, last), first, start)
    devices = [f"d{k}" for k in range(len(layers))]
    planes = {d: DataPlane(bind="tcp://127.0.0.1:0") for d in devices}
    for d in devices:
        for peer in devices:
            if peer != d:
                planes[d].connect(peer, planes[peer].address, planes[peer].public_key)
    stores = [WeightStore() for _ in layers]
    updated: list[list[int]] = [[] for _ in layers]
    errors: list[BaseException] = []
    clock = Clock(started_at=time.time())

    def run(k: int) -> None:
        spec = StageSpec(run=1, device=devices[k], stage=k, layers=layers[k], model="mlp",
                         dataset="digits", batch_size=32, schedule="gpipe",
                         stage_devices=tuple((d,) for d in devices),
                         stage_times_s=tuple((1.0,) for _ in devices), microbatches=microbatches,
                         flush_every=1, lr=0.1, receive_timeout_s=30, generation=1,
                         first_microbatch=first_microbatch, chain_every=chain_every,
                         momentum=momentum)
        try:
            result = StageExecutor(spec, module=net.stage(*layers[k]), plane=planes[devices[k]],
                                   clock=clock, dataset=DIGITS if k == 0 else None,
                                   store=stores[k],
                                   optimizer_state=momentum_state(start or {})).run()
            updated[k] = result.updated
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    run_stages(run, len(layers), planes.values())
    assert not errors, errors
    return torch.cat([p.detach().flatten() for p in net.full().parameters()]), stores, updated


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_a_pipeline_resumed_at_a_checkpoint_trains_as_if_it_never_stopped(
        momentum: float) -> None:
    whole, stores, updated = train([(0, 1), (2, 2), (3, 3)], microbatches=40, chain_every=8,
                                   momentum=momentum)
    assert updated == [list(range(40))] * 3  # every update once, in order, on every stage
    # the checkpoints at 32 updates of the three stages (the newest two replication points,
    # 32 and 40, are kept), resumed on another layout
    checkpoint: dict[str, torch.Tensor] = {}
    for store, layers in zip(stores, [(0, 1), (2, 2), (3, 3)], strict=True):
        part = store.part(*layers, 32)
        assert part is not None
        checkpoint.update(part)
    # under momentum the optimizer's buffer of every parameter comes with the weights
    buffers = {k for k in checkpoint if k.endswith(":momentum")}
    parameters = {k for k in checkpoint if k.endswith((".weight", ".bias"))}
    assert buffers == ({f"{k}:momentum" for k in parameters} if momentum else set())
    resumed, _, updated = train([(0, 2), (3, 3)], microbatches=40, first_microbatch=32,
                                start=checkpoint, momentum=momentum)
    assert updated == [list(range(32, 40))] * 2
    assert torch.equal(resumed, whole)


def test_a_stage_resumed_under_momentum_without_its_buffers_is_refused() -> None:
    _, stores, _ = train([(0, 3)], microbatches=8, chain_every=4, momentum=0.9)
    part = stores[0].part(0, 3, 8)
    assert part is not None
    weights_only = {k: v for k, v in part.items() if not k.endswith(":momentum")}
    spec = StageSpec(run=1, device="d0", stage=0, layers=(0, 3), model="mlp", dataset="digits",
                     batch_size=32, schedule="gpipe", stage_devices=(("d0",),),
                     stage_times_s=((1.0,),), microbatches=16, flush_every=1, momentum=0.9,
                     first_microbatch=8, generation=1)
    plane = DataPlane(bind="tcp://127.0.0.1:0")
    try:
        with pytest.raises(StageError, match="needs the weights' momentum buffers"):
            StageExecutor(spec, module=mlp().stage(0, 3), plane=plane,
                          clock=Clock(started_at=time.time()), dataset=DIGITS,
                          optimizer_state=momentum_state(weights_only))
        missing = momentum_state(part)
        missing.pop("3.0.bias")
        with pytest.raises(StageError, match=r"no momentum buffer for 3\.0\.bias"):
            StageExecutor(spec, module=mlp().stage(0, 3), plane=plane,
                          clock=Clock(started_at=time.time()), dataset=DIGITS,
                          optimizer_state=missing)
    finally:
        plane.close()


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b-sync"])
def test_a_resume_point_off_a_batch_boundary_is_refused_when_synchronous(schedule) -> None:
    with pytest.raises(ProtocolError, match="batch boundary"):
        StageSpec(run=1, device="d0", stage=0, layers=(0, 3), model="mlp", dataset="digits",
                  batch_size=32, schedule=schedule, stage_devices=(("d0",),),
                  stage_times_s=((1.0,),), microbatches=16, flush_every=4,
                  first_microbatch=6)


def test_stage_0_s_backward_timer_suspects_a_device_that_stops_answering() -> None:
    net = mlp()
    devices = ("d0", "d1")
    planes = {d: DataPlane(bind="tcp://127.0.0.1:0") for d in devices}
    planes["d0"].connect("d1", planes["d1"].address, planes["d1"].public_key)
    planes["d1"].connect("d0", planes["d0"].address, planes["d0"].public_key)
    stops = {d: threading.Event() for d in devices}
    suspects: list[tuple[int, float]] = []
    clock = Clock(started_at=time.time())

    def suspect(microbatch: int, waited: float) -> None:
        suspects.append((microbatch, waited))
        stops["d0"].set()

    backwards = [0]

    def count(event: TimelineEvent) -> None:
        if event.device == "d1" and event.kind == "backward":
            backwards[0] += 1
            if backwards[0] == 30:
                stops["d1"].set()  # the second stage's device goes silent

    def run(k: int) -> None:
        layers = [(0, 1), (2, 3)][k]
        spec = StageSpec(run=1, device=devices[k], stage=k, layers=layers, model="mlp",
                         dataset="digits", batch_size=32, schedule="1f1b",
                         stage_devices=(("d0",), ("d1",)), stage_times_s=((1.0,), (1.0,)),
                         microbatches=1_000, receive_timeout_s=30, suspect_min_s=0.2)
        executor = StageExecutor(spec, module=net.stage(*layers), plane=planes[devices[k]],
                                 clock=clock, dataset=DIGITS if k == 0 else None,
                                 stop=stops[devices[k]], on_suspect=suspect, on_event=count)
        with contextlib.suppress(StageError):  # stopped while it waited
            executor.run()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for plane in planes.values():
        plane.close()
    assert len(suspects) == 1
    microbatch, waited = suspects[0]
    assert 25 < microbatch <= 31 and waited >= 0.2


def test_a_new_generation_keeps_only_its_own_lineage() -> None:
    store = WeightStore()
    store.add(entry((0, 1), 40))  # generation 0: past the resume point, abandoned
    store.add(Entry(layers=(2, 3), applied=32, kind="replica", tensors={}, pinned=True,
                    generation=1))  # sent by a neighbour of generation 1 before this commit
    store.commit(1)
    assert store.holdings() == [{"layers": [2, 3], "applied": 32, "kind": "replica"}]


def test_state_refs_follow_in_place_updates_and_snapshots_do_not() -> None:
    stage = mlp().stage(1, 2)  # parameters only: no buffers
    refs = state_refs(stage, 1)
    assert [name for name, _ in refs] == ["1.0.weight", "1.0.bias", "2.0.weight", "2.0.bias"]
    before = snapshot(refs)
    with torch.no_grad():
        for p in stage.parameters():
            p.add_(1.0)
    after = snapshot(refs)
    assert all(torch.equal(after[k], v + 1.0) for k, v in before.items())
    live = dict(zip(["1.0.weight", "1.0.bias", "2.0.weight", "2.0.bias"],
                    stage.parameters(), strict=True))
    assert all(torch.equal(after[k], v) for k, v in live.items())
