"""A run that goes on without a pipeline (agent side of webapp.runs.recovery.exclusion):
three PipeLearn-shaped pipelines (a device each, their second stages on a shared server)
average each side every round; pipeline 2's device is gone from the start, so the first
round's average waits for it, until the stages are told to go on without pipeline 2. Then
the two left average between themselves, round after round, and train to the end."""

from __future__ import annotations

import threading
import time

import torch

from agent.executor import Clock, StageExecutor
from agent.sharing import GroupChanged
from agent.turns import Turn, Turnstile
from agent.zoo import build_model
from orchestrator.events import TimelineEvent
from orchestrator.protocol import StageSpec
from tests.agent.stages import connected_planes, run_stages
from tests.agent.test_replicas import DIGITS, same

LAYERS = {0: (0, 1), 1: (2, 3)}
HOST = {(0, 0): "a", (1, 0): "b", (2, 0): "c", (0, 1): "server", (1, 1): "server",
        (2, 1): "server"}


def test_the_rounds_go_on_among_the_pipelines_left() -> None:
    torch.set_num_threads(1)
    planes = connected_planes(["a", "b", "c", "server"])
    clock = Clock(started_at=time.time())
    events: list[TimelineEvent] = []
    errors: list[BaseException] = []
    executors: dict[tuple[int, int], StageExecutor] = {}
    weights: dict[tuple[int, int], list[torch.Tensor]] = {}
    left = [(p, k) for p in (0, 1) for k in (0, 1)]  # pipeline 2 never runs
    for p, k in left:
        group = tuple((HOST[(q, k)], q, k) for q in (0, 1, 2))
        spec = StageSpec(
            run=1, device=HOST[(p, k)], stage=k, layers=LAYERS[k], model="mlp",
            dataset="digits", batch_size=16, schedule="gpipe",
            stage_devices=((HOST[(p, 0)],), ("server",)), stage_times_s=((1.0,), (1.0,)),
            microbatches=8, flush_every=2, lr=0.05, seed=0, receive_timeout_s=30, pipeline=p,
            round_every=4, group=group, group_weight=1.0)
        module = build_model("mlp", input_shape=DIGITS.input_shape, num_classes=10,
                             seed=0).stage(*LAYERS[k])
        executors[(p, k)] = StageExecutor(spec, module=module, plane=planes[HOST[(p, k)]],
                                          clock=clock, dataset=DIGITS if k == 0 else None,
                                          on_event=events.append)

    def run(i: int) -> None:
        key = left[i]
        try:
            executors[key].run()
            weights[key] = [t.detach().clone() for t in executors[key].params]
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    def exclude_later() -> None:  # once the first round's averages are waiting for c
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
                e.kind == "update" and e.microbatch == 3 for e in list(events)):
            time.sleep(0.02)
        time.sleep(0.3)
        for executor in executors.values():
            executor.exclude({2}, uploader=0)

    threading.Thread(target=exclude_later, daemon=True).start()
    run_stages(run, len(left), planes.values())
    assert not errors, errors
    # two rounds (micro-batches 3 and 7), each averaged between pipelines 0 and 1
    for k in (0, 1):
        assert executors[(0, k)].result.rounds == executors[(1, k)].result.rounds == [3, 7]
        assert same(weights[(0, k)], weights[(1, k)])
    averages = [e for e in events if e.kind == "aggregate"]
    assert sorted((e.pipeline, e.stage, e.microbatch) for e in averages) == [
        (p, k, m) for p in (0, 1) for k in (0, 1) for m in (3, 7)]


def test_a_helpers_turns_skip_a_pipeline_the_run_went_on_without() -> None:
    order = [Turn(0, "forward", 4), Turn(1, "forward", 4), Turn(1, "backward", 4),
             Turn(0, "backward", 4)]
    turns = Turnstile(order)
    turns.wait(0, "forward", 0, timeout_s=1)
    turns.done(0, "forward", 0)
    turns.drop({1})  # pipeline 1's client is gone: its turns are skipped
    turns.wait(0, "backward", 0, timeout_s=1)
    turns.done(0, "backward", 0)
    turns.wait(0, "forward", 1, timeout_s=1)


def test_a_receive_waiting_on_a_changed_group_gives_up_at_once() -> None:
    planes = connected_planes(["x"])
    spec = StageSpec(run=1, device="x", stage=0, layers=(0, 3), model="mlp",
                     dataset="digits", batch_size=16, schedule="gpipe",
                     stage_devices=(("x",),), stage_times_s=((1.0,),), microbatches=2,
                     receive_timeout_s=30)
    executor = StageExecutor(spec, module=build_model(
        "mlp", input_shape=DIGITS.input_shape, num_classes=10, seed=0).full(),
        plane=planes["x"], clock=Clock(started_at=time.time()), dataset=DIGITS,
        on_event=lambda e: None)
    began = time.monotonic()
    try:
        executor._receive("grads", 0, name="nothing", changed=lambda: True)
    except GroupChanged:
        pass
    else:  # pragma: no cover (the assertion below says it)
        raise AssertionError("the receive did not give up")
    finally:
        planes["x"].close()
    assert time.monotonic() - began < 5


def test_members_left_finish_an_all_reduce_another_finished_before_the_loss() -> None:
    # b was lost after sending a its last chunk of round 0's average but not c its own: a
    # went on, c started again without b and waited for a, which was past it, until its
    # receive timed out and the run failed (test_split_faults, twice in a row). a now sends
    # the members left the result it finished with, and c finishes alike.
    planes = connected_planes(["a", "c"])
    group = (("a", 0, 0), ("b", 1, 0), ("c", 2, 0))
    executors = {}
    for device, pipeline in (("a", 0), ("c", 2)):
        spec = StageSpec(
            run=1, device=device, stage=0, layers=(0, 3), model="mlp", dataset="digits",
            batch_size=16, schedule="gpipe", stage_devices=((device,),),
            stage_times_s=((1.0,),), microbatches=8, flush_every=2, lr=0.05, seed=0,
            receive_timeout_s=20, pipeline=pipeline, round_every=4, group=group,
            group_weight=1.0)
        executors[device] = StageExecutor(spec, module=build_model(
            "mlp", input_shape=DIGITS.input_shape, num_classes=10, seed=0).full(),
            plane=planes[device], clock=Clock(started_at=time.time()), dataset=DIGITS,
            on_event=lambda e: None)
    finished = torch.arange(5, dtype=torch.float32)  # a's round 0, with b's weights in it
    executors["a"].group_done["avg"] = (0, finished)
    results: list[torch.Tensor] = []
    waiting = threading.Thread(target=lambda: results.append(
        executors["c"]._group_all_reduce(torch.ones(5), what="avg", index=0)[0]), daemon=True)
    began = time.monotonic()
    try:
        waiting.start()
        time.sleep(0.3)  # c waits for b's chunk
        for executor in executors.values():
            executor.exclude({1}, uploader=0)
        waiting.join(timeout=15)
    finally:
        for plane in planes.values():
            plane.close()
    assert results and torch.equal(results[0], finished)
    assert time.monotonic() - began < 10
    assert executors["c"].group_done["avg"][0] == 0
