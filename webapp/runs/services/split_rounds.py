"""A split run's rounds: after each round's FedAvg, pipeline 0's parts (the aggregated model:
every client's copy of a part is the same after it) reach the server as replicas, and a
Celery task measures the model's accuracy on the held-out set (the data set's last fifth,
which no client trains on). The run page shows it per round; ``round_evaluated`` events say
it on the run's record."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import torch
from django.db import transaction

from agent.data import DataError, load_dataset
from agent.weights import WeightError, from_bytes, load_layer_state
from agent.zoo import build_model
from webapp.runs import events, selectors
from webapp.runs.models import (
    MULTI_PIPELINE_KINDS,
    FaultEvent,
    MetricPoint,
    Run,
    RunDevice,
    WeightReplica,
)
from webapp.runs.replicas import ReplicaMissing, replica_read
from webapp.runs.services.control import control_event, run_clock
from webapp.runs.services.ingest import metric_points_store
from webapp.runs.states import Deployment

log = logging.getLogger(__name__)

EVALUATE_BATCH = 512  # held-out samples a forward pass takes at once


def uploader(run: Run) -> int:
    """The pipeline whose stages send the server each round's average: 0, or the lowest left
    once the run went on without some (webapp.runs.recovery.exclusion)."""
    left = {part["pipeline"] for rd in RunDevice.objects.filter(run=run)
            .exclude(stage_state=RunDevice.StageState.LOST)
            for part in rd.parts if not part.get("dropped")}
    return min(left, default=0)


def round_length(run: Run) -> int:
    """Micro-batches of the uploading pipeline a round (PipeLearn: its N x the batches of an
    epoch; split learning: the batches of a round)."""
    plan = run.chosen_plan
    current = Deployment.from_json(run.deployment).plan
    document: Any = current if current else (None if plan is None else plan.document)
    try:
        total = int(document["run_plan"]["microbatches"][uploader(run)])
    except (KeyError, IndexError, TypeError, ValueError):
        return max(1, run.batches * run.microbatches)
    return max(1, total // max(1, run.epochs))


def _parts(run: Run) -> list[tuple[int, int]]:
    """The layer ranges of the uploading pipeline's stages (a client's part-1, 2, 3; a
    PipeLearn device's layers and the server's copy), in the current generation's plan."""
    plan = run.chosen_plan
    current = Deployment.from_json(run.deployment).plan
    document: Any = current if current else (None if plan is None else plan.document)
    try:
        stages = document["run_plan"]["pipelines"][uploader(run)]["stages"]
        return [(int(s["layers"][0]), int(s["layers"][1])) for s in stages]
    except (KeyError, IndexError, TypeError, ValueError):
        return []


def split_round_stored(*, run: Run, applied: int) -> bool:
    """A replica of ``run`` at ``applied`` was stored: when every part of pipeline 0 at
    ``applied`` is there, queue the round's evaluation (once the upload commits). Whether
    it was queued."""
    if run.kind not in MULTI_PIPELINE_KINDS:
        return False
    parts = _parts(run)
    held = set(WeightReplica.objects.filter(run=run, applied=applied)
               .values_list("first", "last"))
    if not parts or not set(parts) <= held:
        return False
    from webapp.runs.tasks import split_round_evaluate  # the task module imports services

    transaction.on_commit(partial(split_round_evaluate.delay, run.pk, applied))
    return True


def held_out_accuracy(*, model: str, dataset: str, seed: int,
                      parts: dict[tuple[int, int], bytes]) -> tuple[float, int]:
    """The accuracy on ``dataset``'s held-out set of ``model`` whose layers are the safetensors
    blobs ``parts`` (by layer range, covering the model), and the samples it was measured on.
    The data set is the one the agents load (their seed, 0); ``seed`` builds the model."""
    data = load_dataset(dataset)
    zoo = build_model(model, input_shape=data.input_shape, num_classes=data.num_classes,
                      seed=seed)
    for (first, last), blob in parts.items():
        load_layer_state(zoo.stage(first, last), first,
                         from_bytes(blob, first=first, last=last))
    full = zoo.full().eval()
    x, y = data.test_set()
    correct = 0
    with torch.no_grad():
        for at in range(0, len(y), EVALUATE_BATCH):
            logits = full(x[at:at + EVALUATE_BATCH])
            correct += int((logits.argmax(dim=1) == y[at:at + EVALUATE_BATCH]).sum())
    return correct / max(1, len(y)), len(y)


def split_round_evaluate(*, run_id: int, applied: int) -> float | None:
    """The body of the Celery task: the aggregated model of the round that ended at
    ``applied`` micro-batches, its held-out accuracy stored as a ``test_accuracy`` metric
    point and a ``round_evaluated`` event ({round, applied, accuracy, samples}). Idempotent:
    a round evaluated already is left alone. None when it cannot be measured (say why in the
    log: the replicas went, a data set only the agents can read)."""
    run = Run.objects.select_related("model_spec", "chosen_plan").filter(pk=run_id).first()
    if run is None:
        return None
    if FaultEvent.objects.filter(run=run, kind="round_evaluated",
                                 detail__applied=applied).exists():
        return None
    spec = run.model_spec
    try:
        blobs = {(a, e): replica_read(run=run, first=a, last=e, applied=applied)
                 for a, e in _parts(run)}
        accuracy, samples = held_out_accuracy(model=spec.model, dataset=spec.dataset,
                                              seed=run.pk, parts=blobs)
    except (ReplicaMissing, DataError, WeightError, ValueError) as exc:
        log.warning("run %s: the round ending at %s cannot be evaluated: %s", run.pk, applied,
                    exc)
        return None
    round_index = applied // round_length(run)
    with transaction.atomic():
        at = run_clock(run)
        stored = metric_points_store(run=run, points=[
            {"at": at, "kind": MetricPoint.Kind.TEST_ACCURACY, "device": "",
             "value": accuracy}])
        events.run_event_send(run.pk, events.event_metrics(stored))
        without = sorted(RunDevice.objects.filter(run=run, stage_state=RunDevice.StageState.LOST)
                         .values_list("device__uid", flat=True))
        control_event(run, "round_evaluated", at=at, detail={
            "round": round_index, "applied": applied, "accuracy": accuracy,
            "samples": samples, **({"without": without} if without else {})})
    log.info("run %s: round %s (applied %s): held-out accuracy %.4f over %s samples", run.pk,
             round_index, applied, accuracy, samples)
    return accuracy


def split_rounds(*, run: Run) -> list[dict[str, Any]]:
    """The run's evaluated rounds, in order: {round, applied, accuracy, samples, at}."""
    rows = [f for f in selectors.run_faults(run=run) if f["kind"] == "round_evaluated"]
    return sorted(({**f["detail"], "at": f["at"]} for f in rows),
                  key=lambda r: r.get("applied", 0))
