"""TAPP: task allocation in pipeline parallelism by deep reinforcement learning (Mao, Tu, Xi,
Wang and Xu, "TAPP: DNN Training for Task Allocation through Pipeline Parallelism Based on
Distributed Deep Reinforcement Learning", Applied Sciences 11(11):4785, 2021).

TAPP learns, for one model on one set of devices, a policy that groups the layers into stages
(the feed-forward *partition network*) and assigns a device to each group (the attention seq2seq
*allocation network*), both trained jointly by policy gradient on the step time of the
candidates it samples. Features: :mod:`orchestrator.tapp_features`; networks and the contiguous
masked partition distribution: :mod:`orchestrator.tapp_policy`.

Training (REINFORCE with a baseline, as in the paper and the hierarchical planner it extends):
each *episode* samples ``samples`` candidates from the current policy, asks the reward for each
one's step time t (seconds), scores it ``R = -sqrt(t)`` and takes one Adam step on
``-mean((R - b) * (log p_partition + log p_allocation))`` with the gradient's global norm clipped
to ``grad_clip``; the baseline b is an exponential moving average of the episodes' mean reward
(``b <- decay * b + (1 - decay) * mean R``, started at the first episode's mean). Logits of both
networks go through ``C * tanh(.)`` (the tanh constant C), which bounds how deterministic the
policy can become and so keeps it exploring. Defaults (:class:`TappSettings`): 32 samples per
episode, hidden width 64, Adam learning rate 0.003, EMA decay 0.9, clip norm 1.0, C = 2.5,
1200 episodes (about 40-60 s on the ResNet-101 testbed on one loaded CPU core).

Best-candidate replay (``elite``, default 2; a deviation, see below): the best distinct feasible
candidates seen so far are added to every episode's batch, scored with the same advantage
``R - b`` under the current policy. Without it the policy on the testbed drifts back to the
single fastest device (a robust local optimum while the other decisions are still random) and
the good multi-stage candidates it has sampled are forgotten; with it the policy keeps sampling
around them. The baseline and the reported mean reward use the on-policy samples only.

The reward is pluggable: a callable from a candidate's stages to its step time in seconds, or
``inf`` when the candidate cannot run (out of memory, a failed trial). :func:`cost_model_reward`
(the default: the cost model's period, ``inf`` when a device's memory is short),
:func:`simulator_reward` (the simulated makespan of one batch) or, later, measured trial runs on
the agents. An infeasible candidate is rewarded as if it took ``fail_factor`` (2) times the
slowest finite step time seen so far in the run (the hierarchical planner's fixed "failing
signal" of 100 s, made scale-free), so it is always worse than any candidate that ran; before
any finite time has been seen it gets the baseline, so it neither pulls nor pushes. Rewards are
memoised per candidate (a measured trial is not re-run).

Contiguity is enforced, not repaired: the partition network's softmax is masked so that each
layer either stays in the previous layer's group or opens the next one (see
:mod:`orchestrator.tapp_policy`), and a device that served an earlier stage is masked in the
allocation decoder; a group given the same device as the group before it joins that stage. At
inference each layer takes its most probable allowed group and each group its most probable
allowed device (the *greedy* plan). The planner returns the best candidate the reward has seen,
the final greedy plan included (the paper trains "until it obtains the optimal allocation"; its
best sample is what one deploys), and its ``predicted`` figures come from the cost model like
every planner's.

Warm start (initial output biases only; the networks are otherwise trained from scratch):
- partition: the squashed logits start descending by ln((1 - p) / p) from one group to the next,
  so each layer opens a new group with probability about p = (G - 1) / (L - 1) and the first
  samples spread their cuts over the whole model instead of opening every group in the first
  few layers;
- allocation: device d starts with probability proportional to speed_d ** 0.5 (its whole-model
  time on the profile, ``speed_prior``), so the first samples favour fast devices without ruling
  out slow ones, which can serve a light stage well (the testbed's optimum ends on a Raspberry
  Pi or a Jetson CPU).

Reproducible: a seed drives the initial weights (``torch.manual_seed`` inside a forked RNG, so the
caller's random state is untouched) and the sampling (a seeded numpy generator for partitions, a
seeded torch generator for devices); training runs on one thread (restored afterwards), where
torch's CPU kernels for these ops are deterministic. ``torch.use_deterministic_algorithms`` is
not switched on: it imports torch's compiler stack (seconds) and changes nothing on CPU here.

Reconstruction notes and deviations from the paper:
- a layer of the profile is the paper's operation; FLOPs are the reference forward + backward
  time; the paper's groups are pipeline stages, one device each (no replicas inside a stage);
  there are G = min(devices, layers) groups, since a device serves one stage, and unused devices
  stay idle;
- the allocation decoder also reads the encoding of the group it places and masks devices of
  earlier stages; group features are the mean of the layers' features plus the group's compute
  and memory shares;
- the paper trains for 0.3-1.6 hours with measured rewards; EdgePipe's budget is a minute of
  CPU, hence the warm start and the best-candidate replay above. Set ``elite=0`` and
  ``speed_prior=0`` for the paper's plain REINFORCE from scratch;
- the best plan is polished by a local search under the same reward (:func:`polish`, at most
  ``polish`` reward calls; ``polish=0`` deploys the best sample as the paper does).
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from orchestrator.cost import CostModel, evaluate
from orchestrator.errors import PlanningError
from orchestrator.partition.common import (
    RawStage,
    check_plan_options,
    finish_plan,
    to_stages,
)
from orchestrator.partition.ordered import ordered_dp
from orchestrator.planformat import Plan, Stage
from orchestrator.simulator import simulate
from orchestrator.tapp_features import layer_features
from orchestrator.tapp_policy import (
    AllocationNet,
    PartitionNet,
    contiguous_log_prob,
    group_features,
    sample_contiguous,
    squash,
)

Reward = Callable[[Sequence[Stage]], float]
"""A candidate's stages -> its step time in seconds, ``inf`` if it cannot run."""

EpisodeCallback = Callable[[int, float, float], None]
"""``on_episode(episode, best_reward, mean_reward)`` after every episode (rewards -sqrt(s))."""

DEFAULT_EPISODES = 1200


@dataclass(frozen=True)
class TappSettings:
    """Hyper-parameters of the policy and of its training."""

    samples: int = 32  # candidates sampled per episode
    hidden: int = 64  # width of both networks
    groups: int | None = None  # most stages; default min(devices, layers)
    learning_rate: float = 0.003  # Adam
    baseline_decay: float = 0.9  # EMA of the mean reward
    grad_clip: float = 1.0  # global gradient norm
    tanh_constant: float = 2.5  # logits = C * tanh(logits)
    fail_factor: float = 2.0  # infeasible: this times the slowest finite step time seen
    elite: int = 2  # best distinct candidates replayed in every episode
    speed_prior: float = 0.5  # warm start: device probability ~ speed ** speed_prior
    converge_window: int = 20  # stop once half the samples are the best plan this many
    # consecutive episodes in a row (0: always run every episode)
    polish: int = 400  # most reward calls of the local search that refines the best plan

    def check(self) -> None:
        if (isinstance(self.converge_window, bool) or not isinstance(self.converge_window, int)
                or self.converge_window < 0):
            raise ValueError(f"converge_window must be a non-negative integer, got "
                             f"{self.converge_window!r}")
        for name in ("samples", "hidden"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.hidden % 2:
            raise ValueError(f"hidden must be even (a bidirectional encoder), got {self.hidden}")
        if self.groups is not None and (isinstance(self.groups, bool)
                                        or not isinstance(self.groups, int) or self.groups < 1):
            raise ValueError(f"groups must be a positive integer, got {self.groups!r}")
        for name in ("learning_rate", "grad_clip", "fail_factor"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if isinstance(self.polish, bool) or not isinstance(self.polish, int) or self.polish < 0:
            raise ValueError(f"polish must be a non-negative integer, got {self.polish!r}")
        if isinstance(self.elite, bool) or not isinstance(self.elite, int) or self.elite < 0:
            raise ValueError(f"elite must be a non-negative integer, got {self.elite!r}")
        if not (isinstance(self.speed_prior, (int, float)) and math.isfinite(self.speed_prior)
                and self.speed_prior >= 0):
            raise ValueError(f"speed_prior must be a non-negative number, got "
                             f"{self.speed_prior!r}")
        if not 0 <= self.baseline_decay < 1:
            raise ValueError(f"baseline_decay must be in [0, 1), got {self.baseline_decay!r}")
        if self.fail_factor < 1:
            raise ValueError(f"fail_factor must be at least 1, got {self.fail_factor!r}")


@dataclass(frozen=True)
class TappResult:
    """What training found: the best candidate, the final greedy one and the reward curve."""

    best: tuple[RawStage, ...]
    best_step_s: float
    greedy: tuple[RawStage, ...]
    greedy_step_s: float
    best_rewards: tuple[float, ...]  # per episode, the best reward so far
    mean_rewards: tuple[float, ...]  # per episode, the mean reward of its samples
    train_s: float
    learned_step_s: float = math.inf  # the best the policy sampled, before the polish


# --------------------------------------------------------------------------- rewards


def cost_model_reward(cm: CostModel) -> Reward:
    """The cost model's period of the candidate; ``inf`` if a device's memory is short."""

    def reward(stages: Sequence[Stage]) -> float:
        predicted = evaluate(cm, stages)
        return predicted.period_s if predicted.memory_ok else math.inf

    return reward


def simulator_reward(cm: CostModel, *, microbatches: int = 32, schedule: str = "1f1b") -> Reward:
    """The simulated makespan of one batch of ``microbatches`` micro-batches (the step time,
    fill and drain included); ``inf`` if a device's memory is short."""
    check_plan_options(schedule=schedule, microbatches=microbatches)

    def reward(stages: Sequence[Stage]) -> float:
        raw = [(s.first, s.last, tuple(cm.index(d) for d in s.devices)) for s in stages]
        plan = finish_plan(cm, raw, algorithm="tapp", schedule=schedule,
                           microbatches=microbatches, started=time.perf_counter())
        assert plan.predicted is not None
        if not plan.predicted.memory_ok:
            return math.inf
        return simulate(cm, plan, microbatches=microbatches).makespan_s

    return reward


# --------------------------------------------------------------------------- training


def speed_bias(cm: CostModel, *, tanh_constant: float, exponent: float = 0.5
               ) -> tuple[float, ...]:
    """Initial output bias of the allocation network: device d starts with probability
    proportional to (its speed on the whole model)^exponent, so the first samples favour fast
    devices without ruling out slow ones (which can serve a light stage well)."""
    whole = cm.work_prefix[:, -1]
    fastest = float(whole.min())
    targets = [exponent * math.log(fastest / float(t)) if fastest > 0 else 0.0 for t in whole]
    if tanh_constant <= 0:
        return tuple(targets)
    return tuple(math.atanh(max(-0.95, z / tanh_constant)) for z in targets)


@contextmanager
def _deterministic(seed: int) -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    finally:
        torch.set_num_threads(threads)


def _raw_stages(groups: np.ndarray, devices: np.ndarray) -> tuple[RawStage, ...]:
    """The stages of one candidate: group k (a contiguous layer range) on ``devices[k]``;
    adjacent groups on the same device form one stage."""
    num_layers = groups.shape[0]
    starts = [0, *(np.flatnonzero(np.diff(groups)) + 1).tolist()]
    ends = [*(s - 1 for s in starts[1:]), num_layers - 1]
    out: list[RawStage] = []
    for k, (a, e) in enumerate(zip(starts, ends, strict=True)):
        device = int(devices[k])
        if out and out[-1][2] == (device,):
            out[-1] = (out[-1][0], e, (device,))
        else:
            out.append((a, e, (device,)))
    return tuple(out)


def opening_bias(*, groups: int, layers: int, tanh_constant: float) -> tuple[float, ...]:
    """Initial output bias of the partition network: with these (squashed) logits, descending
    by d = ln((1 - p) / p) from one group to the next, a layer opens the next group with
    probability about p = (G - 1) / (L - 1), so the first samples spread their cuts over the
    whole model instead of opening every group in its first few layers."""
    if groups < 2 or layers < 2:
        return (0.0,) * groups
    p = min((groups - 1) / (layers - 1), 0.5)
    step = math.log((1 - p) / p)
    targets = [step * ((groups - 1) / 2 - g) for g in range(groups)]
    if tanh_constant <= 0:
        return tuple(targets)
    return tuple(math.atanh(max(-0.95, min(0.95, z / tanh_constant))) for z in targets)


class _Scorer:
    """Memoised step times and the reward rule, infeasible candidates included."""

    def __init__(self, cm: CostModel, reward: Reward, fail_factor: float) -> None:
        self.cm, self.reward, self.fail_factor = cm, reward, fail_factor
        self.cache: dict[tuple[RawStage, ...], float] = {}
        self.slowest_s = 0.0

    def step_s(self, raw: tuple[RawStage, ...]) -> float:
        if raw not in self.cache:
            t = float(self.reward(to_stages(self.cm, raw)))
            if math.isnan(t) or t < 0:
                raise ValueError(f"the reward returned {t!r} seconds for a candidate; it must "
                                 "be a non-negative number or inf")
            self.cache[raw] = t
            if math.isfinite(t):
                self.slowest_s = max(self.slowest_s, t)
        return self.cache[raw]

    def rewards(self, times: Sequence[float], baseline: float | None) -> list[float]:
        """-sqrt(t); an infeasible candidate as if ``fail_factor`` times the slowest finite
        time seen, or the baseline (no signal) before any finite time is known."""
        fail = (-math.sqrt(self.fail_factor * self.slowest_s) if self.slowest_s > 0
                else baseline)
        out = []
        for t in times:
            if math.isfinite(t):
                out.append(-math.sqrt(t))
            else:
                out.append(fail if fail is not None else 0.0)
        return out


def train_tapp(cm: CostModel, *, episodes: int = DEFAULT_EPISODES, seed: int = 0,
               reward: Reward | None = None, settings: TappSettings | None = None,
               on_episode: EpisodeCallback | None = None, progress: bool = False) -> TappResult:
    """Train TAPP's policy on ``cm``'s model and devices and return what it found."""
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"episodes must be a positive integer, got {episodes!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    settings = settings or TappSettings()
    settings.check()
    started = time.perf_counter()
    num_groups = min(settings.groups or cm.num_devices, cm.num_devices, cm.num_layers)
    scorer = _Scorer(cm, reward or cost_model_reward(cm), settings.fail_factor)
    table = layer_features(cm.profile)
    with _deterministic(seed):
        rows = torch.tensor(table.values, dtype=torch.float32)
        shares = torch.tensor(table.shares, dtype=torch.float32)
        partition = PartitionNet(features=table.width, hidden=settings.hidden, groups=num_groups)
        allocation = AllocationNet(features=table.width + shares.shape[1],
                                   hidden=settings.hidden, devices=cm.num_devices)
        with torch.no_grad():
            partition.out.bias.copy_(torch.tensor(opening_bias(
                groups=num_groups, layers=cm.num_layers, tanh_constant=settings.tanh_constant)))
            allocation.out.bias.copy_(torch.tensor(speed_bias(
                cm, tanh_constant=settings.tanh_constant, exponent=settings.speed_prior)))
        params = [*partition.parameters(), *allocation.parameters()]
        optimizer = torch.optim.Adam(params, lr=settings.learning_rate)
        rng = np.random.default_rng(seed)
        generator = torch.Generator().manual_seed(seed)
        baseline: float | None = None
        streak = 0
        elites: dict[tuple[RawStage, ...], tuple[float, np.ndarray, np.ndarray]] = {}
        best_reward, best_raw, best_s = -math.inf, None, math.inf
        best_curve: list[float] = []
        mean_curve: list[float] = []
        bar = tqdm(total=episodes, desc="tapp", unit="ep", file=sys.stderr, disable=not progress)
        for episode in range(episodes):
            logits = squash(partition(rows), settings.tanh_constant)
            groups = sample_contiguous(logits.detach().numpy().astype(np.float64),
                                       samples=settings.samples, rng=rng)
            forced = None
            if elites:
                kept = sorted(elites.values(), key=lambda x: -x[0])
                forced = torch.full((len(groups) + len(kept), num_groups), -1, dtype=torch.long)
                forced[len(groups):] = torch.from_numpy(np.stack([x[2] for x in kept]))
                groups = np.concatenate([groups, np.stack([x[1] for x in kept])], axis=0)
            feats, lengths = group_features(rows, shares, groups, num_groups)
            devices, alloc_logp = allocation(feats, lengths,
                                             tanh_constant=settings.tanh_constant,
                                             generator=generator, forced=forced)
            device_rows = devices.numpy()
            candidates = [_raw_stages(groups[k], device_rows[k]) for k in range(len(groups))]
            times = [scorer.step_s(raw) for raw in candidates]
            rewards = scorer.rewards(times, baseline)
            for k, (raw, t, r) in enumerate(zip(candidates, times, rewards, strict=True)):
                if math.isfinite(t) and r > best_reward:
                    best_reward, best_raw, best_s = r, raw, t
                if settings.elite and math.isfinite(t) and raw not in elites:
                    elites[raw] = (r, groups[k].copy(), device_rows[k].copy())
                    if len(elites) > settings.elite:
                        del elites[min(elites, key=lambda x: elites[x][0])]
            mean = float(np.mean(rewards[: settings.samples]))  # on-policy samples only
            if baseline is None:
                baseline = mean
            advantage = torch.tensor([r - baseline for r in rewards])
            log_prob = contiguous_log_prob(logits, groups) + alloc_logp
            loss = -(advantage * log_prob).mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
            optimizer.step()
            baseline = settings.baseline_decay * baseline + (1 - settings.baseline_decay) * mean
            best_curve.append(best_reward)
            mean_curve.append(mean)
            hits = sum(raw == best_raw for raw in candidates[: settings.samples])
            streak = streak + 1 if 2 * hits >= settings.samples else 0
            if on_episode is not None:
                on_episode(episode, best_reward, mean)
            bar.update(1)
            if progress and math.isfinite(best_s):
                bar.set_postfix(best_s=f"{best_s:.4g}", refresh=False)
            if settings.converge_window and streak >= settings.converge_window:
                break  # the policy has converged onto the best plan it found
        bar.close()
        with torch.no_grad():
            logits = squash(partition(rows), settings.tanh_constant)
            groups = sample_contiguous(logits.numpy().astype(np.float64), samples=1, rng=None)
            feats, lengths = group_features(rows, shares, groups, num_groups)
            devices, _ = allocation(feats, lengths, tanh_constant=settings.tanh_constant,
                                    generator=None)
    greedy = _raw_stages(groups[0], devices.numpy()[0])
    greedy_s = scorer.step_s(greedy)
    if best_raw is None or greedy_s < best_s:
        best_raw, best_s = greedy, greedy_s
    learned_s = best_s
    if settings.polish and math.isfinite(best_s):
        best_raw, best_s = polish_best(scorer, num_devices=cm.num_devices,
                                       budget=settings.polish)
    return TappResult(best=best_raw, best_step_s=best_s, greedy=greedy, greedy_step_s=greedy_s,
                      best_rewards=tuple(best_curve), mean_rewards=tuple(mean_curve),
                      train_s=time.perf_counter() - started, learned_step_s=learned_s)


POLISH_STARTS = 5
PERMUTE_UP_TO = 5  # plans of at most this many stages also try every order of their devices


def _orders(order: list[int], num_devices: int) -> Iterator[Sequence[int]]:
    """Device sequences one change away from ``order``: itself, two devices swapped, one
    replaced by an unused device, one dropped, an unused device inserted anywhere."""
    unused = [d for d in range(num_devices) if d not in order]
    yield order
    for i in range(len(order)):
        for j in range(i + 1, len(order)):
            swapped = list(order)
            swapped[i], swapped[j] = order[j], order[i]
            yield swapped
        for d in unused:
            yield [*order[:i], d, *order[i + 1:]]
        if len(order) > 1:
            yield [*order[:i], *order[i + 1:]]
    for i in range(len(order) + 1):
        for d in unused:
            yield [*order[:i], d, *order[i:]]


def _neighbours(cm: CostModel, raw: tuple[RawStage, ...], num_devices: int
                ) -> Iterator[tuple[RawStage, ...]]:
    """Plans one change away from ``raw``: a cut moved by one layer; then, for the same device
    sequence and every sequence one change away (two devices swapped, one replaced, dropped or
    inserted) and, for a plan of at most PERMUTE_UP_TO stages, every order of its devices, the
    cuts FTPipeHD's DP places for it on the cost model, as proposals that the reward judges (a
    structural change rarely pays before its cuts move too)."""
    stages = list(raw)
    for k in range(len(stages) - 1):
        (a, e, da), (b, f, db) = stages[k], stages[k + 1]
        if e > a:  # the cut one layer earlier
            yield (*stages[:k], (a, e - 1, da), (e, f, db), *stages[k + 2:])
        if f > b:  # one layer later
            yield (*stages[:k], (a, b, da), (b + 1, f, db), *stages[k + 2:])
    current = [s[2][0] for s in stages]
    orders: Iterator[Sequence[int]] = _orders(current, num_devices)
    if len(current) <= PERMUTE_UP_TO:  # a local optimum of those: every order of its devices
        orders = itertools.chain(orders, itertools.permutations(current))
    for order in orders:
        if len(order) > cm.num_layers:
            continue
        try:
            recut, _ = ordered_dp(cm, order)
        except PlanningError:
            continue  # no cuts fit these devices' memory
        yield tuple(recut)


def polish_best(scorer: _Scorer, *, num_devices: int, budget: int,
                starts: int = POLISH_STARTS) -> tuple[tuple[RawStage, ...], float]:
    """Polish the ``starts`` best distinct candidates the reward has seen (they often lie in
    different basins), best first, sharing ``budget``; the best result."""
    seen = sorted((t, raw) for raw, t in scorer.cache.items() if math.isfinite(t))[:starts]
    best_s, best = seen[0]
    left = budget
    for k, (_, raw) in enumerate(seen):
        before = len(scorer.cache)
        polished, t = polish(scorer, raw, num_devices=num_devices,
                             budget=left // (len(seen) - k))
        left -= len(scorer.cache) - before
        if t < best_s:
            best, best_s = polished, t
    return best, best_s


def polish(scorer: _Scorer, raw: tuple[RawStage, ...], *, num_devices: int, budget: int
           ) -> tuple[tuple[RawStage, ...], float]:
    """Refine a plan by local search under the same reward: take the first neighbour with a
    shorter step time, again, until none is shorter or ``budget`` new reward calls are spent
    (memoised candidates are free). Beyond the paper, which deploys the best sample as it is:
    the policy finds the region, a few hundred cheap evaluations its bottom."""
    best, best_s = raw, scorer.step_s(raw)
    spent = 0
    improved = True
    while improved and spent < budget:
        improved = False
        for candidate in _neighbours(scorer.cm, best, num_devices):
            if candidate not in scorer.cache:
                if spent >= budget:
                    break
                spent += 1
            t = scorer.step_s(candidate)
            if t < best_s:
                best, best_s, improved = candidate, t, True
                break
    return best, best_s


def plan_tapp(cm: CostModel, *, schedule: str = "1f1b", microbatches: int = 8,
              episodes: int = DEFAULT_EPISODES, seed: int = 0, reward: Reward | None = None,
              settings: TappSettings | None = None, on_episode: EpisodeCallback | None = None,
              progress: bool = False) -> Plan:
    """Train TAPP on ``cm`` and return its best candidate as a plan (algorithm ``tapp``)."""
    check_plan_options(schedule=schedule, microbatches=microbatches)
    started = time.perf_counter()
    result = train_tapp(cm, episodes=episodes, seed=seed, reward=reward, settings=settings,
                        on_episode=on_episode, progress=progress)
    return finish_plan(cm, result.best, algorithm="tapp", schedule=schedule,
                       microbatches=microbatches, started=started)
