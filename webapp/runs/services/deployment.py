"""Deploying a plan: what each device of it runs (its StageSpec), sent to the agents."""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.cost import CostModel, build_cost_model
from orchestrator.errors import FormatError, PlanningError
from orchestrator.formats import synchronous
from orchestrator.planformat import Plan as PlanDocument
from orchestrator.planformat import parse_plan
from orchestrator.protocol import ProtocolError, StageSpec
from orchestrator.simulator import schedule_inputs
from webapp.devices.commands import command_build, device_command_send
from webapp.devices.services import data_peers
from webapp.runs.models import (
    MULTI_PIPELINE_KINDS,
    Plan,
    Run,
    RunDevice,
)
from webapp.runs.selectors import run_planning_inputs
from webapp.runs.services.control import (
    ACTIVE_DEVICE,
    fail_run,
)
from webapp.runs.services.pipelearn import pipelearn_stage_specs
from webapp.runs.services.split import split_stage_specs

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


def _plan_specs(run: Run, plan: Plan) -> dict[str, list[StageSpec]]:
    """What each device of ``plan`` runs, by device uid: one stage, or (a split or PipeLearn
    run) every stage it holds in any pipeline."""
    if run.kind in MULTI_PIPELINE_KINDS:
        specs_of = split_stage_specs if run.kind == "split" else pipelearn_stage_specs
        held: dict[str, list[StageSpec]] = {}
        for spec in specs_of(run=run, document=plan.document):
            held.setdefault(spec.device, []).append(spec)
        return held
    return {uid: [spec] for uid, spec in stage_specs(run=run, plan=plan).items()}


def deploy_plan(run: Run, plan: Plan) -> Run:
    """Send every device of ``plan`` its stages; a device that cannot take them fails the
    run. A device of a split or PipeLearn run is told each of its stages in a deploy of its
    own, and its ``parts`` follow each one's answer."""
    try:
        specs = _plan_specs(run, plan)
    except (PlanningError, FormatError, ProtocolError) as exc:
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
            return fail_run(run, f"device {d.named} {why}: start its agent "
                              "(python -m agent run) and start the run again", device=uid)
    # every device of the run, not only the plan's: a recovering stage may fetch weights
    # from any of them, and each admits only the keys it was given
    peers, keys = data_peers([rd.device for rd in run_devices.values()])
    for uid, rd in run_devices.items():
        held = specs.get(uid, [])
        rd.stage = held[0].stage if held else None
        rd.stage_state = (RunDevice.StageState.DEPLOYING if held
                          else RunDevice.StageState.IDLE)
        rd.stage_error = ""
        rd.parts = [{"pipeline": s.pipeline, "stage": s.stage,
                     "state": RunDevice.StageState.DEPLOYING} for s in held
                    ] if run.kind in MULTI_PIPELINE_KINDS else []
        rd.save(update_fields=["stage", "stage_state", "stage_error", "parts"])
        for spec in held:
            device_command_send(uid=uid, command=command_build(
                "deploy", run=run.pk, spec=spec.to_json(), peers=peers, keys=keys))
    return run
