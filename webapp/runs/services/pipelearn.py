"""PipeLearn runs (docs/architecture.md, "PipeLearn trained"): one agent is the server, every
other device of the run keeps its data and trains layers [0, P) with its own N; the server a
copy of [P, L) per device. The algorithms are PipeLearn and its baselines SFL and FL
(orchestrator.pipelearn_plan.METHODS), one plan each, so that the three run on the same
devices, shards, model and epochs. An epoch is ``batches`` iterations of B samples on every
device; the run trains ``epochs`` of them, FedAvg of each side after each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from orchestrator.errors import FormatError, PlanningError
from orchestrator.formats import DeviceSet
from orchestrator.pipelearn_plan import METHODS, MethodPlan, make_setting, plan_method
from orchestrator.pipelearn_run import (
    SCHEDULE,
    common_split,
    pipelearn_run_plan,
    predicted_iteration_s,
    server_memory_need_bytes,
)
from orchestrator.protocol import ProtocolError, StageSpec
from orchestrator.protocol.stagespec import SHARD_SPLITS
from orchestrator.runplan import parse_run_plan
from orchestrator.runspecs import run_plan_specs
from orchestrator.schedule import MAX_MICROBATCHES
from webapp.common.exceptions import InvalidInput, distinct_choices
from webapp.devices.models import Device, ModelSpec
from webapp.devices.selectors import model_num_layers
from webapp.runs import events
from webapp.runs.models import LR_MAX, MOMENTUM_MAX, RUN_DEFAULTS, Plan, Run, RunDevice
from webapp.runs.selectors import run_planning_inputs

MAX_BATCH = 4096  # B, the samples of one iteration on a device


def check_methods(methods: Sequence[str], field: str = "algorithms") -> list[str]:
    return distinct_choices(methods, METHODS, field=field, what="PipeLearn method")


@transaction.atomic
def pipelearn_run_create(*, name: str, model_spec: ModelSpec, server: Device,
                         clients: Sequence[Device], algorithms: Sequence[str] = METHODS,
                         batch_size: int | None = None, batches: int = 10, epochs: int = 3,
                         shard_split: str = "iid", lr: float = RUN_DEFAULTS["lr"],
                         momentum: float = RUN_DEFAULTS["momentum"],
                         overrides: Sequence[dict[str, Any]] = (),
                         created_by: AbstractBaseUser | None = None) -> Run:
    """A draft PipeLearn run: ``server`` and the ``clients`` (devices that keep their data),
    B = ``batch_size`` samples an iteration (default: the model spec's), ``batches``
    iterations an epoch, ``epochs`` epochs; ``overrides``, the user's split point and
    parallel batch number of some clients under PipeLearn ({device, split, parallel_batches}:
    P in 1..L-1, N in 1..B). Each setting is checked, InvalidInput naming it."""
    if not clients:
        raise InvalidInput("clients", "needs at least one device")
    for i, device in enumerate([server, *clients]):
        field = "server" if i == 0 else f"clients[{i - 1}]"
        if device.status == Device.Status.RETIRED:
            raise InvalidInput(field, f"device {device.pk} ({device.uid}) is retired")
        if device in [server, *clients][:i]:
            what = "the server" if device == server else "a client already"
            raise InvalidInput(field, f"device {device.pk} ({device.uid}) is {what}")
    batch = model_spec.batch_size if batch_size is None else batch_size
    for field, value, most in (("batch_size", batch, MAX_BATCH), ("batches", batches, 10**6),
                               ("epochs", epochs, 10**4)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise InvalidInput(field, f"must be an integer from 1 to {most:,}")
    if batch * batches * epochs > MAX_MICROBATCHES:  # N is at most B micro-batches
        raise InvalidInput("batches", f"{epochs} epochs of {batches:,} iterations of up to "
                                      f"{batch} micro-batches make more than the "
                                      f"{MAX_MICROBATCHES:,} micro-batches a run trains")
    if shard_split not in SHARD_SPLITS:
        raise InvalidInput("shard_split", f"must be {' or '.join(SHARD_SPLITS)}")
    chosen = _overrides(overrides, clients=clients, batch=batch,
                        layers=model_num_layers(model_spec=model_spec))
    if not 0 < lr <= LR_MAX:
        raise InvalidInput("lr", f"must be a number above 0 and at most {LR_MAX:g}")
    if not 0 <= momentum <= MOMENTUM_MAX:
        raise InvalidInput("momentum", f"must be a number from 0 to {MOMENTUM_MAX}")
    run = Run.objects.create(
        name=name, kind="pipelearn", model_spec=model_spec,
        pipelearn={"server": server.uid, "clients": [d.uid for d in clients],
                   "batch_size": batch, "shard_split": shard_split, "overrides": chosen},
        algorithms=check_methods(algorithms), schedule=SCHEDULE, microbatches=1,
        batches=batches, epochs=epochs, lr=float(lr), momentum=float(momentum),
        vertical_sync=False, aggregate_every=0, chain_every=0, global_every=0,
        repartition_every=0, created_by=created_by)
    RunDevice.objects.bulk_create(RunDevice(run=run, device=d, position=k)
                                  for k, d in enumerate([server, *clients]))
    events.run_event_send(run.pk, events.event_run(run))
    return run


def _overrides(raw: Sequence[dict[str, Any]], *, clients: Sequence[Device], batch: int,
               layers: int | None) -> dict[str, list[int]]:
    """The user's (P, N) by client uid; InvalidInput naming ``overrides[i].<field>``."""
    out: dict[str, list[int]] = {}
    for i, item in enumerate(raw):
        device = item.get("device")
        if device not in clients:
            raise InvalidInput(f"overrides[{i}].device", "must be one of the run's clients")
        if device.uid in out:
            raise InvalidInput(f"overrides[{i}].device", f"repeats device {device.pk}")
        for field, most in (("split", None if layers is None else layers - 1),
                            ("parallel_batches", batch)):
            value = item.get(field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (
                    most is not None and value > most):
                why = (f"must be from 1 to {most}" if most is not None
                       else "must be at least 1")
                what = ("layers [0, P) on the device, the rest on the server"
                        if field == "split" else f"micro-batches of B // N, B = {batch}")
                raise InvalidInput(f"overrides[{i}].{field}", f"{why} ({what}), got {value!r}")
        out[device.uid] = [item["split"], item["parallel_batches"]]
    return out


def _settings(run: Run) -> dict[str, Any]:
    raw = run.pipelearn if isinstance(run.pipelearn, dict) else {}
    if not isinstance(raw.get("server"), str) or not isinstance(raw.get("clients"), list):
        raise PlanningError(f"run {run.pk} names no PipeLearn server and clients")
    return raw


def pipelearn_method_plan(*, run: Run, method: str, clients: Sequence[str] | None = None
                          ) -> MethodPlan:
    """``method``'s plan by the time model for ``run`` (on ``clients``, default all of its),
    fed with the devices' measured profiles and links: one split point P for every device
    (each its own N), so that FedAvg averages whole models; under PipeLearn the user's
    (P, N) of a device, where given, instead. ValueError naming the field when it cannot
    be."""
    settings = _settings(run)
    profile, devices = run_planning_inputs(run=run)
    server = settings["server"]
    chosen = list(settings["clients"] if clients is None else clients)
    keep = {server, *chosen}
    members = DeviceSet(devices=tuple(d for d in devices.devices if d.id in keep),
                        links=tuple(k for k in devices.links if {k.a, k.b} <= keep),
                        file=devices.file)
    setting = make_setting(profile=profile, devices=members, server=server,
                           batch_size=int(settings["batch_size"]),
                           data_size=run.batches * int(settings["batch_size"]))
    overrides = common_split(setting, method=method) if method != "fl" else {}
    if method == "pipelearn":
        overrides.update({uid: (int(p), int(n))
                          for uid, (p, n) in (settings.get("overrides") or {}).items()
                          if uid in chosen})
    return plan_method(setting, method, overrides=overrides)


def pipelearn_plan_document(*, run: Run, method: str, clients: Sequence[str] | None = None
                            ) -> dict[str, Any]:
    """``method``'s plan of ``run`` (pipelearn_method_plan) and the run plan agents train
    under it. PlanningError naming the field when it cannot be (the server without memory
    for every client's server-side part, say)."""
    settings = _settings(run)
    _, devices = run_planning_inputs(run=run)
    server = settings["server"]
    try:
        plan = pipelearn_method_plan(run=run, method=method, clients=clients)
        trained = pipelearn_run_plan(plan, batches=run.batches, epochs=run.epochs)
    except ValueError as exc:
        raise PlanningError(str(exc)) from None
    need, has = server_memory_need_bytes(plan), devices.device(server).memory_bytes
    if need > has:
        raise PlanningError(f"server: {server!r} has {has / 1e6:.0f} MB of memory, but the "
                            f"{len(plan.devices)} clients' server-side parts need "
                            f"{need / 1e6:.0f} MB")
    return {"kind": "pipelearn", **trained.to_json(), **plan.to_json(),
            "iteration_s": predicted_iteration_s(plan)}


def pipelearn_plan_figures(plan: Plan) -> dict[str, Any]:
    """The figures a Plan row stores for ``plan``'s method: the period is the predicted
    iteration of the slowest client (an epoch is ``batches`` of them and the aggregation)."""
    run = plan.run
    document = pipelearn_plan_document(run=run, method=plan.algorithm)
    settings = _settings(run)
    clients = len(settings["clients"])
    per_device = document.get("devices") or {}
    slowest = max(per_device, key=lambda uid: per_device[uid]["iteration_s"], default="")
    figures = {"document": document,
               "stages": max(len(p["stages"]) for p in document["run_plan"]["pipelines"]),
               "period_s": document["epoch_s"] / run.batches,
               "throughput_sps": clients * int(settings["batch_size"]) * run.batches
               / document["epoch_s"],
               # an epoch waits for the slowest device's iterations (then the FedAvg)
               "bottleneck": f"{slowest}'s iterations" if slowest else "",
               "memory_ok": True, "planner_s": document["planner_s"],
               "error": ""}
    try:  # a plan that could not be deployed fails here, not when the run starts
        pipelearn_stage_specs(run=run, document=document)
    except (ProtocolError, FormatError) as exc:
        raise PlanningError(f"the {plan.algorithm} plan cannot run: {exc}") from None
    return figures


def pipelearn_stage_specs(*, run: Run, document: dict[str, Any]) -> tuple[StageSpec, ...]:
    """Every stage spec of a PipeLearn plan ``document``: each device's shard of the data
    and micro-batches of B // N; pipeline 0's stages upload their parts after each epoch's
    FedAvg (the server measures the averaged model on the held-out set)."""
    settings = _settings(run)
    profile, devices = run_planning_inputs(run=run)
    if not isinstance(document, dict) or document.get("kind") != "pipelearn":
        raise FormatError(f"run {run.pk}: its plan is not a PipeLearn plan")
    run_plan = parse_run_plan(document.get("run_plan"), profile=profile, devices=devices,
                              file="plan run_plan")
    sizes = document.get("microbatch_sizes")
    if not isinstance(sizes, list) or len(sizes) != len(run_plan.pipelines):
        raise FormatError("plan microbatch_sizes: one per pipeline")
    everyone = list(settings["clients"])
    clients = list(document.get("clients") or [])
    spec = run.model_spec
    shared = {"run": run.pk, "model": spec.model, "dataset": spec.dataset,
              "batch_size": spec.batch_size, "lr": run.lr, "momentum": run.momentum,
              "seed": run.pk}
    specs = run_plan_specs(run_plan, shared=shared, shard_split=settings["shard_split"],
                           shards=[(everyone.index(c), len(everyone)) for c in clients],
                           batch_sizes=[int(s) for s in sizes])
    return tuple(replace(s, global_every=s.round_every or run_plan.microbatches[0] // run.epochs)
                 if s.pipeline == 0 else s for s in specs)
