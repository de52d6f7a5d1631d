"""FTPipeHD's capacity estimation (equations 1-3): updated device speeds from measured stage
times, the input of its dynamic re-partition.

A device's computing capacity is the ratio of what its stage *should* take according to the
current device model (reference layer times over its speed, or its own measured layer times)
to what it *does* take while training. Multiplying the device's speed by that ratio (and
dividing its layer times by it) makes the model agree with the measurement; ``smoothing`` < 1
moves only part of the way, an exponential moving average that keeps one noisy batch from
re-planning the pipeline.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from orchestrator.cost import CostModel
from orchestrator.formats import Device, DeviceSet, LayerTimes, Resource
from orchestrator.planformat import Plan


def _scaled(device: Device, factor: float) -> Device:
    """The device running ``factor`` times faster."""
    times = device.layer_times
    return replace(
        device,
        speed=device.speed * factor,
        resources=tuple(Resource(r.kind, r.speed * factor, r.backward_speed * factor)
                        for r in device.resources),
        layer_times=None if times is None else LayerTimes(
            forward_s=tuple(t / factor for t in times.forward_s),
            backward_s=tuple(t / factor for t in times.backward_s)),
    )


STAGE_KINDS = ("forward", "backward", "update")


def stage_seconds(events: Iterable[tuple[str, int, str, float, float]], *, last: int
                  ) -> dict[str, float]:
    """Each device's mean seconds of work per micro-batch (its forward, backward and update
    events summed), over its ``last`` most recent micro-batches with both a forward and a
    backward; devices with fewer than 3 are left out. ``events``: (device, micro-batch, kind,
    start, end) rows, other kinds ignored.

    The mean, not the median: a device's throughput is set by its mean time, and an emulated
    device's paced passes are skewed (agent/emulation.py: a sleep that wakes late is repaid by
    the next passes, which then run unpaced). On bench/faults.py the median read the MLP's
    three first stages 1.16-1.49 times as fast as their profile, the mean 0.88-1.0, and a
    recovery planned with the median left a device out."""
    if last < 1:
        raise ValueError(f"last must be at least 1, got {last!r}")
    work: dict[str, dict[int, float]] = {}
    kinds: dict[str, dict[int, set[str]]] = {}
    for device, microbatch, kind, start, end in events:
        if kind not in STAGE_KINDS:
            continue
        per = work.setdefault(device, {})
        per[microbatch] = per.get(microbatch, 0.0) + (end - start)
        kinds.setdefault(device, {}).setdefault(microbatch, set()).add(kind)
    out = {}
    for device, per in work.items():
        complete = sorted((m for m in per if {"forward", "backward"} <= kinds[device][m]),
                          reverse=True)[:last]
        if len(complete) >= 3:
            out[device] = math.fsum(per[m] for m in complete) / len(complete)
    return out


def capacity_ratios(cm: CostModel, plan: Plan, *, measured_s: Mapping[str, float]
                    ) -> dict[str, float]:
    """For each measured device of the plan: predicted stage time / measured stage time (> 1:
    faster than believed). Devices whose stage has no work are left out."""
    stage_of = {d: s for s in plan.stages for d in s.devices}
    ratios = {}
    for device_id, seconds in measured_s.items():
        if device_id not in stage_of:
            raise ValueError(f"measured device {device_id!r} serves no stage of the plan")
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"measured stage time of {device_id!r} must be a positive number "
                             f"of seconds, got {seconds!r}")
        stage = stage_of[device_id]
        d = cm.index(device_id)
        # the device's fixed overhead and its messages do not scale with its speed: compare
        # the layers' part
        fixed = cm.fixed_s(d, stage.first, stage.last)
        predicted = cm.device_s(d, stage.first, stage.last) - fixed
        if predicted > 0 and seconds > fixed:
            ratios[device_id] = predicted / (seconds - fixed)
    return ratios


def estimate_capacities(cm: CostModel, plan: Plan, *, measured_s: Mapping[str, float],
                        smoothing: float = 1.0) -> DeviceSet:
    """The device set with speeds (and layer times) updated from measured per-micro-batch stage
    times (forward + backward) of the devices running ``plan``."""
    if not 0 < smoothing <= 1:
        raise ValueError(f"smoothing must be in (0, 1], got {smoothing!r}")
    ratios = capacity_ratios(cm, plan, measured_s=measured_s)
    return apply_capacities(cm.devices, {
        d: (1 - smoothing) + smoothing * r for d, r in ratios.items()})


def apply_capacities(devices: DeviceSet, ratios: Mapping[str, float]) -> DeviceSet:
    """The device set with each device in ``ratios`` running that many times faster (its
    speed multiplied, its layer times divided); the others as they are."""
    return DeviceSet(
        devices=tuple(_scaled(d, ratios[d.id]) if d.id in ratios else d
                      for d in devices.devices),
        links=devices.links, file=devices.file)


COST_KEEP = 0.5  # of a device's kept fixed-cost figures when a run measures them again


@dataclass(frozen=True)
class FixedCostFigures:
    """A device's fixed costs for one model, as its stages measure them in runs: a
    micro-batch's cost beyond its layers and its sends, the part of it inside the timed
    passes (at most all of it), and the cost of a send (None: not measured)."""

    overhead_s: float
    pass_overhead_s: float | None = None
    message_s: float | None = None


def fixed_costs_blended(kept: FixedCostFigures | None, measured: FixedCostFigures, *,
                        keep: float = COST_KEEP) -> FixedCostFigures:
    """The figures to keep after a run measured ``measured``: an exponentially weighted mean
    of the runs' figures, ``keep`` of the kept one and the rest of the new one (a figure
    only one side has is taken as it is). The same device's figures moved by up to 30% from one
    run to the next on a shared machine, and the last one winning had the planners choose
    plans for costs that happened to read low; a device that changed for good is followed
    within a few runs. The part inside the passes stays at most the whole."""
    if not 0 <= keep < 1:
        raise ValueError(f"keep must be in [0, 1), got {keep}")
    if kept is None:
        return measured

    def mean(old: float | None, new: float | None) -> float | None:
        if old is None or new is None:
            return new if old is None else old
        return keep * old + (1 - keep) * new

    overhead = mean(kept.overhead_s, measured.overhead_s)
    assert overhead is not None
    inside = mean(kept.pass_overhead_s, measured.pass_overhead_s)
    return FixedCostFigures(overhead_s=overhead,
                            pass_overhead_s=None if inside is None else min(inside, overhead),
                            message_s=mean(kept.message_s, measured.message_s))
