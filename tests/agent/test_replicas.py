"""Stages on groups of devices and on two lanes train what one device would: real stages, real
data, real ZeroMQ, compared weight for weight with a pipeline of one device per stage."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
import torch

from agent.data import load_dataset
from agent.executor import Clock, Metric, StageExecutor, StageResult
from agent.transport import DataPlane
from agent.zoo import build_model
from orchestrator.events import TimelineEvent
from orchestrator.formats import LayerTimes
from orchestrator.protocol import StageSpec
from orchestrator.schedule import reference_version
from tests.agent.stages import connected_planes, run_stages

DIGITS = load_dataset("digits")


@dataclass
class Trained:
    """What a pipeline run left: each device's final weights of its stage, results, events."""

    weights: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    results: dict[str, StageResult] = field(default_factory=dict)
    events: list[TimelineEvent] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


def train(layers: Sequence[tuple[int, int]], groups: Sequence[Sequence[str]], *,
          schedule: str = "1f1b", microbatches: int = 24, flush_every: int | None = None,
          inflight: Sequence[int] | None = None, lag: Sequence[int] | None = None,
          two_lanes: Sequence[str] = (), times: dict[str, float] | None = None,
          momentum: float = 0.9, vertical_sync: bool = False,
          aggregate_every: int = 0) -> Trained:
    """Train the MLP on the digits over stages of ``layers`` served by ``groups`` of devices,
    each device on its own model copy (built from one seed), each on its own thread."""
    torch.set_num_threads(1)
    devices = [d for g in groups for d in g]
    planes = connected_planes(devices)
    clock = Clock(started_at=time.time())
    trained = Trained()
    metrics: list[Metric] = []
    errors: list[BaseException] = []
    where = {d: k for k, g in enumerate(groups) for d in g}
    # each device's copy of its stage, built here: the global random state is not threads'
    modules = {d: build_model("mlp", input_shape=DIGITS.input_shape, num_classes=10,
                              seed=0).stage(*layers[where[d]]) for d in devices}

    def run(i: int) -> None:
        device = devices[i]
        k = where[device]
        spec = StageSpec(
            run=1, device=device, stage=k, layers=layers[k], model="mlp", dataset="digits",
            batch_size=16, schedule=schedule, stage_devices=tuple(tuple(g) for g in groups),
            stage_times_s=tuple(tuple((times or {}).get(d, 1.0) for d in g) for g in groups),
            microbatches=microbatches, flush_every=flush_every,
            inflight=None if inflight is None else tuple(inflight),
            lag=None if lag is None else tuple(lag), two_lanes=tuple(two_lanes),
            lane_shares=(0.5, 0.5) if device in two_lanes else None, lr=0.05,
            momentum=momentum, vertical_sync=vertical_sync, aggregate_every=aggregate_every,
            receive_timeout_s=30)
        module = modules[device]
        try:
            executor = StageExecutor(spec, module=module, plane=planes[device], clock=clock,
                                     dataset=DIGITS if k == 0 else None,
                                     on_event=trained.events.append, on_metric=metrics.append)
            trained.results[device] = executor.run()
            trained.weights[device] = [p.detach().clone() for p in module.parameters()]
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    run_stages(run, len(devices), planes.values())
    assert not errors, errors
    trained.losses = [m.value for m in sorted(metrics, key=lambda m: m.microbatch)
                      if m.name == "loss"]
    return trained


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("shares", [(1.0, 1.0), (1.0, 3.0)])
def test_replicated_1f1b_trains_bit_for_bit_what_one_device_does(
        shares: tuple[float, float]) -> None:
    # the second stage on two replicas (sharing micro-batches evenly, or 3:1 by speed) whose
    # forwards lag 4 behind, the first keeping 5 in flight: the same as one device per stage
    # keeping 5 and 4 in flight, to the bit, with momentum
    layers = [(0, 1), (2, 3)]
    times = {"b1": shares[0], "b2": shares[1]}
    replicated = train(layers, [["a"], ["b1", "b2"]], inflight=(5, 1), lag=(5, 4),
                       times=times)
    single = train(layers, [["a"], ["b"]], inflight=(5, 4))
    assert replicated.losses == single.losses
    assert same(replicated.weights["a"], single.weights["a"])
    for replica in ("b1", "b2"):
        assert same(replicated.weights[replica], single.weights["b"])
        # every replica applied every micro-batch's update, in order, once
        assert replicated.results[replica].updated == list(range(24))
    owned = [replicated.results[r].forwards for r in ("b1", "b2")]
    assert sorted(owned[0] + owned[1]) == list(range(24)) and all(owned)
    if shares == (1.0, 3.0):
        assert len(owned[0]) == 3 * len(owned[1])
    # each replica forwarded m on the version one device keeping 4 in flight would
    for replica in ("b1", "b2"):
        versions = replicated.results[replica].versions
        assert all(v == reference_version(m, 4) for m, v in versions.items())
    shared = [e for e in replicated.events if e.kind == "aggregate"]
    assert sorted(e.microbatch for e in shared) == list(range(24))  # one A per micro-batch


def test_a_replicated_first_stage_and_a_single_stage_group() -> None:
    # the first stage on three replicas (data and labels from each); and data parallelism:
    # one stage on two devices (bsp), each forward lagging 3 behind
    layers = [(0, 2), (3, 3)]
    replicated = train(layers, [["a1", "a2", "a3"], ["b"]], inflight=(4, 1), lag=(6, 1),
                       microbatches=30)
    single = train(layers, [["a"], ["b"]], inflight=(6, 1), microbatches=30)
    for replica in ("a1", "a2", "a3"):
        assert same(replicated.weights[replica], single.weights["a"])
    assert same(replicated.weights["b"], single.weights["b"])
    bsp = train([(0, 3)], [["x", "y"]], inflight=(1,), lag=(3,), momentum=0.0)
    alone = train([(0, 3)], [["z"]], inflight=(3,), momentum=0.0)
    assert same(bsp.weights["x"], alone.weights["z"]) and same(bsp.weights["y"],
                                                               alone.weights["z"])


def test_replicated_gpipe_all_reduces_to_what_one_device_averages() -> None:
    # the replicas ring-all-reduce their accumulated gradients each flush: the same update as
    # one device, up to the order of the float sums
    layers = [(0, 1), (2, 3)]
    replicated = train(layers, [["a1", "a2"], ["b1", "b2", "b3"]], schedule="gpipe",
                       microbatches=24, flush_every=6, times={"b3": 2.0})
    single = train(layers, [["a"], ["b"]], schedule="gpipe", microbatches=24, flush_every=6)
    for group, one in ((("a1", "a2"), "a"), (("b1", "b2", "b3"), "b")):
        first = replicated.weights[group[0]]
        for replica in group[1:]:
            assert same(replicated.weights[replica], first)  # replicas hold the same bytes
        for x, y in zip(first, single.weights[one], strict=True):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    assert replicated.losses == pytest.approx(single.losses, rel=1e-3)
    assert all(r.updates == 4 for r in replicated.results.values())  # one per flush


def test_two_lanes_forward_beside_the_backward_one_version_behind() -> None:
    # on two lanes a forward runs beside the backward before it, on the weights before that
    # backward's update: one device on one lane keeping one more in flight trains the same
    layers = [(0, 1), (2, 3)]
    lanes = train(layers, [["a"], ["b"]], inflight=(3, 1), two_lanes=("a", "b"))
    one_lane = train(layers, [["a"], ["b"]], inflight=(4, 2))
    assert same(lanes.weights["a"], one_lane.weights["a"])
    assert same(lanes.weights["b"], one_lane.weights["b"])
    assert lanes.results["b"].versions == one_lane.results["b"].versions
    # every pass ran, each once (that the lanes overlap in time is bench/runtime.py's to show:
    # passes of microseconds need not)
    for device in ("a", "b"):
        kinds = [e.kind for e in lanes.events if e.device == device]
        assert kinds.count("forward") == kinds.count("backward") == kinds.count("update") == 24


def test_a_two_lane_replica_with_a_single_lane_one() -> None:
    # Duan-Wu's virtual worker: a group whose replicas split their resources or not
    layers = [(0, 1), (2, 3)]
    mixed = train(layers, [["a"], ["b1", "b2"]], inflight=(4, 1), lag=(4, 3),
                  two_lanes=("b1",))
    single = train(layers, [["a"], ["b"]], inflight=(4, 3))
    for replica in ("b1", "b2"):
        assert same(mixed.weights[replica], single.weights["b"])


def test_vertical_sync_forwards_every_stage_on_stage_0s_version() -> None:
    # three stages keeping 3, 2 and 1 in flight: without vertical sync each stage forwards m
    # on its own latest weights (m - D_k + 1 updates); with it, every stage on stage 0's
    layers = [(0, 1), (2, 2), (3, 3)]
    groups = [["a"], ["b"], ["c"]]
    free = train(layers, groups, inflight=(3, 2, 1), microbatches=20)
    synced = train(layers, groups, inflight=(3, 2, 1), microbatches=20, vertical_sync=True)
    for device, depth in (("a", 3), ("b", 2), ("c", 1)):
        assert free.results[device].versions == {m: reference_version(m, depth)
                                                 for m in range(20)}
        assert synced.results[device].versions == {m: reference_version(m, 3)
                                                   for m in range(20)}
    # the versions travel with the micro-batch: every event of m carries stage 0's version
    assert {(e.microbatch, e.version) for e in synced.events if e.kind == "forward"} == {
        (m, reference_version(m, 3)) for m in range(20)}
    # a replicated later stage lagging further than stage 0 sets the pipeline's lag
    lagging = train([(0, 1), (2, 3)], [["a"], ["b1", "b2"]], inflight=(3, 1), lag=(3, 5),
                    vertical_sync=True)
    for device in ("a", "b1", "b2"):
        assert all(v == reference_version(m, 5)
                   for m, v in lagging.results[device].versions.items())


def test_weight_aggregation_averages_each_stages_concurrent_versions() -> None:
    # FTPipeHD: stage i of n keeps n - i versions in flight and averages them every
    # aggregate_every x (n - i) updates; the last stage (one version) never does
    layers = [(0, 1), (2, 2), (3, 3)]
    groups = [["a"], ["b"], ["c"]]
    trained = train(layers, groups, inflight=(3, 2, 1), microbatches=24, aggregate_every=2)
    assert trained.results["a"].aggregated == [(6, (4, 5, 6)), (12, (10, 11, 12)),
                                               (18, (16, 17, 18)), (24, (22, 23, 24))]
    assert trained.results["b"].aggregated == [(v, (v - 1, v)) for v in (4, 8, 12, 16, 20, 24)]
    assert trained.results["c"].aggregated == []
    aggregates = [e for e in trained.events if e.kind == "aggregate"]
    assert sorted((e.device, e.version) for e in aggregates) == sorted(
        [("a", v) for v in (6, 12, 18, 24)] + [("b", v) for v in (4, 8, 12, 16, 20, 24)])
    # it changes what is trained (the averaged weights differ from the last version's)
    plain = train(layers, groups, inflight=(3, 2, 1), microbatches=24)
    assert not same(trained.weights["a"], plain.weights["a"])


def test_an_aggregation_is_the_mean_of_the_versions_it_names() -> None:
    from agent.versions import Aggregation

    param = torch.zeros(3)
    lock = threading.Lock()
    aggregation = Aggregation([param], version=0, every=1, window=3)
    seen = []
    for version, value in enumerate((1.0, 2.0, 6.0, 7.0, 8.0, 9.0), start=1):
        param.fill_(value)  # the update that made this version
        seen.append(aggregation.after_update(version, lock))
        if version == 3:  # versions 1, 2, 3 hold 1, 2, 6: the mean is 3
            assert torch.equal(param, torch.full((3,), 3.0))
    assert seen == [None, None, (1, 2, 3), None, None, (4, 5, 6)]
    assert torch.equal(param, torch.full((3,), 8.0))  # 7, 8, 9


def test_two_lanes_measure_no_fixed_costs_and_replicas_per_micro_batch_of_the_stage(
        ) -> None:
    # two lanes have no single thread whose time is the stage's; a replica applies every
    # micro-batch's update, its peers' too: it counts its fixed cost per micro-batch of the
    # stage (per micro-batch of its own, its peers' work read as its device's overhead)
    warm = LayerTimes(forward_s=(0.0,) * 4, backward_s=(0.0,) * 4)
    lanes = StageExecutor(
        StageSpec(run=1, device="a", stage=0, layers=(0, 3), model="mlp", dataset="digits",
                  batch_size=16, schedule="1f1b", stage_devices=(("a",),),
                  stage_times_s=((1.0,),), microbatches=60, two_lanes=("a",),
                  lane_shares=(0.5, 0.5)),
        module=build_model("mlp", input_shape=DIGITS.input_shape, num_classes=10).stage(0, 3),
        plane=DataPlane(bind="tcp://127.0.0.1:0"), clock=Clock(time.time()), dataset=DIGITS,
        warm=warm)
    try:
        lanes.run()
        assert lanes.fixed_costs() is None
    finally:
        lanes.plane.close()
    costs = {}
    original = StageExecutor.run

    def run(self: StageExecutor) -> StageResult:
        self.warm_s = {"forward": 0.0, "backward": 0.0, "update": 0.0}
        result = original(self)
        costs[self.spec.device] = self.fixed_costs()
        return result

    StageExecutor.run = run  # type: ignore[method-assign]
    try:
        train([(0, 3)], [["x", "y"]], inflight=(1,), lag=(3,), microbatches=60,
              momentum=0.0)
    finally:
        StageExecutor.run = original  # type: ignore[method-assign]
    for device in ("x", "y"):
        measured = costs[device]
        assert measured is not None and measured.microbatches >= 40  # of the stage's 60


def train_pipelines(*, microbatches: int, round_every: int = 0,
                    weights: tuple[float, float] = (1.0, 3.0)) -> Trained:
    """Two PipeLearn-shaped pipelines (layers 0-1 on a device of their own, 2-3 on a shared
    server), each on its own data (another seed); with ``round_every``, the devices' stages
    and the server's two copies each form an aggregation group."""
    torch.set_num_threads(1)
    planes = connected_planes(["a", "b", "server"])
    clock = Clock(started_at=time.time())
    trained = Trained()
    errors: list[BaseException] = []
    stages = [(p, k) for p in (0, 1) for k in (0, 1)]
    host = {(0, 0): "a", (1, 0): "b", (0, 1): "server", (1, 1): "server"}
    layers = {0: (0, 1), 1: (2, 3)}
    modules = {s: build_model("mlp", input_shape=DIGITS.input_shape, num_classes=10,
                              seed=0).stage(*layers[s[1]]) for s in stages}

    def run(i: int) -> None:
        p, k = stages[i]
        group = tuple((host[(q, k)], q, k) for q in (0, 1)) if round_every else ()
        spec = StageSpec(
            run=1, device=host[(p, k)], stage=k, layers=layers[k], model="mlp",
            dataset="digits", batch_size=16, schedule="1f1b",
            stage_devices=((host[(p, 0)],), ("server",)), stage_times_s=((1.0,), (1.0,)),
            microbatches=microbatches, lr=0.05, momentum=0.9, seed=p, receive_timeout_s=30,
            pipeline=p, round_every=round_every, group=group, group_weight=weights[p])
        try:
            executor = StageExecutor(spec, module=modules[(p, k)], plane=planes[host[(p, k)]],
                                     clock=clock, dataset=DIGITS if k == 0 else None,
                                     on_event=trained.events.append)
            trained.results[f"{p}/{k}"] = executor.run()
            trained.weights[f"{p}/{k}"] = [t.detach().clone()
                                           for t in modules[(p, k)].parameters()]
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    run_stages(run, len(stages), planes.values())
    assert not errors, errors
    return trained


def test_pipelines_sharing_a_device_average_their_stages_each_round() -> None:
    # one round at the end: each group's members end with the FedAvg (weights 1 and 3) of
    # what each trained alone, the server's two copies (one device, one inbox) included
    alone = train_pipelines(microbatches=12)
    grouped = train_pipelines(microbatches=12, round_every=12)
    for k in (0, 1):
        mine, theirs = grouped.weights[f"0/{k}"], grouped.weights[f"1/{k}"]
        assert same(mine, theirs)
        for got, x, y in zip(mine, alone.weights[f"0/{k}"], alone.weights[f"1/{k}"],
                             strict=True):
            torch.testing.assert_close(got, (1.0 * x + 3.0 * y) / 4.0, rtol=1e-5, atol=1e-6)
        assert grouped.results[f"0/{k}"].rounds == grouped.results[f"1/{k}"].rounds == [11]
    # every pass and transfer carries its pipeline; the server's events show both
    assert {e.pipeline for e in grouped.events if e.device == "server"} == {0, 1}
    averages = [e for e in grouped.events if e.kind == "aggregate"]
    assert sorted((e.pipeline, e.stage, e.microbatch) for e in averages) == [
        (0, 0, 11), (0, 1, 11), (1, 0, 11), (1, 1, 11)]
    # with rounds of 4 the pipelines train on: three averages, the members equal after each
    rounds = train_pipelines(microbatches=12, round_every=4)
    assert rounds.results["1/1"].rounds == [3, 7, 11]
    assert same(rounds.weights["0/0"], rounds.weights["1/0"])


def most_in_flight(events: Sequence[TimelineEvent], device: str) -> int:
    """The most micro-batches a device had forwarded and not yet backwarded."""
    passes = sorted((e.start, e.kind == "backward") for e in events
                    if e.device == device and e.kind in ("forward", "backward"))
    held = peak = 0
    for _, backward in passes:
        held += -1 if backward else 1
        peak = max(peak, held)
    return peak


def test_synchronous_1f1b_trains_bit_for_bit_what_gpipe_does() -> None:
    # the same flushes and the same backward order as GPipe (every micro-batch of a batch on
    # the same weights, gradients summed in micro-batch order), but 1F1B's order: a stage
    # holds at most its depth in flight, not the whole batch
    layers = [(0, 0), (1, 2), (3, 3)]
    groups = [["a"], ["b"], ["c"]]
    sync = train(layers, groups, schedule="1f1b-sync", microbatches=24, flush_every=8)
    gpipe = train(layers, groups, schedule="gpipe", microbatches=24, flush_every=8)
    assert sync.losses == gpipe.losses
    for device in ("a", "b", "c"):
        assert same(sync.weights[device], gpipe.weights[device])
        assert sync.results[device].updates == gpipe.results[device].updates == 3
        # every micro-batch of batch b forwarded on version b, as GPipe does
        assert sync.results[device].versions == {m: m // 8 for m in range(24)}
    assert [most_in_flight(sync.events, d) for d in ("a", "b", "c")] == [3, 2, 1]
    assert most_in_flight(gpipe.events, "a") == 8


def test_synchronous_1f1b_replicas_and_two_lanes() -> None:
    # replicas all-reduce at each flush as under GPipe; a device on two lanes forwards beside
    # a backward of its batch, on the same weights: both train what one device on one lane does
    layers = [(0, 1), (2, 3)]
    one = train(layers, [["a"], ["b"]], schedule="1f1b-sync", microbatches=24, flush_every=6)
    replicated = train(layers, [["a1", "a2"], ["b"]], schedule="1f1b-sync", microbatches=24,
                       flush_every=6)
    for replica in ("a1", "a2"):
        for x, y in zip(replicated.weights[replica], one.weights["a"], strict=True):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    lanes = train(layers, [["a"], ["b"]], schedule="1f1b-sync", microbatches=24,
                  flush_every=6, two_lanes=("a", "b"))
    for device in ("a", "b"):
        assert same(lanes.weights[device], one.weights[device])
        assert lanes.results[device].versions == one.results[device].versions
