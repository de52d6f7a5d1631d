"""PipeLearn and its two baselines planned for every client, with the per-epoch figures the
paper reports: training time, device and server idle time, network throughput.

Zhang et al., "PipeLearn: Pipeline Parallelism for Collaborative Machine Learning" (Section V).
Every client trains ``ceil(data_size / batch_size)`` iterations of a full batch per epoch, then
the device-side models are aggregated (FedAvg, once per epoch): each client uploads its
device-side parameters, the server averages them once all have arrived (an ``aggregate`` of
zero modelled time: averaging a few megabytes is negligible next to the transfers), and each
client downloads its part back. Methods:

- ``pipelearn``: per client the (P, N) of :func:`orchestrator.pipelearn.choose_split` (or the
  exhaustive optimum), server-side replicas in parallel with the contention slowdown;
- ``sfl``: split federated learning, the best split by the same time model with N = 1 (no
  reordering: forward, upload, server, download, backward in sequence), same server sharing;
- ``fl``: federated learning, the whole model trained on the device; the whole model is
  uploaded and downloaded at aggregation.

The epoch ends when the last client has its aggregated model. Idle time over the epoch: a
device's is the epoch minus its forward and backward time; a server replica's the epoch minus
its server-side forward and backward time; the server's the epoch minus the union of its
replicas' busy intervals. Network throughput: bytes moved (activations, gradients, models) per
second of the epoch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.cost import CostModel, build_cost_model
from orchestrator.errors import PlanningError
from orchestrator.formats import DeviceSet, ModelProfile
from orchestrator.pipelearn import (
    DEFAULT_TOLERANCE,
    Rule,
    SplitChoice,
    StageTimes,
    asap_schedule,
    choose_split,
    exhaustive_split,
    iteration_time,
    server_slowdown,
    stage_times,
)

DEFAULT_DATA_SIZE = 10_000
"""Training samples per client: PipeLearn's default experiment (data/pipelearn)."""

METHODS = ("pipelearn", "sfl", "fl")


@dataclass(frozen=True, eq=False)
class Setting:
    """What every method is planned for."""

    cm: CostModel
    server: str
    clients: tuple[str, ...]
    batch_size: int
    data_size: int
    server_parallelism: int = 1

    @property
    def iterations(self) -> int:
        return math.ceil(self.data_size / self.batch_size)

    @property
    def slowdown(self) -> float:
        return server_slowdown(clients=len(self.clients), parallelism=self.server_parallelism)


def make_setting(*, profile: ModelProfile, devices: DeviceSet, server: str,
                 batch_size: int | None = None, data_size: int = DEFAULT_DATA_SIZE,
                 server_parallelism: int = 1) -> Setting:
    """Validate the inputs: every device other than ``server`` is a client."""
    if server not in devices.ids:
        raise ValueError(f"--server {server!r} is not a device of {devices.file} (devices: "
                         f"{', '.join(devices.ids)})")
    clients = tuple(d for d in devices.ids if d != server)
    if not clients:
        raise PlanningError(f"{devices.file} has no client: every device other than the server "
                            f"{server!r} is one")
    if profile.num_layers < 2:
        raise PlanningError(f"the profile {profile.model!r} ({profile.file}) has one layer: it "
                            "cannot be split between a device and the server")
    batch = profile.batch_size if batch_size is None else batch_size
    for name, value in (("batch size", batch), ("data size", data_size),
                        ("server parallelism", server_parallelism)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return Setting(cm=build_cost_model(profile, devices), server=server, clients=clients,
                   batch_size=batch, data_size=data_size, server_parallelism=server_parallelism)


@dataclass(frozen=True)
class DevicePlan:
    """One client's part of a method: its split, micro-batches and the times that follow."""

    device: str
    split: int  # layers [0, split) on the device; all layers for FL
    parallel_batches: int
    stages: StageTimes
    iteration_s: float
    activation_bytes: float  # uploaded per iteration (the gradients downloaded are as large)
    model_bytes: float  # device-side parameters, uploaded and downloaded at aggregation
    model_up_s: float  # transfer time of the upload, without latency
    model_down_s: float
    latency_s: float  # of a transfer between the client and the server


@dataclass(frozen=True)
class DeviceFigures:
    """One client's per-epoch figures within its method."""

    train_s: float
    own_epoch_s: float  # training and its own aggregation transfers, without waiting
    device_idle_s: float
    replica_idle_s: float
    network_bps: float


@dataclass(frozen=True)
class MethodPlan:
    method: str
    setting: Setting
    devices: tuple[DevicePlan, ...]
    aggregate_at_s: float  # when the server has every client's model
    epoch_s: float
    server_idle_s: float
    figures: tuple[DeviceFigures, ...]
    planner_s: float = 0.0
    exhaustive: bool = False

    def device(self, device_id: str) -> DevicePlan:
        for d in self.devices:
            if d.device == device_id:
                return d
        raise KeyError(device_id)

    @property
    def network_bps(self) -> float:
        return sum(f.network_bps for f in self.figures)

    def to_json(self) -> dict[str, Any]:
        b = self.setting.batch_size
        devices = {}
        for d, f in zip(self.devices, self.figures, strict=True):
            devices[d.device] = {
                "split": d.split, "parallel_batches": d.parallel_batches,
                "minibatch": b // d.parallel_batches, "iteration_s": d.iteration_s,
                "epoch_s": f.own_epoch_s,
                "idle_s": {"device": f.device_idle_s, "server": f.replica_idle_s},
                "network_bps": f.network_bps, "stage_s": d.stages.to_json(),
            }
        return {"method": self.method, "devices": devices, "epoch_s": self.epoch_s,
                "server_idle_s": self.server_idle_s, "network_bps": self.network_bps,
                "planner_s": self.planner_s}


def _device_plan(setting: Setting, device: str, choice: SplitChoice) -> DevicePlan:
    cm = setting.cm
    dev = cm.devices.device(device)
    r = setting.batch_size / cm.profile.batch_size
    model = float(cm.param_prefix[choice.split])
    return DevicePlan(device=device, split=choice.split,
                      parallel_batches=choice.parallel_batches, stages=choice.stages,
                      iteration_s=choice.iteration_s,
                      activation_bytes=r * float(cm.output_bytes[choice.split - 1]),
                      model_bytes=model, model_up_s=model / dev.up_bps,
                      model_down_s=model / dev.down_bps, latency_s=choice.stages.latency_s)


def _fl_plan(setting: Setting, device: str) -> DevicePlan:
    cm = setting.cm
    d = cm.index(device)
    r = setting.batch_size / cm.profile.batch_size
    forward, backward = cm.fixed_pass_s(d, 0, cm.num_layers - 1)
    stages = StageTimes(r * float(cm.fwd_prefix[d, -1]), 0.0, 0.0, 0.0, 0.0,
                        r * float(cm.bwd_prefix[d, -1]),  # nothing crosses the network
                        pass_s=(forward, 0.0, 0.0, 0.0, 0.0, backward))
    dev = cm.devices.device(device)
    model = float(cm.param_prefix[-1])
    return DevicePlan(device=device, split=cm.num_layers, parallel_batches=1, stages=stages,
                      iteration_s=iteration_time(stages=stages, parallel_batches=1),
                      activation_bytes=0.0, model_bytes=model, model_up_s=model / dev.up_bps,
                      model_down_s=model / dev.down_bps,
                      latency_s=float(cm.latency_s[d, cm.index(setting.server)]))


def union_length_s(starts: np.ndarray[Any, Any], ends: np.ndarray[Any, Any]) -> float:
    """Total length of the union of intervals [starts[i], ends[i])."""
    if starts.size == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    group = np.cumsum(new) - 1
    first = s[new]
    last = np.zeros(first.size)
    np.maximum.at(last, group, e)
    return float(np.sum(last - first))


def server_busy_intervals(plan: DevicePlan, iterations: int) -> tuple[np.ndarray[Any, Any],
                                                                     np.ndarray[Any, Any]]:
    """Start and end of the server replica's forward+backward of each micro-batch over the
    epoch's iterations (iteration j shifted by j x the iteration time)."""
    if plan.stages.server_s <= 0:
        return np.zeros(0), np.zeros(0)
    n = plan.parallel_batches
    sched = asap_schedule(stages=plan.stages, parallel_batches=n)
    base_s = np.array([sched[("server_forward", i)][0] for i in range(n)])
    base_e = np.array([sched[("server_backward", i)][1] for i in range(n)])
    shift = np.arange(iterations, dtype=np.float64)[:, None] * plan.iteration_s
    return (base_s[None, :] + shift).ravel(), (base_e[None, :] + shift).ravel()


def evaluate(setting: Setting, method: str, plans: Sequence[DevicePlan], *,
             planner_s: float = 0.0, exhaustive: bool = False) -> MethodPlan:
    """The per-epoch figures of a method whose clients have these plans."""
    iters = setting.iterations
    aggregate_at = max(iters * p.iteration_s + p.model_up_s + p.latency_s for p in plans)
    epoch = max(aggregate_at + p.model_down_s + p.latency_s for p in plans)
    starts, ends = zip(*(server_busy_intervals(p, iters) for p in plans), strict=True)
    server_idle = epoch - union_length_s(np.concatenate(starts), np.concatenate(ends))
    figures = tuple(DeviceFigures(
        train_s=iters * p.iteration_s,
        own_epoch_s=iters * p.iteration_s + p.model_up_s + p.model_down_s + 2 * p.latency_s,
        device_idle_s=epoch - iters * p.stages.device_busy_s(p.parallel_batches),
        replica_idle_s=epoch - iters * p.stages.server_busy_s(p.parallel_batches),
        network_bps=(2 * iters * p.activation_bytes + 2 * p.model_bytes) / epoch,
    ) for p in plans)
    return MethodPlan(method=method, setting=setting, devices=tuple(plans),
                      aggregate_at_s=aggregate_at, epoch_s=epoch, server_idle_s=server_idle,
                      figures=figures, planner_s=planner_s, exhaustive=exhaustive)


def chosen_split(setting: Setting, device: str, *, split: int,
                 parallel_batches: int) -> SplitChoice:
    """A user's (P, N) for ``device`` with the time model's iteration; ValueError naming the
    field unless P is in 1..L-1 (layers [0, P) on the device) and N in 1..B."""
    layers, batch = setting.cm.num_layers, setting.batch_size
    for name, value, most in (("split", split, layers - 1),
                              ("parallel_batches", parallel_batches, batch)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise ValueError(f"overrides.{device}.{name}: must be an integer from 1 to {most} "
                             f"(the model has {layers} layers, B is {batch}), got {value!r}")
    stages = stage_times(cm=setting.cm, device=device, server=setting.server, split=split,
                         batch_size=batch, slowdown=setting.slowdown)
    return SplitChoice(split, parallel_batches,
                       iteration_time(stages=stages, parallel_batches=parallel_batches), stages)


def plan_method(setting: Setting, method: str, *, exhaustive: bool = False,
                rule: Rule = "saturated", tolerance: float = DEFAULT_TOLERANCE,
                overrides: Mapping[str, tuple[int, int]] | None = None) -> MethodPlan:
    """Plan ``method`` (one of :data:`METHODS`) for every client of ``setting``; the (P, N)
    of a device in ``overrides`` is the given one under PipeLearn and SFL
    (:func:`chosen_split`)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    unknown = sorted(set(overrides or {}) - set(setting.clients))
    if unknown:
        raise ValueError(f"overrides.{unknown[0]}: is not a client of the run")
    started = time.perf_counter()
    plans = []
    for device in setting.clients:
        if method == "fl":
            plans.append(_fl_plan(setting, device))
            continue
        if method in ("pipelearn", "sfl") and overrides and device in overrides:
            split, n = overrides[device]
            plans.append(_device_plan(setting, device, chosen_split(
                setting, device, split=split, parallel_batches=n)))
            continue
        if method == "sfl" or exhaustive:
            choice = exhaustive_split(cm=setting.cm, device=device, server=setting.server,
                                      batch_size=setting.batch_size, slowdown=setting.slowdown,
                                      max_parallel_batches=1 if method == "sfl" else None)
        else:
            choice = choose_split(cm=setting.cm, device=device, server=setting.server,
                                  batch_size=setting.batch_size, slowdown=setting.slowdown,
                                  rule=rule, tolerance=tolerance)
        plans.append(_device_plan(setting, device, choice))
    return evaluate(setting, method, plans, planner_s=time.perf_counter() - started,
                    exhaustive=exhaustive and method == "pipelearn")


def score(*, chosen: DevicePlan, best: DevicePlan) -> float:
    """Time of the exhaustive best over the time of the choice (1.0 = optimal)."""
    if chosen.iteration_s <= 0:
        return 1.0
    return best.iteration_s / chosen.iteration_s


@dataclass(frozen=True)
class Comparison:
    """PipeLearn and both baselines on one setting (what the CLI prints)."""

    pipelearn: MethodPlan
    sfl: MethodPlan
    fl: MethodPlan
    rule: Rule
    closed_form: MethodPlan | None = None  # with --exhaustive: the rule's own choice

    def speedup(self, baseline: MethodPlan) -> float:
        return baseline.epoch_s / self.pipelearn.epoch_s

    def to_json(self) -> dict[str, Any]:
        s = self.pipelearn.setting
        out = self.pipelearn.to_json()
        if self.closed_form is not None:
            for d in self.closed_form.devices:
                best = self.pipelearn.device(d.device)
                out["devices"][d.device]["closed_form"] = {
                    "split": d.split, "parallel_batches": d.parallel_batches,
                    "iteration_s": d.iteration_s, "score": score(chosen=d, best=best)}
        out.update({
            "model": s.cm.profile.model, "server": s.server, "clients": list(s.clients),
            "batch_size": s.batch_size, "data_size": s.data_size, "iterations": s.iterations,
            "server_parallelism": s.server_parallelism, "server_slowdown": s.slowdown,
            "rule": self.rule, "exhaustive": self.pipelearn.exhaustive,
            "speedup": {"fl": self.speedup(self.fl), "sfl": self.speedup(self.sfl)},
            "fl": self.fl.to_json(), "sfl": self.sfl.to_json(),
        })
        return out


def compare(setting: Setting, *, exhaustive: bool = False, rule: Rule = "saturated",
            tolerance: float = DEFAULT_TOLERANCE) -> Comparison:
    """PipeLearn (by ``rule``, or exhaustive search with the rule's choice scored against it),
    SFL and FL on one setting."""
    chosen = plan_method(setting, "pipelearn", rule=rule, tolerance=tolerance)
    best = plan_method(setting, "pipelearn", exhaustive=True) if exhaustive else None
    return Comparison(pipelearn=best or chosen, sfl=plan_method(setting, "sfl"),
                      fl=plan_method(setting, "fl"), rule=rule,
                      closed_form=chosen if exhaustive else None)

