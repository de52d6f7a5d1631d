"""TAPP (orchestrator.tapp): the layer features on a hand-checked model, the contiguous masked
partition distribution, reproducibility, learning, valid plans, the pluggable reward, the CLI."""

from __future__ import annotations

import itertools
import json
import math
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from orchestrator.cost import CostModel, build_cost_model, evaluate
from orchestrator.formats import DeviceSet, Layer, ModelProfile
from orchestrator.partition import run_planner
from orchestrator.planformat import Stage, check_stages
from orchestrator.simulator import simulate
from orchestrator.tapp import (
    TappSettings,
    cost_model_reward,
    plan_tapp,
    simulator_reward,
    train_tapp,
)
from orchestrator.tapp_features import layer_features
from orchestrator.tapp_policy import contiguous_log_prob, group_features, sample_contiguous
from tests.conftest import DATA, ROOT
from tests.orchestrator.instances import make_device, make_profile, random_instance

FAST = TappSettings(samples=16, converge_window=0)  # every episode runs


def hand_model() -> ModelProfile:
    layers = (
        Layer("c1", "conv", 1.0, 2.0, output_bytes=100, param_bytes=10, activation_bytes=50),
        Layer("r1", "relu", 0.5, 0.5, output_bytes=100, param_bytes=0, activation_bytes=100),
        Layer("fc", "linear", 1.0, 1.0, output_bytes=10, param_bytes=30, activation_bytes=0),
    )
    return ModelProfile(model="hand", batch_size=8, reference="ref", layers=layers)


def test_layer_features_of_a_hand_checked_model() -> None:
    table = layer_features(hand_model())
    assert table.columns == (
        "kind=conv", "kind=linear", "kind=relu",
        "params", "flops", "activations", "output", "cum_flops", "cum_memory",
        "prev", "prev_dir", "next", "next_dir")
    expected = np.array([
        # conv linear relu | params flops acts output | cum_flops cum_memory | links
        [1, 0, 0, 1 / 3, 1.0, 0.5, 1.0, 3 / 6, 60 / 190, 0.0, 0.0, 0.5, 1.0],
        [0, 0, 1, 0.0, 1 / 3, 1.0, 1.0, 4 / 6, 160 / 190, 0.0, -1.0, 1.0, 1.0],
        [0, 1, 0, 1.0, 2 / 3, 0.0, 0.1, 6 / 6, 190 / 190, 0.5, -1.0, 0.0, 0.0],
    ])
    np.testing.assert_allclose(table.values, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(table.shares, [[3 / 6, 60 / 190], [1 / 6, 100 / 190],
                                              [2 / 6, 30 / 190]], atol=1e-12)
    with pytest.raises(ValueError, match="'flop'"):
        table.column("flop")


def test_group_features_average_the_layers_and_sum_their_shares() -> None:
    table = layer_features(hand_model())
    rows = torch.tensor(table.values, dtype=torch.float64)
    shares = torch.tensor(table.shares, dtype=torch.float64)
    feats, lengths = group_features(rows, shares, np.array([[0, 0, 1], [0, 0, 0]]), 3)
    assert lengths.tolist() == [2, 1]
    np.testing.assert_allclose(feats[0, 0, :table.width], table.values[:2].mean(axis=0))
    np.testing.assert_allclose(feats[0, 0, table.width:], table.shares[:2].sum(axis=0))
    np.testing.assert_allclose(feats[0, 1, :table.width], table.values[2])
    np.testing.assert_allclose(feats[1, 0, table.width:], [1.0, 1.0])
    assert float(feats[0, 2].abs().sum()) == 0.0  # an unused group is all zeros


def monotone_partitions(num_layers: int, groups: int) -> list[list[int]]:
    """Every group sequence that starts at 0 and rises by at most 1 per layer."""
    out = []
    for steps in itertools.product((0, 1), repeat=num_layers - 1):
        seq = [0, *itertools.accumulate(steps)]
        if seq[-1] < groups:
            out.append(seq)
    return out


def test_masked_partition_is_a_distribution_over_contiguous_groupings() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    every = np.array(monotone_partitions(5, 3))
    total = contiguous_log_prob(logits, every).exp().sum()
    assert float(total) == pytest.approx(1.0, abs=1e-12)
    # sampling frequencies follow those probabilities, and every sample is contiguous
    draws = sample_contiguous(logits.numpy(), samples=20_000, rng=np.random.default_rng(0))
    assert set(map(tuple, draws)) <= set(map(tuple, every))
    probs = contiguous_log_prob(logits, every).exp().numpy()
    counts = [(draws == row).all(axis=1).mean() for row in every]
    np.testing.assert_allclose(counts, probs, atol=0.015)
    greedy = sample_contiguous(logits.numpy(), samples=1, rng=None)[0]
    assert np.all(np.diff(greedy) >= 0) and np.all(np.diff(greedy) <= 1) and greedy[0] == 0


def small_instance(seed: int) -> CostModel:
    return random_instance(random.Random(seed), layers=10, devices=4, memory_pressure=False)


def test_same_seed_same_plan_and_curve() -> None:
    cm = small_instance(5)
    runs = [train_tapp(cm, episodes=25, seed=7, settings=FAST) for _ in range(2)]
    assert runs[0].best == runs[1].best and runs[0].greedy == runs[1].greedy
    assert runs[0].mean_rewards == runs[1].mean_rewards
    assert torch.get_num_threads() >= 1  # the thread count is restored after training
    other = train_tapp(cm, episodes=25, seed=8, settings=FAST)
    assert other.mean_rewards != runs[0].mean_rewards


def test_policy_improves_its_expected_reward() -> None:
    cm = small_instance(11)
    curve: list[tuple[int, float, float]] = []
    result = train_tapp(cm, episodes=150, seed=0, settings=FAST,
                        on_episode=lambda e, best, mean: curve.append((e, best, mean)))
    assert [e for e, _, _ in curve] == list(range(150))
    means = [m for _, _, m in curve]
    early, late = float(np.mean(means[:30])), float(np.mean(means[-30:]))
    assert late > early + 0.05 * abs(early), (early, late)
    bests = [b for _, b, _ in curve]
    assert all(b2 >= b1 for b1, b2 in itertools.pairwise(bests))  # best so far never drops
    assert bests[-1] == pytest.approx(-math.sqrt(result.best_step_s))


@pytest.mark.parametrize("seed", range(6))
def test_plans_are_valid_on_random_instances(seed: int) -> None:
    rng = random.Random(100 + seed)
    cm = random_instance(rng, layers=rng.randint(1, 14), devices=rng.randint(1, 5),
                         measured=True, memory_pressure=seed % 2 == 0)
    plan = plan_tapp(cm, episodes=25, seed=seed, settings=FAST, microbatches=4)
    check_stages(plan.stages, num_layers=cm.num_layers, device_ids=cm.devices.ids)
    assert plan.algorithm == "tapp" and plan.microbatches == 4
    assert plan.predicted == evaluate(cm, plan.stages)
    layers = [i for s in plan.stages for i in range(s.first, s.last + 1)]
    assert layers == list(range(cm.num_layers))  # contiguous, every layer once, in order
    devices = [d for s in plan.stages for d in s.devices]
    assert len(devices) == len(set(devices)) and set(devices) <= set(cm.devices.ids)
    assert all(len(s.devices) == 1 for s in plan.stages)


def test_reward_is_pluggable_and_infeasible_candidates_lose() -> None:
    # d0 is by far the fastest device, but the reward calls every plan that uses it infeasible
    profile = make_profile([(1.0, 1.0)] * 6)
    devices = DeviceSet(devices=(make_device("d0", 10.0), make_device("d1", 1.0),
                                 make_device("d2", 1.0)))
    cm = build_cost_model(profile, devices)
    base = cost_model_reward(cm)
    calls: list[tuple[Stage, ...]] = []

    def reward(stages: tuple[Stage, ...] | list[Stage]) -> float:
        calls.append(tuple(stages))
        return math.inf if any("d0" in s.devices for s in stages) else base(stages)

    rewards: list[float] = []
    plan = plan_tapp(cm, episodes=60, seed=1, settings=FAST, reward=reward,
                     on_episode=lambda e, best, mean: rewards.append(mean))
    assert "d0" not in {d for s in plan.stages for d in s.devices}
    assert all(math.isfinite(r) for r in rewards)
    assert len(calls) == len(set(calls))  # memoised: each candidate is scored once
    assert run_planner(cm, "optimal").predicted is not None


def test_simulator_reward_is_the_simulated_batch_time() -> None:
    cm = small_instance(2)
    reward = simulator_reward(cm, microbatches=4)
    plan = run_planner(cm, "optimal")
    assert reward(plan.stages) == pytest.approx(simulate(cm, plan, microbatches=4).makespan_s)
    tight = random_instance(random.Random(4), layers=6, devices=2)
    stages = (Stage(layers=(0, 5), devices=(tight.devices.ids[0],)),)
    if not evaluate(tight, stages).memory_ok:
        assert simulator_reward(tight, microbatches=4)(stages) == math.inf
    tapp = plan_tapp(cm, episodes=3, seed=0, settings=FAST, reward=reward)
    check_stages(tapp.stages, num_layers=cm.num_layers, device_ids=cm.devices.ids)


def test_training_stops_once_converged() -> None:
    cm = random_instance(random.Random(3), layers=3, devices=2, memory_pressure=False)
    result = train_tapp(cm, episodes=1000, seed=0, settings=TappSettings(converge_window=10))
    assert len(result.mean_rewards) < 1000
    assert result.best_step_s == pytest.approx(run_planner(cm, "optimal").predicted.period_s)


def test_bad_options_name_the_value() -> None:
    cm = small_instance(1)
    with pytest.raises(ValueError, match=r"episodes.*0"):
        train_tapp(cm, episodes=0)
    with pytest.raises(ValueError, match=r"seed.*-1"):
        train_tapp(cm, episodes=1, seed=-1)
    with pytest.raises(ValueError, match=r"learning_rate.*-0\.1"):
        train_tapp(cm, episodes=1, settings=TappSettings(learning_rate=-0.1))
    with pytest.raises(ValueError, match=r"hidden.*7"):
        train_tapp(cm, episodes=1, settings=TappSettings(hidden=7))
    with pytest.raises(ValueError, match="schedule"):
        plan_tapp(cm, episodes=1, schedule="zigzag")

    def broken(stages: object) -> float:
        return -1.0

    with pytest.raises(ValueError, match=r"-1\.0 seconds"):
        train_tapp(cm, episodes=1, reward=broken)


def test_cli_plan_with_tapp() -> None:
    profile = str(DATA / "profiles" / "resnet101_cifar10.model.json")
    devices = str(DATA / "profiles" / "resnet101_cifar10.devices.json")
    base = [sys.executable, "-m", "orchestrator", "plan", "--profile", profile,
            "--devices", devices]
    done = subprocess.run([*base, "--algorithm", "tapp", "--episodes", "5", "--seed", "3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["algorithm"] == "tapp" and plan["predicted"]["memory_ok"] is True
    assert "5/5" in done.stderr  # the progress bar, on stderr
    wrong = subprocess.run([*base, "--algorithm", "optimal", "--episodes", "20"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2
    assert "--episodes applies to --algorithm tapp only" in wrong.stderr


def test_the_polish_never_worsens_a_plan_keeps_its_budget_and_often_finds_the_optimum() -> None:
    from orchestrator.tapp import _Scorer, polish

    rng = random.Random(11)
    reached = 0
    for _ in range(20):
        cm = random_instance(rng, layers=rng.randint(3, 8), devices=rng.randint(2, 4))
        calls: list[int] = []
        reward = cost_model_reward(cm)

        def counted(stages, calls=calls, reward=reward):  # type: ignore[no-untyped-def]
            calls.append(1)
            return reward(stages)

        scorer = _Scorer(cm, counted, fail_factor=2.0)
        start = ((0, cm.num_layers - 1, (rng.randrange(cm.num_devices),)),)  # all on one device
        start_s = scorer.step_s(start)
        budget = 60
        raw, step_s = polish(scorer, start, num_devices=cm.num_devices, budget=budget)
        assert step_s <= start_s and step_s == scorer.step_s(raw)
        assert len(calls) <= budget + 1  # the start's own evaluation, then the budget
        check_stages(to_stages_for(cm, raw), num_layers=cm.num_layers, device_ids=cm.devices.ids)
        try:
            best = run_planner(cm, "optimal").predicted.period_s
        except Exception:  # no single-device-per-stage plan fits
            continue
        reached += math.isclose(step_s, best, rel_tol=1e-9)
    assert reached >= 15  # a local search: most small instances (18 of 19 here), not all


def to_stages_for(cm: CostModel, raw) -> tuple[Stage, ...]:
    from orchestrator.partition.common import to_stages

    return to_stages(cm, raw)


def test_training_returns_the_polished_plan_and_what_the_policy_found() -> None:
    cm = random_instance(random.Random(5), layers=6, devices=3)
    plain = train_tapp(cm, episodes=5, seed=0, settings=TappSettings(polish=0, samples=4))
    polished = train_tapp(cm, episodes=5, seed=0, settings=TappSettings(samples=4))
    assert plain.best_step_s == plain.learned_step_s
    assert polished.learned_step_s == plain.learned_step_s  # the same training, then polished
    assert polished.best_step_s <= polished.learned_step_s
    with pytest.raises(ValueError, match="polish must be a non-negative integer"):
        TappSettings(polish=-1).check()
