"""Split runs (docs/architecture.md, "Split learning trained"): parallel split learning on
enrolled devices, its clients and helpers chosen in the run.

A split run is a run of ``kind`` "split": its algorithms are split-learning methods
(orchestrator.sl.solve.METHODS), one plan each; a plan is the method's schedule for the study
built from the devices' measured profiles and links, and the run plan agents train under it
(one U-shaped pipeline per client, FedAvg of every part each round). A round is
``batches`` batches of every client (one micro-batch a batch, as the paper updates after each
batch), and the run trains ``epochs`` rounds. Starting it deploys each device's stages (a
client's two, a helper's one per client) through orchestrator.runspecs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from orchestrator.cost import build_cost_model
from orchestrator.errors import FormatError, PlanningError
from orchestrator.protocol import ProtocolError, StageSpec
from orchestrator.runplan import parse_run_plan
from orchestrator.runspecs import run_plan_specs
from orchestrator.schedule import MAX_MICROBATCHES
from orchestrator.sl.formats import parse_instance, parse_schedule
from orchestrator.sl.runtime import (
    SplitCuts,
    instance_from_measurements,
    predicted_makespan_s,
    split_run_plan,
)
from orchestrator.sl.settings import SplitSettings
from orchestrator.sl.solve import METHODS, solve
from orchestrator.sl.turns import run_turns
from webapp.common.exceptions import InvalidInput, distinct_choices
from webapp.devices.models import Device, ModelSpec
from webapp.devices.selectors import model_num_layers
from webapp.runs import events
from webapp.runs.models import LR_MAX, MOMENTUM_MAX, RUN_DEFAULTS, Plan, Run, RunDevice
from webapp.runs.selectors import run_planning_inputs

SPLIT_SCHEDULE = "gpipe"  # the paper's batch workflow: one micro-batch a batch, then update


def _invalid(exc: ValueError, *, prefix: str = "") -> InvalidInput:
    """A ValueError of the orchestrator ("field: reason") as a 400 naming the field."""
    field, _, reason = str(exc).partition(": ")
    return InvalidInput(prefix + field, reason or str(exc))


@transaction.atomic
def split_run_create(*, name: str, model_spec: ModelSpec, clients: Sequence[Device],
                     helpers: Sequence[Device], algorithms: Sequence[str], sigma1: int,
                     sigma2: int, batches: int = 20, epochs: int = 3,
                     slot_ms: float = 10.0, shard_split: str = "iid",
                     time_limit_s: float = 5.0, switch_slots: int = 0, seed: int = 0,
                     lr: float = RUN_DEFAULTS["lr"], momentum: float = RUN_DEFAULTS["momentum"],
                     created_by: AbstractBaseUser | None = None) -> Run:
    """A draft split run: ``clients`` each train part-1 (layers 0..sigma1) and part-3
    (sigma2+1..) on their own shard, ``helpers`` part-2 for the clients a plan assigns them;
    ``epochs`` rounds of ``batches`` batches each, FedAvg of every part after each round.
    Each setting is checked here, InvalidInput naming it; cuts that leave part-3 empty are
    refused when the model's layers are known (a zoo model, or a profile of it), else when
    the run is planned."""
    for field, devices in (("clients", clients), ("helpers", helpers)):
        for i, device in enumerate(devices):
            if device.status == Device.Status.RETIRED:
                raise InvalidInput(f"{field}[{i}]", f"device {device.pk} ({device.uid}) is "
                                                    "retired")
    try:
        cuts = SplitCuts(sigma1=sigma1, sigma2=sigma2)
    except ValueError as exc:
        raise _invalid(exc) from None
    try:
        settings = SplitSettings(clients=tuple(d.uid for d in clients),
                                 helpers=tuple(d.uid for d in helpers), cuts=cuts,
                                 slot_ms=slot_ms, shard_split=shard_split,
                                 time_limit_s=time_limit_s, switch_slots=switch_slots, seed=seed)
        layers = model_num_layers(model_spec=model_spec)
        if layers is not None:
            settings.check_layers(layers)
    except ValueError as exc:
        raise _invalid(exc) from None
    methods = check_methods(algorithms)
    for field, value in (("batches", batches), ("epochs", epochs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInput(field, "must be a positive integer")
    if batches * epochs > MAX_MICROBATCHES:
        raise InvalidInput("batches", f"{epochs} rounds of {batches:,} batches make "
                                      f"{batches * epochs:,}; a run trains at most "
                                      f"{MAX_MICROBATCHES:,} batches")
    if not 0 < lr <= LR_MAX:
        raise InvalidInput("lr", f"must be a number above 0 and at most {LR_MAX:g}")
    if not 0 <= momentum <= MOMENTUM_MAX:
        raise InvalidInput("momentum", f"must be a number from 0 to {MOMENTUM_MAX}")
    run = Run.objects.create(
        name=name, kind="split", split=settings.to_json(), model_spec=model_spec,
        algorithms=methods, schedule=SPLIT_SCHEDULE, microbatches=1, batches=batches,
        epochs=epochs, lr=float(lr), momentum=float(momentum), vertical_sync=False,
        aggregate_every=0, chain_every=0, global_every=0, repartition_every=0,
        created_by=created_by)
    RunDevice.objects.bulk_create(RunDevice(run=run, device=d, position=k)
                                  for k, d in enumerate([*clients, *helpers]))
    events.run_event_send(run.pk, events.event_run(run))
    return run


def check_methods(methods: Sequence[str], field: str = "algorithms") -> list[str]:
    """A split run's algorithms: split-learning methods, each once."""
    return distinct_choices(methods, METHODS, field=field, what="split-learning method")


def split_settings(run: Run) -> SplitSettings:
    try:
        return SplitSettings.from_json(run.split)
    except ValueError as exc:
        raise PlanningError(f"run {run.pk}'s split settings: {exc}") from None


def split_plan_document(*, run: Run, method: str, clients: Sequence[str],
                        helpers: Sequence[str], time_limit_s: float | None = None
                        ) -> dict[str, Any]:
    """A split plan of ``run`` on ``clients`` and ``helpers`` with ``method``: the study of
    one batch from the devices' measured profiles and links, the method's schedule, and the
    run plan the agents train under it (PlanningError naming the field when it cannot be)."""
    settings = split_settings(run)
    profile, devices = run_planning_inputs(run=run)
    try:
        instance = instance_from_measurements(
            profile=profile, devices=devices, clients=clients, helpers=helpers,
            cuts=settings.cuts, slot_ms=settings.slot_ms, name=f"run {run.pk}")
        schedule = solve(instance=instance, method=method,
                         time_limit_s=time_limit_s or settings.time_limit_s,
                         seed=settings.seed, switch_slots=settings.switch_slots)
        run_plan = split_run_plan(
            schedule=schedule, cuts=settings.cuts, clients=clients, helpers=helpers,
            num_layers=profile.num_layers, microbatches_per_round=[run.batches] * len(clients),
            rounds=run.epochs, samples=[run.batches * run.model_spec.batch_size] * len(clients),
            schedule_name=SPLIT_SCHEDULE)
    except ValueError as exc:
        raise PlanningError(str(exc)) from None
    return {"kind": "split", "clients": list(clients), "helpers": list(helpers),
            "instance": instance.to_json(), "schedule": schedule.to_json(),
            "run_plan": run_plan.to_json(),
            "makespan_s": predicted_makespan_s(schedule=schedule, instance=instance)}


def split_plan_figures(plan: Plan) -> dict[str, Any]:
    """Plan a split run on its clients and helpers with ``plan``'s method (the figures a Plan
    row stores). The period is the schedule's batch makespan."""
    run = plan.run
    settings = split_settings(run)
    document = split_plan_document(run=run, method=plan.algorithm, clients=settings.clients,
                                   helpers=settings.helpers)
    makespan_s = document["makespan_s"]
    instance = parse_instance(document["instance"], file="plan instance")
    schedule = parse_schedule(document["schedule"], file="plan schedule")
    helpers = settings.helpers
    busiest = max(range(len(helpers)), key=lambda i: sum(
        instance.p[j][i] + instance.pp[j][i]
        for j, h in enumerate(schedule.assignment) if h == i))
    figures = {"document": document, "stages": 3, "period_s": makespan_s,
               "throughput_sps": len(settings.clients) * run.model_spec.batch_size / makespan_s,
               "bottleneck": f"helper {helpers[busiest]}", "memory_ok": True,
               "planner_s": schedule.solver_s, "error": ""}
    try:  # a plan that could not be deployed fails here, not when the run starts
        split_stage_specs(run=run, document=document)
    except (ProtocolError, FormatError) as exc:
        raise PlanningError(f"the {plan.algorithm} plan cannot run: {exc}") from None
    return figures


def split_stage_specs(*, run: Run, document: dict[str, Any]) -> tuple[StageSpec, ...]:
    """Every stage spec of a split plan ``document``: the run plan's, each helper's turns in
    the order of its schedule (a preempted task cut by its own measured layer times)."""
    settings = split_settings(run)
    profile, devices = run_planning_inputs(run=run)
    if not isinstance(document, dict) or document.get("kind") != "split":
        raise FormatError(f"run {run.pk}: its plan is not a split plan")
    instance = parse_instance(document.get("instance"), file="plan instance")
    schedule = parse_schedule(document.get("schedule"), file="plan schedule")
    run_plan = parse_run_plan(document.get("run_plan"), profile=profile, devices=devices,
                              file="plan run_plan")
    turns = run_turns(cm=build_cost_model(profile, devices), instance=instance,
                      schedule=schedule, run_plan=run_plan,
                      helpers=[str(h) for h in document.get("helpers") or ()])
    spec = run.model_spec
    shared = {"run": run.pk, "model": spec.model, "dataset": spec.dataset,
              "batch_size": spec.batch_size, "lr": run.lr, "momentum": run.momentum,
              "seed": run.pk}
    # each client keeps its own shard, also in a re-plan without some of them
    clients = document.get("clients") or []
    shards = [(settings.clients.index(c), len(settings.clients)) if c in settings.clients
              else (j, len(clients)) for j, c in enumerate(clients)]
    specs = run_plan_specs(run_plan, shared=shared, turns=turns,
                           shard_split=settings.shard_split, shards=shards)
    # after each round's FedAvg, pipeline 0's parts (the aggregated model) go to the server,
    # which measures the model's held-out accuracy (split_round_evaluate)
    # (one client alone has no group: its round is the run's batches all the same)
    specs = tuple(replace(s, global_every=s.round_every or run.batches) if s.pipeline == 0
                  else s for s in specs)
    # the paper's batch: released to every client at once (each client's part-1 waits for
    # the others to finish the batch before), so that a batch's makespan is the plan's
    return tuple(replace(s, batch_sync=True) if s.stage == 0 and s.group else s
                 for s in specs)
