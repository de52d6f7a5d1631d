"""The registry of the stages an agent holds: by (run, pipeline, stage), one lock for every
thread."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest

from agent.deployments import Deployment, Deployments, RegistryError, StageKey
from agent.executor import Clock
from orchestrator.protocol import StageSpec


def deployment(run: int = 7, stage: int = 0, generation: int = 0) -> Deployment:
    devices = (("a",), ("b",))
    spec = StageSpec(run=run, device=devices[stage][0], stage=stage, layers=(stage, stage),
                     model="mlp", dataset="digits", batch_size=8, schedule="1f1b",
                     stage_devices=devices, stage_times_s=((1.0,), (1.0,)), microbatches=4,
                     generation=generation, first_microbatch=0)
    executor: Any = object()  # the registry never touches it
    return Deployment(spec=spec, executor=executor, clock=Clock(started_at=0.0))


def test_stages_are_held_by_run_pipeline_and_stage() -> None:
    # Prepare
    held = Deployments()
    first, second, other = deployment(stage=0), deployment(stage=1), deployment(run=8)
    # Execute
    for d in (second, first, other):
        held.add(d)
    # Assert
    assert held.get(StageKey(7, 0, 1)) is second and first.key == StageKey(7, 0, 0)
    assert held.of_run(7) == [first, second] and 7 in held and 9 not in held
    with pytest.raises(RegistryError, match="stage 0 of run 7 is already deployed"):
        held.add(deployment(stage=0))
    with pytest.raises(RegistryError, match=r"run 8 is already deployed here \(generation 0"):
        held.add(deployment(run=8, stage=1, generation=1))  # halt the old generation first
    assert held.take_run(7) == [first, second] and held.all() == [other]


def test_a_stage_is_started_once_and_an_unstarted_one_can_be_dropped() -> None:
    held = Deployments()
    d = deployment()
    held.add(d)
    assert not held.busy
    assert held.begin(d) and not held.begin(d)  # the second start is refused
    assert held.busy
    assert held.drop_unstarted(d.key) is None  # running: its thread ends it
    assert held.remove(d) and not held.remove(d)
    late = deployment()
    held.add(late)
    assert held.drop_unstarted(late.key) is late
    assert not held.begin(late)  # dropped before its start came


def test_remove_leaves_a_newer_deployment_of_the_same_stage() -> None:
    held = Deployments()
    old, new = deployment(), deployment()
    held.add(old)
    assert held.remove(old)
    held.add(new)
    assert not held.remove(old) and held.of_run(7) == [new]


def test_concurrent_deploys_starts_and_stops_never_lose_or_double_a_stage() -> None:
    # Prepare: many threads deploy the same stages, start them, drop them and look at them
    held = Deployments()
    runs = range(40)
    started: list[Deployment] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)
    lock = threading.Lock()

    def worker(seed: int) -> None:
        try:
            barrier.wait()
            for run in runs:
                d = deployment(run=run, stage=seed % 2)
                with contextlib.suppress(RegistryError):  # another thread's came first
                    held.add(d)
                mine = held.get(d.key)
                if mine is not None and held.begin(mine):
                    with lock:
                        started.append(mine)
                held.drop_unstarted(d.key)
                assert all(x.spec.run == run for x in held.of_run(run))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    # Execute
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    # Assert: every (run, stage) was started exactly once, and is still held
    assert not errors, errors
    assert sorted((d.spec.run, d.spec.stage) for d in started) == [
        (run, stage) for run in runs for stage in (0, 1)]
    assert sorted(held.all(), key=lambda d: d.key) == sorted(started, key=lambda d: d.key)
    assert len(held) == 2 * len(runs)
