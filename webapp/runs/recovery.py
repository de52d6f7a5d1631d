"""Fault tolerance on the server: a lost device's run recovers instead of failing
(docs/architecture.md, "Fault tolerance and dynamic re-partition").

Thin over the planning core: `orchestrator.capacity` re-estimates the devices from what they
measured, the run's planner plans the devices still there, `orchestrator.recovery` chooses the
resume point and where each device's weights come from. This module keeps the state machine:

    running --device lost--> recovering: survivors halt and report their holdings
    all halted --> re-plan, resume point, deploy the next generation with its restore lists
    all ready (the commit barrier) --> start at the resume point: running again

A run still starting (its stages deploying) recovers the same way, but nothing has been trained
yet: the survivors' new stages are built from the run's seed, as the first deployment did, and
the run starts at micro-batch 0 when they are ready. A paused run recovers the same way and
ends paused: its next generation is started paused, and resuming the run resumes it. A pause
asked for during a recovery is kept until the recovery ends, then takes effect the same way
(the recovery's halts and deployments are not paused stages, and a run moved to paused
mid-recovery waited for them for ever).

Re-planning runs here, in the web process that received the agent's message, not on a Celery
worker: it takes milliseconds for the non-learned planners, and a worker's queue would add its
polling to a recovery that must take seconds (the embedded broker polls once a second).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import transaction

from orchestrator.capacity import apply_capacities, capacity_ratios, stage_seconds
from orchestrator.cost import CostModel, build_cost_model
from orchestrator.errors import FormatError, PlanningError
from orchestrator.formats import DeviceSet, ModelProfile, parse_plan, synchronous
from orchestrator.formats import Plan as PlanDocument
from orchestrator.partition import LEARNED, run_planner
from orchestrator.recovery import (
    CENTRAL,
    Decision,
    Holding,
    RestorePlan,
    group_shrinks,
    repartition_decision,
    restore_plan,
    successor_takes_over,
    unprotected_stages,
)
from orchestrator.redistribution import redistribute_weights
from webapp.devices.commands import command_build, device_command_send
from webapp.devices.models import Device
from webapp.devices.services import data_peers
from webapp.runs import replicas
from webapp.runs.models import (
    Generation,
    Probe,
    Run,
    RunDevice,
    TimelineEvent,
    WeightReplica,
)
from webapp.runs.selectors import run_planning_inputs
from webapp.runs.services.control import (
    ACTIVE_DEVICE,
    control_event,
    fail_run,
    lock_run,
    move_run,
    run_clock,
    staged_devices,
)
from webapp.runs.services.deployment import spec_fields
from webapp.runs.states import Deployment, Recovery, RunState

log = logging.getLogger(__name__)

# a recovery from a failure plans with the exact planner, whatever planned the run: it wants
# the best plan for the devices left, and takes milliseconds for a testbed's handful of
# devices. (FTPipeHD re-runs its own DP, which keeps the devices' order: on bench/faults.py's
# testbed its plans for the survivors predicted 0.61-0.84 of the optimum.)
RECOVERY_PLANNER = "optimal"
RESUME_DELAY_S = 0.1  # between the last ready and the common resume, for the start message
MEASURED_MICROBATCHES = 50  # capacities are estimated from this many recent micro-batches
S = RunDevice.StageState
# the states in which a lost device matters to a run: it recovers without it
LOSABLE = (RunState.STARTING, RunState.RUNNING, RunState.RECOVERING, RunState.PAUSED)


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


def _kept_capacities(run: Run) -> dict[str, float]:
    """The capacities to carry into the next generation, as its recovery begins."""
    try:
        return _capacities(run, *run_planning_inputs(run=run))
    except (PlanningError, FormatError, ValueError) as exc:
        log.warning("run %s: capacities not kept: %s", run.pk, exc)
        return dict(Deployment.from_json(run.deployment).capacity)


def _planning_devices(run: Run, profile: ModelProfile, devices: DeviceSet) -> DeviceSet:
    """The run's devices with speeds re-estimated from their measured stage times (FTPipeHD's
    capacity estimation); as profiled when nothing was measured."""
    ratios = {d: r for d, r in _capacities(run, profile, devices).items()
              if d in devices.ids}
    return apply_capacities(devices, ratios) if ratios else devices


def _next_generation_inputs(run: Run, candidates: Sequence[RunDevice]
                            ) -> tuple[ModelProfile, DeviceSet, CostModel]:
    """What a re-plan (a recovery's or a dynamic re-partition's) plans with: the model
    profile, every device of the run, and the cost model of ``candidates`` (the devices a new
    generation may use) with their capacities re-estimated from what they measured."""
    profile, all_devices = run_planning_inputs(run=run)
    estimated = _planning_devices(run, profile, all_devices)
    devices = _subset(estimated, [rd.device.uid for rd in candidates])
    return profile, all_devices, build_cost_model(profile, devices)


def _holdings(run: Run, staged: Sequence[RunDevice]) -> list[Holding]:
    out = [Holding.from_json(raw, device=rd.device.uid) for rd in staged
           for raw in (rd.holdings or [])]
    out += [Holding.from_json({**raw, "kind": "central"}, device=CENTRAL)
            for raw in replicas.replica_holdings(run=run)]
    return out


# --------------------------------------------------------------------------- detection


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
                touched.append(_lose(run, [rd], reason=reason, detected_by=detected_by))
    return touched


def _holds(rd: RunDevice) -> bool:
    """Does the device run a stage of the run, or hold weights a recovery may need?"""
    return rd.stage_state != S.LOST and (
        rd.stage is not None or rd.stage_state in (S.HALTING, S.HALTED) or bool(rd.holdings))


def _lose(run: Run, lost: Sequence[RunDevice], *, reason: str, detected_by: str,
          cause: str = "failure", decision: dict[str, Any] | None = None) -> Run:
    """With the run locked: mark ``lost`` and (re)start its recovery; every other staged
    device halts and reports what it holds. A dynamic re-partition is a recovery that lost
    nobody."""
    ongoing = Recovery.from_json(run.recovery) if run.state == RunState.RECOVERING else None
    if ongoing is None:
        deployment = replace(Deployment.from_json(run.deployment),
                             capacity=_kept_capacities(run))
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
    if not survivors and not _candidates(run):
        return fail_run(run, "every device of the run was lost: " + ", ".join(recovery.lost))
    for rd in survivors:
        rd.stage_state = S.HALTING
        rd.save(update_fields=["stage_state"])
        device_command_send(uid=rd.device.uid, command=command_build(
            "halt", run=run.pk, generation=recovery.generation))
    if not survivors:
        return _replan(run)
    return run


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


# --------------------------------------------------------------------------- halted, re-plan


def _candidates(run: Run) -> list[RunDevice]:
    """The run's devices a new generation may use: connected, and not lost in this recovery
    (a device that came back after an earlier loss rejoins here)."""
    ongoing = Recovery.from_json(run.recovery)
    lost = set(() if ongoing is None else ongoing.lost)
    return [rd for rd in RunDevice.objects.filter(run=run).select_related("device")
            .order_by("position")
            if rd.device.uid not in lost and rd.device.status in ACTIVE_DEVICE
            and rd.device.data_address]


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


def _replan(run: Run) -> Run:
    """With the run locked and every survivor halted: plan the next generation, choose the
    resume point and the weights' sources, and deploy it."""
    recovery = Recovery.from_json(run.recovery)
    assert recovery is not None  # the run is recovering
    generation = recovery.generation
    current = Deployment.from_json(run.deployment).plan
    candidates = _candidates(run)
    if not candidates:
        return fail_run(run, "no device is left to recover on (lost: "
                             f"{', '.join(recovery.lost)})")
    try:
        profile, all_devices, cm = _next_generation_inputs(run, candidates)
        # a dynamic re-partition deploys the plan its break-even was judged on (it deployed
        # the optimal planner's, another plan, which the decision had not priced)
        dynamic = recovery.cause == "dynamic"
        algorithm = _dynamic_planner(run) if dynamic else RECOVERY_PLANNER
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
    peers, keys = data_peers([rd.device for rd in candidates])
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
        release=tuple(sorted(rd.device.uid for rd in candidates if rd.device.uid not in staged)),
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


# --------------------------------------------------------------------------- commit, resume


def recovery_ready(run: Run) -> Run:
    """With the run locked, recovering and every stage of the next generation ready: the
    commit. Everyone starts at the resume point at one time; the survivors the new plan left
    out drop what they held. A run paused before or during the recovery starts its stages
    paused and is paused again; resuming it resumes them."""
    recovery = Recovery.from_json(run.recovery)
    assert recovery is not None  # the run is recovering
    generation, paused = recovery.generation, recovery.paused
    now = time.time()
    begin_at = now + RESUME_DELAY_S
    from_start = recovery.from_start  # lost while starting: this begins the run
    if from_start or run.started_at is None:  # the run's clock starts with its training
        run.started_at = datetime.fromtimestamp(begin_at, tz=UTC)
    started_at = run.started_at.timestamp()
    staged = staged_devices(run)
    RunDevice.objects.filter(pk__in=[s.pk for s in staged]).update(stage_state=S.RUNNING)
    RunDevice.objects.filter(run=run).update(holdings=[])
    # the server's replicas past the resume point hold training the recovery threw away: with
    # the next generation's replicas they could restore a model no run ever had
    WeightReplica.objects.filter(run=run, applied__gt=recovery.resume).delete()
    for rd in staged:
        device_command_send(uid=rd.device.uid, command=command_build(
            "start", run=run.pk, generation=generation, started_at=started_at,
            begin_at=begin_at, paused=paused))
    for uid in recovery.release:
        device_command_send(uid=uid, command=command_build("stop", run=run.pk))
    detected = recovery.detected_wall or now
    moved_s = now - (recovery.replanned_wall or now)
    control_event(run, "weights_redistributed", detail={
        "generation": generation, "bytes_moved": recovery.bytes_moved,
        "transfers": recovery.transfers, "duration_s": round(moved_s, 4)})
    recovery_s = begin_at - detected
    resumed_at = begin_at - started_at
    Generation.objects.filter(run=run, number=generation).update(resumed_at=resumed_at)
    run.generation = generation
    run.deployment = replace(Deployment.from_json(run.deployment), plan=recovery.next_plan,
                             since_s=resumed_at, restart_s=recovery_s).to_json()
    run.recovery = {}
    after = move_run(run, RunState.PAUSED if paused else RunState.RUNNING,
                        action="resume after recovery")
    control_event(after, "recovered", detail={
        "generation": generation, "recovery_s": round(recovery_s, 4),
        "resume_microbatch": recovery.resume,
        "microbatches_redone": recovery.redone, "paused": paused})
    if from_start:
        control_event(after, "run_started", detail={"after_recovery": True})
    _rejoin_connected(after, recovery.back)
    return after


def _rejoin_connected(run: Run, back: Sequence[str]) -> None:
    """Devices lost in the recovery just committed whose agent connected again meanwhile (one
    restarted at once): run_device_back kept them for the commit; they join now, as if they
    had connected after it."""
    for rd in (RunDevice.objects.filter(run=run, stage_state=S.LOST, device__uid__in=list(back),
                                        device__status__in=ACTIVE_DEVICE)
               .select_related("device")):
        RunDevice.objects.filter(pk=rd.pk).update(stage_state=S.IDLE, stage=None)
        control_event(run, "device_joined", device=rd.device.uid,
                      detail={"during_recovery": True})


# --------------------------------------------------------------------------- dynamic re-partition


def _checks(run: Run) -> int:
    """Micro-batches at which the next dynamic re-partition check is due."""
    return run.repartition_after * run.microbatches


def measured_period_s(*, run: Run, since_s: float, last: Sequence[str]) -> float | None:
    """Seconds per micro-batch through the last stage (its ``last`` devices: replicas share
    its micro-batches) over its recent backwards."""
    starts = list(TimelineEvent.objects.filter(run=run, device__in=list(last), kind="backward",
                                               start__gte=since_s)
                  .order_by("-start").values_list("start", flat=True)[:MEASURED_MICROBATCHES])
    if len(starts) < 10:
        return None
    return (starts[0] - starts[-1]) / (len(starts) - 1)


def _repartition_due(run: Run, progress: int) -> bool:
    deployment = Deployment.from_json(run.deployment)
    due = deployment.next_check or _checks(run)
    return bool(run.state == RunState.RUNNING and run.repartition_every and progress >= due
                and deployment.plan)


def run_repartition_check(*, run_id: int, progress: int, seen: Run | None = None
                          ) -> Run | None:
    """FTPipeHD's dynamic re-partition, made to pay: after ``repartition_after`` batches and then
    every ``repartition_every``, re-estimate the devices from their measured stage times, plan
    again, and move only if the time saved over the remaining micro-batches exceeds the cost
    of moving (the weights over the slowest link, the restart, the micro-batches redone).
    ``progress``: the furthest micro-batch an update was reported for. ``seen``: the run as the
    caller has just read it; when that copy is not due, the check ends there, without a
    transaction (every batch of an agent's events asks, several times a second; the next batch
    reads the run again)."""
    if seen is not None and not _repartition_due(seen, progress):
        return None
    with transaction.atomic():
        run = lock_run(Run(pk=run_id))
        if not _repartition_due(run, progress):
            return None
        run.deployment = replace(
            Deployment.from_json(run.deployment),
            next_check=progress + run.repartition_every * run.microbatches).to_json()
        run.save(update_fields=["deployment"])
        decision = _repartition_decision(run, progress)
        if decision is None:
            return run
        detail = {"saved_s": round(decision.saved_s, 4), "cost_s": round(decision.cost_s, 4)}
        if not decision.move:
            control_event(run, "repartition_skipped", detail={
                **detail, **Deployment.from_json(run.deployment).estimate})
            return run
        return _lose(run, [], reason="", detected_by="", cause="dynamic", decision=detail)


def _dynamic_planner(run: Run) -> str:
    """FTPipeHD's dynamic re-partition re-runs the run's own planner with the new capacities
    (a learned one: ftpipehd's DP, a minute of training has no place here): the user chose its
    kind of plan (ftpipehd keeps every device, in order), which a recovery from a failure
    cannot keep anyway."""
    algorithm = run.chosen_plan.algorithm if run.chosen_plan else RECOVERY_PLANNER
    return "ftpipehd" if algorithm in LEARNED else algorithm


def _repartition_decision(run: Run, progress: int) -> Decision | None:
    deployment = Deployment.from_json(run.deployment)
    try:
        profile, all_devices, cm = _next_generation_inputs(run, _candidates(run))
        current = parse_plan(dict(deployment.plan or {}), profile=profile, devices=all_devices,
                             file="the current plan")
        measured = measured_period_s(run=run, since_s=deployment.since_s,
                                     last=current.stages[-1].devices)
        if measured is None:
            return None
        plan = run_planner(cm, _dynamic_planner(run), schedule=run.schedule,
                           microbatches=run.microbatches)
    except (PlanningError, FormatError, ValueError, KeyError) as exc:
        log.warning("run %s: no dynamic re-partition: %s", run.pk, exc)
        return None
    predicted = plan.predicted
    if predicted is None:
        return None
    same = [(s.layers, s.devices) for s in plan.stages] == [
        (s.layers, s.devices) for s in current.stages]
    moved = 0 if same else redistribute_weights(
        old=current, new=plan, failed=(), profile=profile,
        momentum=run.momentum > 0).bytes_moved
    bandwidth = min(d.bandwidth_bps for d in cm.devices.devices)
    decision = repartition_decision(
        measured_period_s=measured, new_period_s=predicted.period_s,
        remaining_microbatches=max(0, run.total_microbatches - progress),
        bytes_to_move=moved, bandwidth_bps=bandwidth,
        restart_s=deployment.restart_s or 1.0,
        redo_microbatches=len(current.stages))
    run.deployment = replace(deployment, estimate={
        "measured_throughput_sps": round(run.model_spec.batch_size / measured, 2),
        "predicted_throughput_sps": round(predicted.throughput_sps, 2)}).to_json()
    run.save(update_fields=["deployment"])
    if same:
        return Decision(saved_s=0.0, cost_s=decision.cost_s)
    return decision


# --------------------------------------------------------------------------- probing


def run_suspect(*, run: Run, device: Device, generation: Any) -> None:
    """Stage 0's backward timer fired: probe every staged device; whoever has not answered
    within PROBE_TIMEOUT_S is lost (a device that answers without the stage restarted and is
    lost too). The probe is a row (any web process may take an answer) and the verdict a
    Celery task with that countdown."""
    if run.state != RunState.RUNNING or generation != run.generation:
        return
    staged = [rd.device.uid for rd in staged_devices(run)]
    with transaction.atomic():
        _, created = Probe.objects.get_or_create(
            run=run, defaults={"generation": run.generation, "asked": staged, "answers": {}})
        if not created:
            return  # a probe is already out
        transaction.on_commit(lambda: probe_verdict_schedule(run.pk))
    for uid in staged:
        device_command_send(uid=uid, command=command_build("probe", run=run.pk))


def probe_verdict_schedule(run_id: int) -> None:
    from webapp.runs.tasks import probe_verdict  # the tasks module imports this one

    probe_verdict.apply_async(args=[run_id], countdown=settings.PROBE_TIMEOUT_S)


@transaction.atomic
def run_probe_answered(*, run: Run, device: Device, holds: Any) -> None:
    probe = Probe.objects.select_for_update().filter(run=run).first()
    if probe is not None and device.uid in probe.asked:
        probe.answers = {**probe.answers, device.uid: bool(holds)}
        probe.save(update_fields=["answers"])


def probe_verdict(run_id: int) -> list[str]:
    """The probe's countdown ran out: every device asked that did not answer holding its stage
    is lost. Returns their uids (none when the probe is gone: already judged)."""
    with transaction.atomic():
        probe = Probe.objects.select_for_update().filter(run_id=run_id).first()
        if probe is None:
            return []
        asked, answers = list(probe.asked), dict(probe.answers)
        probe.delete()
    lost = [uid for uid in asked if not answers.get(uid)]
    for uid in lost:
        device = Device.objects.get(uid=uid)
        reason = ("it restarted: its stage is gone" if uid in answers
                  else f"no answer to a probe within {settings.PROBE_TIMEOUT_S:g} s")
        run_device_lost(device=device, reason=reason, detected_by="probe")
    return lost
