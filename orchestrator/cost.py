"""The cost model of docs/architecture.md: the objective every pipeline planner minimises.

For stage k (layers a..e, devices G, S stages):

- compute ``C = 1 / sum_d 1/t_d`` with ``t_d`` the stage's forward + backward time on device d
  (its ``layer_times`` if measured, else reference time / speed), plus the device's
  ``overhead_s``, the fixed cost of a micro-batch on a stage beyond its layers (an EdgePipe
  extension, 0 by default: see docs/architecture.md), and ``message_s`` for each message the
  stage sends per micro-batch (:func:`stage_messages`: 1 first, 2 in the middle, 1 last, none
  alone);
- replica sync ``Y = 2 (n-1)/n * P / (slowest link inside G)`` for n = |G| > 1;
- stage time ``T_k = max(C, Y)``;
- boundary ``X_k = max over d in G_k, d' in G_k+1 of 2 (output_bytes[e] / bw + latency)``;
- period ``= max_k max(T_k, X_k)``, throughput ``= batch_size / period``;
- memory of a device of stage k under 1F1B with weight stashing ``(S-k)(P+A) + 2P``.

With a Duan-Wu ``beta`` allocation, C becomes ``max(F / sum_j beta_j f_j, B / sum_j (1-beta_j)
b_j)`` over the resources j of the stage's devices (see :mod:`orchestrator.allocation`).

:class:`CostModel` precomputes prefix sums once per (profile, devices) pair so that planners can
ask for thousands of stage times cheaply; :func:`evaluate` is the one place a plan's
``predicted`` figures come from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from orchestrator.errors import PlanningError
from orchestrator.formats import DeviceSet, ModelProfile, check_compatible, synchronous
from orchestrator.planformat import Plan, Prediction, Stage, check_stages

FloatArray = npt.NDArray[np.float64]

LINK_SLACK = 1.0  # of a period, for 1F1B cycles that cross a link (see needed_inflight)


@dataclass(frozen=True, eq=False)
class CostModel:
    """Per-device prefix sums of layer times, and the link matrices, for one profile and one
    device set. Devices are addressed by their index in ``devices.devices``."""

    profile: ModelProfile
    devices: DeviceSet
    fwd_prefix: FloatArray  # [N, L+1] cumulative forward time on each device
    bwd_prefix: FloatArray  # [N, L+1] cumulative backward time on each device
    ref_fwd_prefix: FloatArray  # [L+1] cumulative reference forward time
    ref_bwd_prefix: FloatArray  # [L+1]
    param_prefix: FloatArray  # [L+1] cumulative parameter bytes
    act_prefix: FloatArray  # [L+1] cumulative activation bytes
    output_bytes: FloatArray  # [L]
    bandwidth_bps: FloatArray  # [N, N], diagonal inf
    latency_s: FloatArray  # [N, N], diagonal 0
    memory_bytes: FloatArray  # [N]
    overhead_s: FloatArray  # [N] fixed time per micro-batch of a stage on each device
    message_s: FloatArray  # [N] time per message a stage on each device sends

    @property
    def num_layers(self) -> int:
        return self.profile.num_layers

    @property
    def num_devices(self) -> int:
        return len(self.devices.devices)

    @property
    def work_prefix(self) -> FloatArray:
        """[N, L+1] cumulative forward + backward time on each device."""
        return self.fwd_prefix + self.bwd_prefix

    def index(self, device_id: str) -> int:
        return self.devices.ids.index(device_id)

    # ---- single stage figures (layers a..e inclusive, devices by index)

    def fixed_pass_s(self, d: int, a: int, e: int) -> tuple[float, float]:
        """What a stage of layers a..e on device d pays per micro-batch beyond its layers, in
        its forward and in its backward: half the overhead each, and its messages."""
        half = float(self.overhead_s[d]) / 2
        forward, backward = pass_messages(a, e, self.num_layers)
        per = float(self.message_s[d])
        return half + forward * per, half + backward * per

    def fixed_s(self, d: int, a: int, e: int) -> float:
        """The overhead and the messages of a stage of layers a..e on device d."""
        return float(self.overhead_s[d]) + stage_messages(a, e, self.num_layers) * float(
            self.message_s[d])

    def device_s(self, d: int, a: int, e: int) -> float:
        """t_d: forward + backward time of layers a..e on device d, with its overhead and
        messages."""
        return float(self.fwd_prefix[d, e + 1] - self.fwd_prefix[d, a]
                     + self.bwd_prefix[d, e + 1] - self.bwd_prefix[d, a]) + self.fixed_s(d, a, e)

    def pass_s(self, d: int, a: int, e: int) -> tuple[float, float]:
        """Forward and backward time of layers a..e on device d, with :meth:`fixed_pass_s`."""
        fixed_f, fixed_b = self.fixed_pass_s(d, a, e)
        return (float(self.fwd_prefix[d, e + 1] - self.fwd_prefix[d, a]) + fixed_f,
                float(self.bwd_prefix[d, e + 1] - self.bwd_prefix[d, a]) + fixed_b)

    def compute_s(self, a: int, e: int, group: Sequence[int], *,
                  every_update: bool = True) -> float:
        """C: the replicas of a stage share its micro-batches in proportion to their speed,
        and under asynchronous 1F1B (``every_update``) each pays its fixed cost for every
        micro-batch of the stage (it applies every one's update, :func:`shared_compute_s`);
        under a synchronous schedule (GPipe, 1F1B-sync) each applies one update per batch,
        and pays its fixed cost per micro-batch of its own."""
        return shared_compute_s([self.device_s(d, a, e) for d in group],
                                [self.fixed_s(d, a, e) for d in group] if every_update
                                else None)

    def params_bytes(self, a: int, e: int) -> float:
        return float(self.param_prefix[e + 1] - self.param_prefix[a])

    def sync_s(self, a: int, e: int, group: Sequence[int]) -> float:
        """Y: ring all-reduce of the stage's parameters among its replicas."""
        n = len(group)
        if n <= 1:
            return 0.0
        slowest = min(self.bandwidth_bps[x, y] for x in group for y in group if x != y)
        return 2.0 * (n - 1) / n * self.params_bytes(a, e) / float(slowest)

    def boundary_s(self, e: int, upstream: Sequence[int], downstream: Sequence[int]) -> float:
        """X: activation forward and gradient back across the cut after layer e."""
        size = float(self.output_bytes[e])
        return max(2.0 * (size / float(self.bandwidth_bps[x, y]) + float(self.latency_s[x, y]))
                   for x in upstream for y in downstream)

    def memory_need_bytes(self, a: int, e: int, k: int, num_stages: int) -> float:
        """Bytes a device of stage k needs: (S-k) stashed versions of weights and activations
        plus the current weights and their gradients."""
        params = self.params_bytes(a, e)
        acts = float(self.act_prefix[e + 1] - self.act_prefix[a])
        return (num_stages - k) * (params + acts) + 2.0 * params

    # ---- Duan-Wu resource rates

    def resource_rates(self, a: int, e: int, group: Sequence[int]
                       ) -> tuple[list[tuple[str, str]], list[float], list[float]]:
        """For each resource of the stage's devices, the fraction of the stage's forward and of
        its backward work it completes per second when given wholly to that pass.

        A resource j of device d owns ``speed_j / sum speed`` of the device's forward throughput
        (``backward_speed_j / sum backward_speed`` of the backward). The device's full-power
        times are its measured ``layer_times`` where present, else reference work / summed
        (backward) speed. A pass with no work gets an infinite rate.
        """
        names: list[tuple[str, str]] = []
        rf: list[float] = []
        rb: list[float] = []
        ref_f = float(self.ref_fwd_prefix[e + 1] - self.ref_fwd_prefix[a])
        ref_b = float(self.ref_bwd_prefix[e + 1] - self.ref_bwd_prefix[a])
        for d in group:
            dev = self.devices.devices[d]
            res = dev.compute_resources
            total_f = sum(r.speed for r in res)
            total_b = sum(r.backward_speed for r in res)
            if dev.layer_times is not None:
                dev_f, dev_b = self.pass_s(d, a, e)
            else:
                fixed_f, fixed_b = self.fixed_pass_s(d, a, e)
                dev_f, dev_b = ref_f / total_f + fixed_f, ref_b / total_b + fixed_b
            for r in res:
                names.append((dev.id, r.kind))
                rf.append(math.inf if dev_f <= 0 else (r.speed / total_f) / dev_f)
                rb.append(math.inf if dev_b <= 0 else (r.backward_speed / total_b) / dev_b)
        return names, rf, rb


def build_cost_model(profile: ModelProfile, devices: DeviceSet) -> CostModel:
    """Precompute the cost model for a profile on a device set (raises on incompatible input)."""
    check_compatible(profile, devices)
    layers = profile.layers
    n = len(devices.devices)
    ref_f = np.array([la.forward_s for la in layers], dtype=np.float64)
    ref_b = np.array([la.backward_s for la in layers], dtype=np.float64)
    fwd = np.empty((n, len(layers)))
    bwd = np.empty((n, len(layers)))
    for d, dev in enumerate(devices.devices):
        if dev.layer_times is not None:
            fwd[d] = dev.layer_times.forward_s
            bwd[d] = dev.layer_times.backward_s
        else:
            fwd[d] = ref_f / dev.speed
            bwd[d] = ref_b / dev.speed
    bandwidth = np.full((n, n), np.inf)
    latency = np.zeros((n, n))
    ids = devices.ids
    for x in range(n):
        for y in range(n):
            if x != y:
                bandwidth[x, y] = devices.bandwidth_bps(ids[x], ids[y])
                latency[x, y] = devices.latency_s(ids[x], ids[y])

    def prefix(values: FloatArray) -> FloatArray:
        out = np.zeros((*values.shape[:-1], values.shape[-1] + 1))
        np.cumsum(values, axis=-1, out=out[..., 1:])
        return out

    return CostModel(
        profile=profile,
        devices=devices,
        fwd_prefix=prefix(fwd),
        bwd_prefix=prefix(bwd),
        ref_fwd_prefix=prefix(ref_f),
        ref_bwd_prefix=prefix(ref_b),
        param_prefix=prefix(np.array([la.param_bytes for la in layers], dtype=np.float64)),
        act_prefix=prefix(np.array([la.activation_bytes for la in layers], dtype=np.float64)),
        output_bytes=np.array([la.output_bytes for la in layers], dtype=np.float64),
        bandwidth_bps=bandwidth,
        latency_s=latency,
        memory_bytes=np.array([d.memory_bytes for d in devices.devices], dtype=np.float64),
        overhead_s=np.array([d.overhead_s for d in devices.devices], dtype=np.float64),
        message_s=np.array([d.message_s for d in devices.devices], dtype=np.float64),
    )


def pass_messages(a: int, e: int, num_layers: int) -> tuple[int, int]:
    """The messages a stage of layers a..e sends per micro-batch, in its forward (its
    activation, which carries the labels along to the last stage) and in its backward (the
    gradient of its input). A stage of the whole model sends none. What a receive costs
    (taking an arrived message from the inbox, some microseconds) is in the overhead: the time
    a message takes to arrive is the link's, which the stage spends waiting."""
    first, last = a == 0, e == num_layers - 1
    return int(not last), int(not first)


def stage_messages(a: int, e: int, num_layers: int) -> int:
    forward, backward = pass_messages(a, e, num_layers)
    return forward + backward


def messages_table(num_layers: int) -> npt.NDArray[np.int64]:
    """[L+1, L+1]: :func:`stage_messages` of the stage of layers start..end-1, by its cuts."""
    cut = np.arange(num_layers + 1)
    start, end = cut[:, None], cut[None, :]
    first, last = start == 0, end == num_layers
    table: npt.NDArray[np.int64] = np.where(last, 1, 2) - first.astype(np.int64)
    return table


def beta_compute_s(rf: Sequence[float], rb: Sequence[float], beta: Sequence[float]) -> float:
    """C under a forward/backward split: forward and backward of different micro-batches run at
    once, resource j giving a fraction beta_j of itself to the forward pass."""
    forward_rate = sum(b * r for b, r in zip(beta, rf, strict=True) if b > 0)
    backward_rate = sum((1 - b) * r for b, r in zip(beta, rb, strict=True) if b < 1)
    no_forward = all(math.isinf(r) for r in rf)
    no_backward = all(math.isinf(r) for r in rb)
    f = 0.0 if no_forward else (math.inf if forward_rate <= 0 else 1.0 / forward_rate)
    b = 0.0 if no_backward else (math.inf if backward_rate <= 0 else 1.0 / backward_rate)
    return max(f, b)


@dataclass(frozen=True)
class StageFigures:
    compute_s: float
    sync_s: float

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.sync_s)


def stage_figures(cm: CostModel, stage: Stage, *,
                  beta: Mapping[str, Mapping[str, float]] | None = None,
                  schedule: str = "1f1b") -> StageFigures:
    group = [cm.index(d) for d in stage.devices]
    a, e = stage.layers
    if beta is None:
        compute = cm.compute_s(a, e, group, every_update=not synchronous(schedule))
    else:
        compute = shared_compute_s([device_beta_s(cm, d, a, e, beta) for d in group])
    return StageFigures(compute_s=compute, sync_s=cm.sync_s(a, e, group))


def device_beta_s(cm: CostModel, d: int, a: int, e: int,
                  beta: Mapping[str, Mapping[str, float]]) -> float:
    """t_d of layers a..e on device d: with its beta split (its forward and backward passes at
    once, Duan-Wu) when ``beta`` has one for it, else its passes one after the other."""
    dev_id = cm.devices.ids[d]
    if dev_id not in beta:
        return cm.device_s(d, a, e)
    names, rf, rb = cm.resource_rates(a, e, [d])
    fractions = []
    for _, kind in names:
        if kind not in beta[dev_id]:
            raise PlanningError(f"beta has no fraction for resource {kind!r} of device "
                                f"{dev_id!r}")
        fractions.append(beta[dev_id][kind])
    return beta_compute_s(rf, rb, fractions)


def shared_compute_s(times: Sequence[float], fixed: Sequence[float] | None = None) -> float:
    """C of replicas that take ``times`` each per micro-batch, ``fixed`` of it their fixed
    cost: they share the stage's micro-batches by the speed of their passes, and each pays
    its fixed cost for every micro-batch of the stage, since it applies every update (its
    peers' too: a received gradient decoded and applied, an event, a checkpoint). In a
    period P replica d passes s_d micro-batches of p_d = t_d - f_d and pays f_d, so
    P = (1 + sum f_d / p_d) / sum 1 / p_d; one device: t. (Charged per micro-batch of its own
    only, real data-parallel runs fell short of the simulation by about the fixed cost of the
    micro-batches a replica did not pass: docs/benchmarks.md.)"""
    if any(t <= 0 for t in times):
        return 0.0
    if len(times) == 1:
        return times[0]
    if fixed is None:
        return 1.0 / sum(1.0 / t for t in times)
    passes = [t - f for t, f in zip(times, fixed, strict=True)]
    if any(p <= 0 for p in passes):
        return 1.0 / sum(1.0 / t for t in times)
    return (1.0 + sum(f / p for f, p in zip(fixed, passes, strict=True))) / sum(
        1.0 / p for p in passes)


def evaluate(cm: CostModel, stages: Sequence[Stage], *,
             beta: Mapping[str, Mapping[str, float]] | None = None,
             schedule: str = "1f1b") -> Prediction:
    """Apply the cost model to a sequence of stages: period, bottleneck, throughput, memory."""
    check_stages(stages, num_layers=cm.num_layers, device_ids=cm.devices.ids)
    num_stages = len(stages)
    # (time, label) in pipeline order; the first of equal maxima names the bottleneck.
    parts: list[tuple[float, str]] = []
    stage_s: list[float] = []
    boundary_s: list[float] = []
    need: dict[str, int] = {}
    computes: dict[str, list[tuple[int, float]]] = {}  # device -> (stage, compute seconds)
    for k, stage in enumerate(stages):
        fig = stage_figures(cm, stage, beta=beta, schedule=schedule)
        stage_s.append(fig.time_s)
        parts.append((fig.compute_s, f"stage {k} compute"))
        if fig.sync_s > 0:
            parts.append((fig.sync_s, f"stage {k} sync"))
        a, e = stage.layers
        bytes_needed = cm.memory_need_bytes(a, e, k, num_stages)
        for dev_id in stage.devices:
            # a U-shaped pipeline's device holds both its stages at once
            need[dev_id] = need.get(dev_id, 0) + math.ceil(bytes_needed)
            computes.setdefault(dev_id, []).append((k, fig.compute_s))
        if k + 1 < num_stages:
            x = cm.boundary_s(e, [cm.index(d) for d in stage.devices],
                              [cm.index(d) for d in stages[k + 1].devices])
            boundary_s.append(x)
            parts.append((x, f"boundary {k}->{k + 1}"))
    for dev_id, mine in computes.items():
        if len(mine) > 1:  # and computes one pass at a time: its stages' work adds up
            parts.append((sum(t for _, t in mine), f"device {dev_id} compute (stages "
                          f"{' and '.join(str(k) for k, _ in mine)})"))
    memory_ok = all(bytes_needed <= cm.memory_bytes[cm.index(d)]
                    for d, bytes_needed in need.items())
    period, label = max(parts, key=lambda p: p[0])
    if period <= 0:
        raise PlanningError("the plan's period is zero: its layers have no work and no "
                            "transfers")
    return Prediction(
        period_s=period,
        bottleneck=label,
        throughput_sps=cm.profile.batch_size / period,
        memory_ok=memory_ok,
        stage_s=tuple(stage_s),
        boundary_s=tuple(boundary_s),
        memory_need_bytes=MappingProxyType(need),
    )


def needed_inflight(prediction: Prediction, *,
                    cycle_s: Sequence[float] | None = None) -> tuple[int, ...]:
    """The micro-batches each stage must keep in flight under 1F1B to sustain the period.

    In 1F1B stage k alternates B(i) and F(i + D_k), which closes a dependency cycle through
    stages k..j: B_k(i) -> F_k(i + D_k) -> ... -> F_j -> B_j -> ... -> B_k(i + D_k - D_j + 1).
    The cycle carries D_k - D_j + 1 micro-batches and takes the stages' times plus the transfers
    between them, so the period P holds only if, for every j > k,

        D_k >= D_j - 1 + ceil((T_k + ... + T_j + X_k + ... + X_{j-1}) / P).

    Without transfers on a balanced pipeline this is PipeDream's D_k = S - k; slow links ask
    for more. A cycle that crosses a link also gets ``LINK_SLACK`` of a period to spare: a link
    carries activations and gradients in turn, and with no backlog it idles while a neighbour
    computes; and a real link delivers late under load. Without the slack some random plans
    fell well short of their predicted throughput in simulation, and real agents on a shared
    machine waited for late gradients; the figures that chose the slack are in
    docs/benchmarks.md ("Choices in the cost model").
    """
    times = list(prediction.stage_s if cycle_s is None else cycle_s)
    depths = [1] * len(times)
    for k in range(len(times) - 1, -1, -1):
        depths[k] = _depth_at(k, times[k], depths, times, prediction)
    return tuple(depths)


def _depth_at(k: int, own_s: float, depths: Sequence[int], times: Sequence[float],
              prediction: Prediction) -> int:
    """:func:`needed_inflight`'s D_k for a stage k that takes ``own_s`` a micro-batch, given
    the depths and times of the stages after it."""
    links, period = prediction.boundary_s, prediction.period_s
    need = 1 if k == len(times) - 1 else depths[k + 1] + 1
    cycle, slack = own_s, 0.0
    for j in range(k + 1, len(times)):
        cycle += times[j] + links[j - 1]
        if links[j - 1] > 0:
            slack = LINK_SLACK
        need = max(need, depths[j] - 1 + math.ceil(cycle / period * (1 - 1e-12) + slack))
    return need


def choose_inflight(cm: CostModel, stages: Sequence[Stage], prediction: Prediction, *,
                    beta: Mapping[str, Mapping[str, float]] | None = None) -> tuple[int, ...]:
    """:func:`needed_inflight`, as far as each stage's devices have memory for the deeper stash
    ((D_k)(P + A) + 2P), and never below S - k. A capped stage lowers the depths after it so
    that they still fall by at least one per stage, or the pipeline would serialise.

    A micro-batch crosses one replica of a stage, so the cycles take each stage's slowest
    replica's time (its passes one after the other, at its beta shares where it splits)."""
    num_stages = len(stages)
    wanted = needed_inflight(prediction, cycle_s=_cycle_s(cm, stages, beta))
    depths = []
    for k, stage in enumerate(stages):
        a, e = stage.layers
        params = cm.params_bytes(a, e)
        per_microbatch = params + float(cm.act_prefix[e + 1] - cm.act_prefix[a])
        room = min(float(cm.memory_bytes[cm.index(d)]) for d in stage.devices) - 2.0 * params
        fits = int(room // per_microbatch) if per_microbatch > 0 else wanted[k]
        depths.append(max(num_stages - k, min(wanted[k], fits)))
    for k in range(1, num_stages):
        depths[k] = max(num_stages - k, min(depths[k], depths[k - 1] - 1))
    return tuple(depths)


def replica_inflight(cm: CostModel, stages: Sequence[Stage], prediction: Prediction,
                     inflight: Sequence[int], *,
                     beta: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, int]:
    """For each device of a replicated stage, the span of micro-batches it keeps in flight
    under 1F1B (:mod:`orchestrator.schedule`): :func:`needed_inflight`'s D_k with the stage's
    time taken as this replica's own (the stage's depth covers its slowest replica), at most
    the stage's depth, and at least one more than the next stage's depth (which that stage
    needs forwarded to return a gradient). A faster replica keeps fewer: each of its
    micro-batches then comes out sooner, and the other replicas' forwards wait for its
    update."""
    cycle_s = _cycle_s(cm, stages, beta)
    out: dict[str, int] = {}
    for k, stage in enumerate(stages):
        if len(stage.devices) == 1:
            continue
        for dev in stage.devices:
            own = _micro_batch_s(cm, cm.index(dev), stage.first, stage.last, beta)
            out[dev] = min(inflight[k], _depth_at(k, own, inflight, cycle_s, prediction))
    return out


def choose_lag(cm: CostModel, stages: Sequence[Stage], prediction: Prediction,
               inflight: Sequence[int], *,
               beta: Mapping[str, Mapping[str, float]] | None = None) -> tuple[int, ...] | None:
    """For each stage, how many micro-batches behind its forwards' weights are under 1F1B:
    a forward of m runs on the updates of micro-batches up to m - lag_k. A stage on one device
    forwards on everything it has applied: its lag is its in-flight depth D_k. On a replicated
    stage the update of m - lag_k may come from another replica: that micro-batch's backward
    ends about max(D_k, t / P) periods after its forward (t its replica's time for it), then
    its gradient crosses to the other replicas (Y, with LINK_SLACK), so

        lag_k = max(D_k, ceil(t_max / P)) + ceil(Y / P + LINK_SLACK)

    or the replicas wait for each other. Each replica holds the gradients of up to lag_k
    updates it has not applied yet: capped by its memory. None when no stage is replicated."""
    if all(len(stage.devices) == 1 for stage in stages):
        return None
    period = prediction.period_s
    lags = []
    for k, (stage, cycle) in enumerate(zip(stages, _cycle_s(cm, stages, beta), strict=True)):
        group = [cm.index(d) for d in stage.devices]
        if len(group) == 1:
            lags.append(inflight[k])
            continue
        share = cm.sync_s(stage.first, stage.last, group)
        wanted = (max(inflight[k], math.ceil(cycle / period * (1 - 1e-12)))
                  + math.ceil(share / period * (1 - 1e-12) + LINK_SLACK))
        params = cm.params_bytes(stage.first, stage.last)
        room = (min(float(cm.memory_bytes[d]) for d in group) - (inflight[k] + 2) * params)
        fits = int(room // params) if params > 0 else wanted
        lags.append(max(inflight[k], min(wanted, fits)))
    return tuple(lags)


def _cycle_s(cm: CostModel, stages: Sequence[Stage],
             beta: Mapping[str, Mapping[str, float]] | None) -> list[float]:
    """Each stage's slowest replica's time for a micro-batch, forward then backward."""
    return [max(_micro_batch_s(cm, cm.index(d), stage.first, stage.last, beta)
                for d in stage.devices) for stage in stages]


def _micro_batch_s(cm: CostModel, d: int, a: int, e: int,
                   beta: Mapping[str, Mapping[str, float]] | None) -> float:
    """How long one micro-batch takes through layers a..e on device d, forward then backward
    (with a beta split, each pass at its share)."""
    return sum(split_pass_s(cm, d, a, e, beta))


def split_pass_s(cm: CostModel, d: int, a: int, e: int,
                 beta: Mapping[str, Mapping[str, float]] | None) -> tuple[float, float]:
    """Forward and backward time of layers a..e on device d: at full speed, one after the
    other (:meth:`CostModel.pass_s`), or, for a device with a beta split, each on its share
    of the device's resources while the other pass runs."""
    dev_id = cm.devices.ids[d]
    if beta is None or dev_id not in beta:
        return cm.pass_s(d, a, e)
    names, rf, rb = cm.resource_rates(a, e, [d])
    share = [beta[dev_id][kind] for _, kind in names]
    inf = math.inf
    return (beta_compute_s(rf, [inf] * len(rb), share),
            beta_compute_s([inf] * len(rf), rb, share))


def evaluate_plan(cm: CostModel, plan: Plan) -> Prediction:
    return evaluate(cm, plan.stages, beta=plan.beta, schedule=plan.schedule)


def memory_shortfall(cm: CostModel, stages: Sequence[Stage], prediction: Prediction) -> str:
    """A sentence naming the device whose memory a plan overruns the most."""
    worst = max(stages_devices(stages),
                key=lambda d: prediction.memory_need_bytes[d] - cm.memory_bytes[cm.index(d)])
    have = int(cm.memory_bytes[cm.index(worst)])
    return (f"device {worst!r} needs {prediction.memory_need_bytes[worst]:,} bytes "
            f"but has {have:,}")


def stages_devices(stages: Sequence[Stage]) -> list[str]:
    return [d for s in stages for d in s.devices]
