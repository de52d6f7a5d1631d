"""Deploying a plan: what each device of it runs (its StageSpec), sent to the agents."""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.cost import CostModel, build_cost_model
from orchestrator.errors import FormatError, PlanningError
from orchestrator.formats import Plan as PlanDocument
from orchestrator.formats import parse_plan, synchronous
from orchestrator.protocol import StageSpec
from orchestrator.simulator import schedule_inputs
from webapp.devices.commands import command_build, device_command_send
from webapp.devices.services import data_peers
from webapp.runs.models import (
    Plan,
    Run,
    RunDevice,
)
from webapp.runs.selectors import run_planning_inputs
from webapp.runs.services.control import (
    ACTIVE_DEVICE,
    fail_run,
)

log = logging.getLogger(__name__)


def stage_specs(*, run: Run, plan: Plan) -> dict[str, StageSpec]:
    """What each device of ``plan`` runs, by device uid."""
    profile, devices = run_planning_inputs(run=run)
    cm = build_cost_model(profile, devices)
    document = parse_plan(plan.document, profile=profile, devices=devices,
                          file=f"plan {plan.pk}")
    return spec_fields(run=run, document=document, cm=cm)


def spec_fields(*, run: Run, document: PlanDocument, cm: CostModel) -> dict[str, StageSpec]:
    """The StageSpecs (by device uid) of a plan document of ``run`` under ``cm``: generation
    0's; a recovery replaces its generation and resume point. The schedule's inputs (each
    replica's pace, the depths, the lanes) are the simulator's (``schedule_inputs``), so the
    agents run the action lists the run's prediction was simulated with."""
    spec = run.model_spec
    inputs = schedule_inputs(cm, document)
    shared: dict[str, Any] = {
        "run": run.pk, "model": spec.model, "dataset": spec.dataset,
        "batch_size": spec.batch_size, "schedule": run.schedule,
        "stage_devices": inputs.stage_devices, "stage_times_s": inputs.stage_times_s,
        "microbatches": run.total_microbatches,
        "flush_every": run.microbatches,
        "inflight": None if document.inflight is None else inputs.inflight,
        "lag": None if document.lag is None else inputs.lag,
        "replica_inflight": tuple(sorted(inputs.replica_inflight.items())),
        "two_lanes": inputs.two_lanes,
        "lr": run.lr, "momentum": run.momentum, "seed": run.pk,
        # 1F1B's answers to stale weights; GPipe has none (docs/architecture.md)
        "vertical_sync": run.vertical_sync and not synchronous(run.schedule),
        "aggregate_every": run.aggregate_every,
        # replication points, in micro-batches applied (docs/architecture.md)
        "chain_every": run.chain_every * run.microbatches,
        "global_every": run.global_every * run.microbatches,
    }
    return {uid: StageSpec(**shared, device=uid, stage=k, layers=(stage.first, stage.last),
                           lane_shares=inputs.lane_shares.get(uid))
            for k, stage in enumerate(document.stages) for uid in stage.devices}


def deploy_plan(run: Run, plan: Plan) -> Run:
    """Send every device of ``plan`` its stage; a device that cannot take it fails the run."""
    try:
        specs = stage_specs(run=run, plan=plan)
    except (PlanningError, FormatError) as exc:
        return fail_run(run, f"the {plan.algorithm} plan cannot be deployed: {exc}")
    run_devices = {rd.device.uid: rd for rd in RunDevice.objects.filter(run=run)
                   .select_related("device")}
    absent = [uid for uid in specs if uid not in run_devices]
    if absent:
        return fail_run(run, f"the plan uses device {absent[0]}, which is not in the run")
    for uid in specs:
        d = run_devices[uid].device
        if d.status not in ACTIVE_DEVICE or not d.data_address or not d.data_key:
            why = f"is {d.status}" if d.status not in ACTIVE_DEVICE else "has no agent connected"
            return fail_run(run, f"device {d.name!r} ({d.uid}) {why}: start its agent "
                              "(python -m agent run) and start the run again", device=uid)
    # every device of the run, not only the plan's: a recovering stage may fetch weights
    # from any of them, and each admits only the keys it was given
    peers, keys = data_peers([rd.device for rd in run_devices.values()])
    for uid, rd in run_devices.items():
        spec = specs.get(uid)
        rd.stage = None if spec is None else spec.stage
        rd.stage_state = (RunDevice.StageState.IDLE if spec is None
                          else RunDevice.StageState.DEPLOYING)
        rd.stage_error = ""
        rd.save(update_fields=["stage", "stage_state", "stage_error"])
        if spec is not None:
            device_command_send(uid=uid, command=command_build(
                "deploy", run=run.pk, spec=spec.to_json(), peers=peers, keys=keys))
    return run
