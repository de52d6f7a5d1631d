"""A split run's recovery from a lost client or helper (docs/architecture.md, "Split
learning trained"): once the survivors halted, the study is solved again on the clients and
helpers left, with the run's method (a lost helper's clients are assigned to the others), and
every stage of the next generation resumes at the last round whose aggregated model the
server holds (pipeline 0's parts, uploaded after each round's FedAvg), restored from there.
A lost client's data leaves with it; every other client keeps its own shard. The rest of a
recovery (halting, the commit, the events) is every run's (webapp.runs.recovery)."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from django.db.models import Max

from orchestrator.errors import FormatError, PlanningError
from orchestrator.protocol import ProtocolError
from orchestrator.recovery import CENTRAL
from webapp.devices.commands import command_build, device_command_send
from webapp.devices.services import data_peers
from webapp.runs.models import Generation, Run, RunDevice, WeightReplica
from webapp.runs.models import TimelineEvent as TimelineRow
from webapp.runs.services.control import control_event, fail_run
from webapp.runs.services.split import split_plan_document, split_settings, split_stage_specs
from webapp.runs.states import Recovery

log = logging.getLogger(__name__)

S = RunDevice.StageState
RECOVERY_TIME_LIMIT_S = 2.0  # the method's time limit when re-planning (the run is locked)


def _parts(document: object) -> list[tuple[int, int]]:
    try:
        stages = document["run_plan"]["pipelines"][0]["stages"]  # type: ignore[index]
        return [(int(s["layers"][0]), int(s["layers"][1])) for s in stages]
    except (KeyError, IndexError, TypeError, ValueError):
        return []


def split_resume_point(run: Run, document: object) -> int:
    """The newest round's end (micro-batches) whose aggregated model the server holds in
    full: every part of ``document``'s pipeline 0 at it; 0 (the run's seed) when none."""
    parts = set(_parts(document))
    per_round = run.batches * run.microbatches
    held: dict[int, set[tuple[int, int]]] = {}
    for first, last, applied in WeightReplica.objects.filter(run=run).values_list(
            "first", "last", "applied"):
        held.setdefault(applied, set()).add((first, last))
    ends = [a for a, got in held.items() if a and a % per_round == 0 and parts <= got]
    return max(ends, default=0)


def split_replan(run: Run, recovery: Recovery, usable: list[RunDevice]) -> Run:
    """With the run locked and every survivor halted: solve the study on the survivors and
    deploy the next generation from the last round the server holds."""
    generation = recovery.generation
    settings = split_settings(run)
    here = {rd.device.uid for rd in usable}
    clients = [c for c in settings.clients if c in here]
    helpers = [h for h in settings.helpers if h in here]
    if not clients or not helpers:
        left = "client" if not clients else "helper"
        return fail_run(run, f"recovery {generation} failed: no {left} is left (lost: "
                             f"{', '.join(recovery.lost)})")
    plan = run.chosen_plan
    method = plan.algorithm if plan is not None else "balanced-greedy"
    current = recovery.next_plan or (plan.document if plan is not None else None)
    resume = 0 if recovery.from_start else split_resume_point(run, current)
    try:
        document = split_plan_document(run=run, method=method, clients=clients,
                                       helpers=helpers, time_limit_s=min(
                                           settings.time_limit_s, RECOVERY_TIME_LIMIT_S))
        specs = split_stage_specs(run=run, document=document)
    except (PlanningError, FormatError, ProtocolError) as exc:
        return fail_run(run, f"recovery {generation} failed: {exc}")
    if resume >= run.total_microbatches:
        return fail_run(run, f"recovery {generation}: every batch was already trained")
    (a1, _), (a2, e2), (_, e3) = _parts(document)
    stages = [{"devices": clients, "layers": [a1, e3], "role": "clients"},
              {"devices": helpers, "layers": [a2, e2], "role": "helpers"}]
    Generation.objects.update_or_create(run=run, number=generation, defaults={
        "cause": recovery.cause, "lost": list(recovery.lost), "planner": method,
        "plan": document, "resume_microbatch": resume, "predicted_throughput_sps":
            len(clients) * run.model_spec.batch_size / document["makespan_s"],
        "detected_at": recovery.detected_at, "transfers": [], "bytes_moved": 0})
    control_event(run, "repartitioned", detail={
        "generation": generation, "cause": recovery.cause, "planner": method,
        "stages": stages, "resume_microbatch": resume, "makespan_s": document["makespan_s"],
        "assignment": {c: document["helpers"][i] for c, i in zip(
            clients, document["schedule"]["assignment"], strict=True)}})
    held: dict[str, list] = {}
    for spec in specs:
        held.setdefault(spec.device, []).append(spec)
    for rd in RunDevice.objects.filter(run=run).select_related("device"):
        mine = held.get(rd.device.uid, [])
        if mine:
            rd.stage, rd.stage_state, rd.stage_error = mine[0].stage, S.DEPLOYING, ""
        else:
            rd.stage = None
            if rd.stage_state != S.LOST:
                rd.stage_state = S.IDLE
        rd.parts = [{"pipeline": s.pipeline, "stage": s.stage, "state": S.DEPLOYING}
                    for s in mine]
        rd.save(update_fields=["stage", "stage_state", "stage_error", "parts"])
    peers, keys = data_peers([rd.device for rd in usable])
    started_at = run.started_at.timestamp() if run.started_at else time.time()
    for uid, mine in held.items():
        for spec in mine:
            restore = [{"layers": list(spec.layers), "applied": resume, "source": CENTRAL}
                       ] if resume else []
            device_command_send(uid=uid, command=command_build(
                "deploy", run=run.pk, spec=replace(
                    spec, generation=generation, first_microbatch=resume).to_json(),
                peers=peers, keys=keys, started_at=started_at, restore=restore))
    log.info("run %s recovery %s: %s clients and %s helpers left, resuming at %s", run.pk,
             generation, len(clients), len(helpers), resume)
    trained = (TimelineRow.objects.filter(run=run, stage=0, kind="backward")
               .aggregate(m=Max("microbatch"))["m"])
    run.recovery = replace(
        recovery, replanned_wall=time.time(), resume=resume,
        release=tuple(sorted(here - set(held))), next_plan=document,
        # the batches past the resume point some client had finished: trained again
        redone=max(0, (-1 if trained is None else trained) + 1 - resume)).to_json()
    run.save(update_fields=["recovery"])
    return run
