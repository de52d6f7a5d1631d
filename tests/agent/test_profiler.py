"""The profiler measures each layer and produces a valid model profile."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from agent.profiler import measure_overhead, profile_model
from agent.zoo import build_model
from orchestrator.formats import parse_profile


def test_profile_of_the_mlp_on_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    # the warm-up decides how many sweeps to time: 5 here (it was 3 on a loaded CI machine,
    # where the total then never grew)
    monkeypatch.setattr("agent.profiler.timed_sweeps", lambda warm_up_s, **kwargs: 5)
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10)
    seen: list[tuple[int, int]] = []
    profile = profile_model(model, batch_size=16, reference="ci", dataset="digits", repeats=3,
                            progress=False, on_layer=lambda done, total: seen.append((done, total)))
    assert parse_profile(profile.to_json()) == profile
    # a step per layer sized (4 layers + 3 repeats), then one per timed sweep, to the end
    assert seen == [(1, 7), (2, 7), (3, 7), (4, 7), (5, 9), (6, 9), (7, 9), (8, 9), (9, 9)]
    fc1 = profile.layers[0]
    assert fc1.output_bytes == 16 * 256 * 4
    assert fc1.param_bytes == (64 * 256 + 256) * 4
    # it keeps its (flattened) input and its ReLU output, not its own weights
    assert fc1.activation_bytes == 16 * 64 * 4 + 16 * 256 * 4
    assert all(layer.forward_s > 0 and layer.backward_s > 0 for layer in profile.layers)


def test_slowdown_scales_the_times(monkeypatch: pytest.MonkeyPatch) -> None:
    # a clock that advances 1 ms per reading makes every measured interval exactly 1 ms; the
    # fixed cost of an optimizer call (0.4 ms here) comes off each parametrised layer's backward
    ticks = itertools.count()
    monkeypatch.setattr("agent.profiler.time.perf_counter", lambda: next(ticks) * 1e-3)
    monkeypatch.setattr("agent.profiler.optimizer_call_s", lambda: 0.4e-3)
    monkeypatch.setattr("agent.emulation.time.sleep", lambda seconds: None)
    model = build_model("vgg5", input_shape=(1, 8, 8), num_classes=10)
    fast = profile_model(model, batch_size=4, reference="ci", repeats=3, progress=False)
    slow = profile_model(model, batch_size=4, reference="ci", repeats=3, progress=False,
                         slowdown=10.0)
    for zoo_layer, a, b in zip(model.layers, fast.layers, slow.layers, strict=True):
        has_params = any(True for _ in zoo_layer.module.parameters())
        assert a.forward_s == pytest.approx(1e-3)
        assert a.backward_s == pytest.approx(0.6e-3 if has_params else 1e-3)
        assert b.forward_s == pytest.approx(10 * a.forward_s)
        assert b.backward_s == pytest.approx(10 * a.backward_s)


def test_an_emulated_slowdown_settles_what_sleep_overshoots(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.emulation import Slowdown

    # a sleep that always wakes 0.2 ms late: the next waits are shortened by what it overslept
    now = [0.0]
    monkeypatch.setattr("agent.emulation.time.perf_counter", lambda: now[0])

    def late_sleep(seconds: float) -> None:
        now[0] += seconds + 2e-4

    monkeypatch.setattr("agent.emulation.time.sleep", late_sleep)
    emulation = Slowdown(2.0)
    for _ in range(1000):
        emulation.after(1e-4)  # 0.1 ms of work: 0.1 ms more to wait, each time
    assert now[0] == pytest.approx(1000 * 1e-4, abs=3e-4)  # not 1000 * 0.3 ms
    with pytest.raises(ValueError, match="at least 1"):
        Slowdown(0.5)


def test_an_emulated_pass_takes_the_factor_times_the_warm_time_whatever_it_took(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.emulation import CATCH_UP_S, Slowdown

    # a cold pass that took 3x its warm time here is not made 3x slower on the device too:
    # the device's pass takes factor x warm, and a pass with no warm time of its own (the
    # update, counted in the backward's) shortens the next wait by what it took
    now = [0.0]
    waits: list[float] = []
    monkeypatch.setattr("agent.emulation.time.perf_counter", lambda: now[0])

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    monkeypatch.setattr("agent.emulation.time.sleep", sleep)
    emulation = Slowdown(4.0)
    emulation.after(3e-3, warm_s=1e-3)  # 4 ms on the device: 1 ms more
    emulation.after(0.5e-3, warm_s=1e-3)  # 3.5 ms more
    emulation.after(0.2e-3, warm_s=0.0)  # the update: nothing now, 0.2 ms less next time
    emulation.after(1e-3, warm_s=2e-3)  # 8 ms on the device: 7 ms - 0.2 ms more
    emulation.after(9e-3, warm_s=2e-3)  # overran by 1 ms: settled by the next wait
    emulation.after(1e-3, warm_s=1e-3)
    assert waits == pytest.approx([1e-3, 3.5e-3, 6.8e-3, 2e-3])
    assert emulation.debt_s == pytest.approx(0.0)
    # a long overrun (a cold first pass) is not made up by running the next passes unpaced:
    # only CATCH_UP_S of it
    waits.clear()
    emulation.after(50e-3, warm_s=1e-3)
    emulation.after(1e-3, warm_s=1e-3)
    emulation.after(1e-3, warm_s=1e-3)
    assert waits == pytest.approx([3e-3 - CATCH_UP_S, 3e-3])
    waits.clear()
    Slowdown(1.0).after(1e-3, warm_s=5e-3)  # this machine itself: no emulation
    assert waits == []


def test_the_profile_is_taken_warm_with_no_waits_between_sweeps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the waits an emulated slowdown makes a pass cold; the profile scales warm times instead
    monkeypatch.setattr("agent.emulation.time.sleep", lambda seconds: pytest.fail(
        f"the profiler slept {seconds} s"))
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10)
    profile = profile_model(model, batch_size=4, reference="ci", repeats=3, min_time_s=0.0,
                            progress=False, slowdown=8.0)
    from agent.profiler import warm_times

    warm = warm_times(profile, slowdown=8.0)
    assert [8 * t for t in warm.forward_s] == pytest.approx(
        [la.forward_s for la in profile.layers])


@pytest.mark.parametrize("slowdown", [1.0, 6.0])
def test_the_overhead_probe_runs_a_real_stage_and_leaves_no_cycle(
        slowdown: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every agent measures its overhead this way as it starts (agent.runtime.calibrate), then
    freezes its heap: the probe's stage must dispatch through its wrapped passes and be freed
    by its last reference going, not left in a cycle the freeze would keep for good."""
    import gc
    import weakref

    from agent.executor import StageExecutor

    made: list[weakref.ref[StageExecutor]] = []
    init = StageExecutor.__init__

    def recording(self: StageExecutor, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    monkeypatch.setattr(StageExecutor, "__init__", recording)
    gc.disable()  # only references going may free it
    try:
        overhead = measure_overhead(slowdown=slowdown, microbatches=20)
        assert len(made) == 1 and made[0]() is None
    finally:
        gc.enable()
    assert 0.0 <= overhead < 0.1


def test_a_process_s_first_profile_takes_its_sweeps_by_the_warm_sweep_time() -> None:
    """In a fresh process the first sweep pays torch's lazy set-up (hundreds of ms for a 1 ms
    MLP sweep): by the warm-up's mean, the profile took 3 sweeps where 0.25 s holds over a
    hundred. The count is a function of the warm-up's times (a real process's, timed, would
    make a test that fails on a loaded machine: it did)."""
    from agent.profiler import MAX_SWEEPS, timed_sweeps

    assert timed_sweeps([0.297, 0.0015, 0.0016], repeats=3, min_time_s=0.25) == 167
    assert timed_sweeps([0.297, 0.0015, 0.0016], repeats=3, min_time_s=0.25) > 3 * 50
    assert timed_sweeps([0.2, 0.3], repeats=5, min_time_s=0.25) == 5  # at least repeats
    assert timed_sweeps([1e-7], repeats=3, min_time_s=0.25) == MAX_SWEEPS
    assert timed_sweeps([], repeats=3, min_time_s=0.25) == 3  # no warm-up
