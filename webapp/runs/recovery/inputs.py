"""What a re-plan (a recovery's or a dynamic re-partition's) plans with: the run's devices with
their speeds re-estimated from the stage times they measured (FTPipeHD's capacity estimation),
and the planner it runs."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from orchestrator.capacity import apply_capacities, capacity_ratios, stage_seconds
from orchestrator.cost import CostModel, build_cost_model
from orchestrator.errors import FormatError, PlanningError
from orchestrator.formats import DeviceSet, ModelProfile
from orchestrator.partition import LEARNED
from orchestrator.planformat import parse_plan
from webapp.runs.models import (
    Run,
    RunDevice,
    TimelineEvent,
)
from webapp.runs.selectors import run_planning_inputs
from webapp.runs.states import Deployment

log = logging.getLogger(__name__)

# a recovery from a failure plans with the exact planner, whatever planned the run: it wants
# the best plan for the devices left, and takes milliseconds for a testbed's handful of
# devices (FTPipeHD re-runs its own DP, which keeps the devices' order: docs/benchmarks.md)
RECOVERY_PLANNER = "optimal"
MEASURED_MICROBATCHES = 50  # capacities are estimated from this many recent micro-batches


def _subset(devices: DeviceSet, keep: Sequence[str]) -> DeviceSet:
    chosen = set(keep)
    return DeviceSet(devices=tuple(d for d in devices.devices if d.id in chosen),
                     links=tuple(li for li in devices.links if li.a in chosen and li.b in chosen),
                     file=devices.file)

def measured_stage_s(*, run: Run, since_s: float) -> dict[str, float]:
    """Each device's mean time per micro-batch (forward + backward + update) over its recent
    micro-batches since ``since_s`` (run clock): what capacity estimation compares with the
    cost model's prediction (orchestrator.capacity.stage_seconds)."""
    rows = (TimelineEvent.objects.filter(run=run, start__gte=since_s,
                                         kind__in=("forward", "backward", "update"))
            .order_by("-start").values_list("device", "microbatch", "kind", "start", "end"))
    return stage_seconds(rows[:MEASURED_MICROBATCHES * 3 * 8], last=MEASURED_MICROBATCHES)

def _capacities(run: Run, profile: ModelProfile, devices: DeviceSet) -> dict[str, float]:
    """Each device's capacity over its profile (FTPipeHD's estimate, > 1: faster than
    profiled): measured in the current generation, else as last measured in an earlier one
    (kept in the run's Deployment as ``capacity``). Without that memory a device a re-partition had
    left out went back to its profile, and a device slowed 200x was planned back in: four
    moves in one run, alternating between two plans."""
    deployment = Deployment.from_json(run.deployment)
    ratios = dict(deployment.capacity)
    if run.chosen_plan is None or deployment.plan is None:
        return ratios
    try:
        cm = build_cost_model(profile, devices)
        current = parse_plan(dict(deployment.plan), profile=profile, devices=devices,
                             file="the current plan")
        compute = measured_stage_s(run=run, since_s=deployment.since_s)
        # the events time the layers' work and the part of the device's fixed overhead spent
        # inside the passes (the loss, a pass's own cost); the stage time the cost model
        # predicts has the whole fixed overhead and the messages (CostModel.fixed_s)
        in_passes = dict(RunDevice.objects.filter(run=run, pass_overhead_s__isnull=False)
                         .values_list("device__uid", "pass_overhead_s"))
        layers = {d: (s.first, s.last) for s in current.stages for d in s.devices}
        measured = {d: t - in_passes.get(d, 0.0) + cm.fixed_s(cm.index(d), *layers[d])
                    for d, t in compute.items() if d in layers}
        ratios.update(capacity_ratios(cm, current, measured_s=measured))
    except (PlanningError, FormatError, ValueError) as exc:
        log.warning("run %s: capacities not re-estimated: %s", run.pk, exc)
    return ratios

def kept_capacities(run: Run) -> dict[str, float]:
    """The capacities to carry into the next generation, as its recovery begins."""
    try:
        return _capacities(run, *run_planning_inputs(run=run))
    except (PlanningError, FormatError, ValueError) as exc:
        log.warning("run %s: capacities not kept: %s", run.pk, exc)
        return dict(Deployment.from_json(run.deployment).capacity)

def planning_devices(run: Run, profile: ModelProfile, devices: DeviceSet) -> DeviceSet:
    """The run's devices with speeds re-estimated from their measured stage times (FTPipeHD's
    capacity estimation); as profiled when nothing was measured."""
    ratios = {d: r for d, r in _capacities(run, profile, devices).items()
              if d in devices.ids}
    return apply_capacities(devices, ratios) if ratios else devices

def next_generation_inputs(run: Run, candidates: Sequence[RunDevice]
                            ) -> tuple[ModelProfile, DeviceSet, CostModel]:
    """What a re-plan (a recovery's or a dynamic re-partition's) plans with: the model
    profile, every device of the run, and the cost model of ``candidates`` (the devices a new
    generation may use) with their capacities re-estimated from what they measured."""
    profile, all_devices = run_planning_inputs(run=run)
    estimated = planning_devices(run, profile, all_devices)
    devices = _subset(estimated, [rd.device.uid for rd in candidates])
    return profile, all_devices, build_cost_model(profile, devices)

def measured_period_s(*, run: Run, since_s: float, last: Sequence[str]) -> float | None:
    """Seconds per micro-batch through the last stage (its ``last`` devices: replicas share
    its micro-batches) over its recent backwards."""
    starts = list(TimelineEvent.objects.filter(run=run, device__in=list(last), kind="backward",
                                               start__gte=since_s)
                  .order_by("-start").values_list("start", flat=True)[:MEASURED_MICROBATCHES])
    if len(starts) < 10:
        return None
    return (starts[0] - starts[-1]) / (len(starts) - 1)

def dynamic_planner(run: Run) -> str:
    """FTPipeHD's dynamic re-partition re-runs the run's own planner with the new capacities
    (a learned one: ftpipehd's DP, a minute of training has no place here): the user chose its
    kind of plan (ftpipehd keeps every device, in order), which a recovery from a failure
    cannot keep anyway."""
    algorithm = run.chosen_plan.algorithm if run.chosen_plan else RECOVERY_PLANNER
    return "ftpipehd" if algorithm in LEARNED else algorithm
