"""A device lost, the survivors halted, the next generation planned and deployed: a recovery up
to its commit (webapp.runs.recovery.commit). A dynamic re-partition is a recovery that lost
nobody (webapp.runs.recovery.repartition)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from django.db import transaction

from orchestrator.cost import CostModel
from orchestrator.errors import FormatError, PlanningError
from orchestrator.formats import ModelProfile, synchronous
from orchestrator.partition import run_planner
from orchestrator.planformat import Plan as PlanDocument
from orchestrator.planformat import parse_plan
from orchestrator.recovery import (
    CENTRAL,
    Holding,
    RestorePlan,
    group_shrinks,
    repartition_decision,
    restore_plan,
    successor_takes_over,
    unprotected_stages,
)
from webapp.devices.commands import command_build, device_command_send
from webapp.devices.models import Device, devices_named
from webapp.devices.services import data_peers
from webapp.runs import replicas
from webapp.runs.models import (
    MULTI_PIPELINE_KINDS,
    Generation,
    Run,
    RunDevice,
)
from webapp.runs.recovery.exclusion import go_on_without
from webapp.runs.recovery.inputs import (
    RECOVERY_PLANNER,
    dynamic_planner,
    kept_capacities,
    next_generation_inputs,
)
from webapp.runs.recovery.split import split_replan
from webapp.runs.services.control import (
    ACTIVE_DEVICE,
    control_event,
    fail_run,
    lock_run,
    move_run,
    run_clock,
    runs_fail_silent,
)
from webapp.runs.services.deployment import spec_fields
from webapp.runs.states import Deployment, Recovery, RunState

log = logging.getLogger(__name__)

S = RunDevice.StageState
# the states in which a lost device matters to a run: it recovers without it
LOSABLE = (RunState.STARTING, RunState.RUNNING, RunState.RECOVERING, RunState.PAUSED)


def _holdings(run: Run, staged: Sequence[RunDevice]) -> list[Holding]:
    out = [Holding.from_json(raw, device=rd.device.uid) for rd in staged
           for raw in (rd.holdings or [])]
    out += [Holding.from_json({**raw, "kind": "central"}, device=CENTRAL)
            for raw in replicas.replica_holdings(run=run)]
    return out

def run_device_lost(*, device: Device, reason: str, detected_by: str) -> list[Run]:
    """The device is gone (its connection closed, its heartbeats stopped, a probe went
    unanswered): every active run it holds a stage of (or weights of) recovers without it; a
    paused one ends its recovery paused, a starting one starts on the survivors."""
    touched = []
    for run_id in (RunDevice.objects.filter(device=device, run__state__in=LOSABLE)
                   .exclude(stage_state=S.LOST).values_list("run_id", flat=True)):
        with transaction.atomic():
            run = lock_run(Run(pk=run_id))
            if run.state not in LOSABLE:
                continue
            rd = RunDevice.objects.select_for_update().get(run=run, device=device)
            if _holds(rd):
                touched.append(lose(run, [rd], reason=reason, detected_by=detected_by))
    return touched

def _holds(rd: RunDevice) -> bool:
    """Does the device run a stage of the run, or hold weights a recovery may need?"""
    return rd.stage_state != S.LOST and (
        rd.stage is not None or rd.stage_state in (S.HALTING, S.HALTED) or bool(rd.holdings))

def lose(run: Run, lost: Sequence[RunDevice], *, reason: str, detected_by: str,
          cause: str = "failure", decision: dict[str, Any] | None = None) -> Run:
    """With the run locked: mark ``lost`` and (re)start its recovery; every other staged
    device halts and reports what it holds. A dynamic re-partition is a recovery that lost
    nobody. A split-learning client or a PipeLearn device lost while the run trains: the run
    goes on without its pipelines (recovery.exclusion). Else a PipeLearn run fails, naming
    what it lost."""
    if run.kind in MULTI_PIPELINE_KINDS and cause == "failure":
        goes_on = go_on_without(run, lost, reason=reason, detected_by=detected_by)
        if goes_on is not None:
            return goes_on
    if run.kind == "pipelearn":
        return _pipelearn_lost(run, lost, reason=reason, detected_by=detected_by)
    ongoing = Recovery.from_json(run.recovery) if run.state == RunState.RECOVERING else None
    if ongoing is None:
        deployment = replace(Deployment.from_json(run.deployment),
                             capacity=kept_capacities(run))
        if run.state == RunState.STARTING and run.chosen_plan is not None:
            # what respipe's baseline takes over
            deployment = replace(deployment, plan=run.chosen_plan.document)
        run.deployment = deployment.to_json()
        recovery = Recovery(generation=run.generation + 1, cause=cause,
                            detected_at=run_clock(run), detected_wall=time.time(),
                            decision=decision or {},
                            # a paused run's next generation starts paused (recovery_ready)
                            paused=run.state == RunState.PAUSED,
                            # nothing trained yet: the next generation starts from the seed
                            from_start=run.state == RunState.STARTING)
    else:  # a further loss re-plans: the next generation is another one
        recovery = replace(ongoing, generation=ongoing.generation + 1, cause="failure")
    for rd in lost:
        rd.stage_state = S.LOST
        rd.save(update_fields=["stage_state"])
        recovery = replace(recovery, lost=tuple(sorted(set(recovery.lost) | {rd.device.uid})))
        control_event(run, "device_lost", device=rd.device.uid,
                      detail={"reason": reason, "detected_by": detected_by})
    control_event(run, "recovery_started",
                  detail={"generation": recovery.generation, "lost": list(recovery.lost)})
    survivors = [rd for rd in RunDevice.objects.filter(run=run).select_related("device")
                 if _holds(rd) and rd.device.uid not in recovery.lost]
    if ongoing is None:
        run = move_run(run, RunState.RECOVERING, action="recover",
                       recovery=recovery.to_json())
    else:
        run.recovery = recovery.to_json()
        run.save(update_fields=["recovery"])
    if not survivors and not candidates(run):
        return fail_run(run, "every device of the run was lost: " + ", ".join(recovery.lost))
    for rd in survivors:
        rd.stage_state = S.HALTING
        rd.save(update_fields=["stage_state"])
        device_command_send(uid=rd.device.uid, command=command_build(
            "halt", run=run.pk, generation=recovery.generation))
    if not survivors:
        return _replan(run)
    return run

def _pipelearn_lost(run: Run, lost: Sequence[RunDevice], *, reason: str,
                    detected_by: str) -> Run:
    for rd in lost:
        rd.stage_state = S.LOST
        rd.save(update_fields=["stage_state"])
        control_event(run, "device_lost", device=rd.device.uid,
                      detail={"reason": reason, "detected_by": detected_by})
    server = (run.pipelearn or {}).get("server")
    names = devices_named(rd.device for rd in lost)
    what = "its server" if any(rd.device.uid == server for rd in lost) else "a device"
    return fail_run(run, f"the PipeLearn run lost {what}, {names} ({reason}); it does not "
                         "re-plan around a lost device yet: start it again on the devices left")


def run_device_back(*, device: Device) -> None:
    """A device lost from an active run has connected again: say so on the run's timeline; it
    holds nothing now, and the next re-partition (dynamic, or another recovery) may use it."""
    for rd in (RunDevice.objects.filter(device=device, stage_state=S.LOST,
                                        run__state__in=(RunState.RUNNING, RunState.RECOVERING))
               .select_related("run")):
        with transaction.atomic():
            run = lock_run(rd.run)
            ongoing = Recovery.from_json(run.recovery)
            if ongoing is not None and device.uid in ongoing.lost:
                # lost in the recovery under way: it joins at its commit (recovery_ready)
                run.recovery = replace(ongoing, back=(*ongoing.back, device.uid)).to_json()
                run.save(update_fields=["recovery"])
                continue
            RunDevice.objects.filter(pk=rd.pk).update(stage_state=S.IDLE, stage=None)
            control_event(run, "device_joined", device=device.uid)

def candidates(run: Run) -> list[RunDevice]:
    """The run's devices a new generation may use: connected, not lost in this recovery, and
    not lost earlier unless it came back since (run_device_back: it rejoins here). A device
    lost to a probe (frozen, its connection still open) is still "online" until its
    heartbeats are missed: the next dynamic re-partition planned on it, and waited for its
    halt until the connection dropped."""
    ongoing = Recovery.from_json(run.recovery)
    lost = set(() if ongoing is None else ongoing.lost)
    return [rd for rd in RunDevice.objects.filter(run=run).select_related("device")
            .order_by("position")
            if rd.device.uid not in lost and rd.stage_state != S.LOST
            and rd.device.status in ACTIVE_DEVICE and rd.device.data_address]

@transaction.atomic
def run_stage_halted(*, run: Run, device: Device, generation: Any, holdings: Any) -> Run:
    """A survivor stopped its stage and said what it holds; once all have, re-plan."""
    locked = lock_run(run)
    recovery = Recovery.from_json(locked.recovery)
    if (locked.state != RunState.RECOVERING or recovery is None
            or generation != recovery.generation):
        return locked  # a late answer to an earlier recovery
    rd = RunDevice.objects.select_for_update().get(run=locked, device=device)
    if not isinstance(holdings, list):
        holdings = []
    rd.holdings = holdings
    rd.stage_state = S.HALTED
    rd.save(update_fields=["holdings", "stage_state"])
    if RunDevice.objects.filter(run=locked, stage_state=S.HALTING).exists():
        return locked
    return _replan(locked)


def recoveries_fail_stalled(*, older_than_s: float) -> list[int]:
    """Fail the runs whose recovery still waits for a survivor's halt ``older_than_s`` after
    the loss was detected, naming the devices that never answered (a frozen agent, a command
    that never reached it): such a run stayed recovering for ever. Returns their ids."""
    now = time.time()
    cutoff = now - older_than_s

    def halting(run: Run) -> list[Device] | None:
        recovery = Recovery.from_json(run.recovery)
        if (run.state != RunState.RECOVERING or recovery is None
                or (recovery.detected_wall or now) > cutoff):
            return None
        return [rd.device for rd in RunDevice.objects.filter(
            run=run, stage_state=S.HALTING).select_related("device").order_by("position")
        ] or None

    return runs_fail_silent(
        Run.objects.filter(state=RunState.RECOVERING).values_list("pk", flat=True), halting,
        lambda names: f"{names} did not answer the recovery's halt within "
                      f"{older_than_s:.0f} s of the loss: is its agent running?")


def _replan(run: Run) -> Run:
    """With the run locked and every survivor halted: plan the next generation, choose the
    resume point and the weights' sources, and deploy it."""
    recovery = Recovery.from_json(run.recovery)
    assert recovery is not None  # the run is recovering
    generation = recovery.generation
    current = Deployment.from_json(run.deployment).plan
    usable = candidates(run)
    if not usable:
        return fail_run(run, "no device is left to recover on (lost: "
                             f"{', '.join(recovery.lost)})")
    if run.kind == "split":
        return split_replan(run, recovery, usable)

    try:
        profile, all_devices, cm = next_generation_inputs(run, usable)
        # a dynamic re-partition deploys the plan its break-even was judged on (it deployed
        # the optimal planner's, another plan, which the decision had not priced)
        dynamic = recovery.cause == "dynamic"
        algorithm = dynamic_planner(run) if dynamic else RECOVERY_PLANNER
        old = (parse_plan(dict(current), profile=profile, devices=all_devices,
                          file="the current plan") if current else None)
        lost = set(recovery.lost)
        if run.recovery_policy == "respipe" and not dynamic:  # the baseline: no re-plan
            if old is None:
                raise PlanningError("the run has no current plan for its successors to take "
                                    "over")
            plan = successor_takes_over(cm, old, recovery.lost, schedule=run.schedule,
                                        microbatches=run.microbatches)
            algorithm = plan.algorithm
        else:
            plan = run_planner(cm, algorithm, schedule=run.schedule,
                               microbatches=run.microbatches)
        if recovery.from_start:
            # nothing trained: every stage is built from the run's seed, as at the start
            holdings: list[Holding] = []
            restore = RestorePlan(resume=0, parts=())
        else:
            holders = [rd for rd in RunDevice.objects.filter(run=run).select_related("device")
                       if rd.holdings and rd.device.uid not in lost]
            holdings = _holdings(run, holders)
            restore = restore_plan(plan, holdings, profile, momentum=run.momentum > 0, seed=True)
            if (not dynamic and run.recovery_policy == "replan" and old is not None
                    and group_shrinks(old, lost)):
                plan, restore, algorithm, decision = _shrink_or_replan(
                    run, cm, old, lost, holdings, profile, (plan, restore, algorithm))
                recovery = replace(recovery, decision=decision)
    except (PlanningError, FormatError, ValueError, KeyError) as exc:
        return fail_run(run, f"recovery {generation} failed: {exc}")
    if synchronous(run.schedule) and restore.resume % run.microbatches:
        return fail_run(run, f"recovery {generation} failed: resume point {restore.resume} is "
                          "not at a batch boundary")
    if restore.from_seed:
        log.warning("run %s recovery %s: %s; training starts again from the run's seed",
                    run.pk, generation, restore.from_seed)
    if restore.resume >= run.total_microbatches:
        return fail_run(run, f"recovery {generation}: every micro-batch was already trained")
    predicted = plan.predicted
    document = plan.to_json()
    cause = recovery.cause
    Generation.objects.update_or_create(run=run, number=generation, defaults={
        "cause": cause, "lost": list(recovery.lost), "planner": algorithm,
        "plan": document, "resume_microbatch": restore.resume,
        "predicted_throughput_sps": None if predicted is None else predicted.throughput_sps,
        "detected_at": recovery.detected_at, "transfers": restore.to_json()["parts"],
        "bytes_moved": restore.bytes_moved})
    control_event(run, "repartitioned", detail={
        "generation": generation, "cause": cause, "planner": algorithm,
        "stages": [{"devices": list(s.devices), "layers": [s.first, s.last]}
                   for s in plan.stages],
        "predicted_throughput_sps": None if predicted is None else predicted.throughput_sps,
        "resume_microbatch": restore.resume, **recovery.decision,
        **({"from_seed": restore.from_seed} if restore.from_seed else {}),
        **_protection(run, plan)})
    specs = spec_fields(run=run, document=plan, cm=cm)
    peers, keys = data_peers([rd.device for rd in usable])
    staged = set(specs)
    for rd in RunDevice.objects.filter(run=run).select_related("device"):
        spec = specs.get(rd.device.uid)
        if spec is not None:
            rd.stage, rd.stage_state, rd.stage_error = spec.stage, S.DEPLOYING, ""
        elif rd.stage_state != S.LOST:
            rd.stage, rd.stage_state = None, S.IDLE
        else:
            rd.stage = None
        rd.save(update_fields=["stage", "stage_state", "stage_error"])
    started_at = run.started_at.timestamp() if run.started_at else time.time()
    for uid, spec in specs.items():
        spec = replace(spec, generation=generation, first_microbatch=restore.resume)
        device_command_send(uid=uid, command=command_build(
            "deploy", run=run.pk, spec=spec.to_json(), peers=peers, keys=keys,
            started_at=started_at,
            restore=[p.to_json() for p in restore.parts_of(uid)]))
    recovery = replace(
        recovery, replanned_wall=time.time(), resume=restore.resume,
        release=tuple(sorted(rd.device.uid for rd in usable if rd.device.uid not in staged)),
        next_plan=document, bytes_moved=restore.bytes_moved, transfers=restore.transfers,
        # the furthest any stage had got: the work past the resume point is done again
        redone=max([h.applied - restore.resume for h in holdings if h.kind == "own"] + [0]))
    run.recovery = recovery.to_json()
    run.save(update_fields=["recovery"])
    return run

def _protection(run: Run, plan: PlanDocument) -> dict[str, Any]:
    """The next generation's layers no replica would cover (said before it is needed)."""
    bare = unprotected_stages(plan.stages, chain_every=run.chain_every,
                              global_every=run.global_every)
    return {"unprotected": bare} if bare else {}

def _shrink_or_replan(run: Run, cm: CostModel, old: PlanDocument, lost: set[str],
                      holdings: Sequence[Holding], profile: ModelProfile,
                      replanned: tuple[PlanDocument, RestorePlan, str]
                      ) -> tuple[PlanDocument, RestorePlan, str, dict[str, Any]]:
    """A lost replica: keep the plan with its group shrunk (nothing moves) or deploy the
    re-plan, whichever the break-even of a dynamic re-partition prefers: the re-plan when the
    time it saves over the remaining micro-batches exceeds moving its weights. Returns the
    choice and its two sides (the ``repartitioned`` event's detail)."""
    shrunk = successor_takes_over(cm, old, lost, schedule=run.schedule,
                                  microbatches=run.microbatches)
    shrunk = replace(shrunk, algorithm=f"{old.algorithm}, shrunk")
    kept = restore_plan(shrunk, holdings, profile, momentum=run.momentum > 0,
                        seed=True)
    plan, restore, _ = replanned
    if shrunk.predicted is None or plan.predicted is None:
        return (*replanned, {})
    decision = repartition_decision(
        measured_period_s=shrunk.predicted.period_s, new_period_s=plan.predicted.period_s,
        remaining_microbatches=max(0, run.total_microbatches - kept.resume),
        bytes_to_move=max(0, restore.bytes_moved - kept.bytes_moved),
        bandwidth_bps=min(d.bandwidth_bps for d in cm.devices.devices), restart_s=0.0,
        redo_microbatches=0)
    detail = {"shrunk_period_s": shrunk.predicted.period_s,
              "replanned_period_s": plan.predicted.period_s, **decision.to_json(),
              "chosen": "replanned" if decision.move else "shrunk"}
    if decision.move:
        return (*replanned, detail)
    return shrunk, kept, shrunk.algorithm, detail
