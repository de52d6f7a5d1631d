"""Global replicas: the stages' weights uploaded to the server every ``global_every`` batches
(docs/architecture.md, "Fault tolerance and dynamic re-partition"), the copy of last resort
when a device and the device holding its chain replica are lost together.

A replica is a safetensors file (a JSON header and raw tensor bytes: loading one runs no code,
unlike pickle, so the server never unpickles what a device sends) under ``REPLICA_DIR``, whose
tensor names are ``<layer index>.<name in the layer>``: any later stage layout can take the
layers it needs out of it. The server keeps the two newest ``applied`` of each layer range, as
every holder does: the newest may be incomplete across stages (one stage uploaded it, another
not yet), the one before is then the resume point.

A device uploads only while the run is active (starting, running, recovering or paused: else a
409) and only layers of its own stage in the run's current plan (while the run recovers, of
the plan being replaced or of the one being deployed: else a 403 naming the field). Uploads
and downloads name layers of the run's model only (a 400 past its last layer), so that merging
a download costs at most one step per layer of the model.

Once a recovery has chosen its resume point (the next generation deploys from it), the replicas
at that point are what the new stages restore from: an upload past it (a halted stage's
upload still on its way: training the recovery abandons) is a 409, and none at it is deleted
to keep the two newest (a stage's late uploads at 160 and 240 deleted the replica at 80 the
recovery had planned to restore from, and the run failed: "the server has no layers 0..3 at
80 updates").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# imported with the app (its ready() imports this module), not on the first replica: that
# import took seconds on a loaded machine, and a run's first global replicas, still in
# flight, were not there when a device was lost (the run restarted from its seed)
import torch
from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete
from django.utils import timezone
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

from orchestrator.redistribution import tensor_layer
from webapp.common.exceptions import ApplicationError, Conflict, FieldError, InvalidInput
from webapp.devices.models import Device
from webapp.devices.selectors import model_num_layers
from webapp.runs.models import MULTI_PIPELINE_KINDS, FaultEvent, Run, WeightReplica
from webapp.runs.states import ACTIVE, Deployment, Recovery, RunState

log = logging.getLogger(__name__)

KEEP = 2  # applied versions kept per (run, first, last)
MAX_LAYER = 2**31 - 1  # the columns' range
METADATA_KEYS = ("run", "first", "last", "applied")


class ReplicaMissing(ApplicationError):
    """No replica on the server holds ``layer`` at the asked ``applied`` (404): the recovery
    planned a part the server cannot give, or the file went missing."""

    status_code = 404

    def __init__(self, *, run: Run, layer: int, applied: int) -> None:
        super().__init__(f"layer {layer}: run {run.pk} has no replica of it at applied "
                         f"{applied} on the server")
        self.layer = layer
        self.applied = applied


class NotItsLayers(ApplicationError):
    """An upload of layers that are not the uploading device's to give (403): it holds no
    stage of the run's current plan, or its stage has other layers. Names the field."""

    status_code = 403

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.errors = (FieldError(field, reason),)


def _current_plans(run: Run) -> list[dict[str, Any]]:
    """The plan documents whose stages the run's devices run now: the chosen plan while it
    starts (a start after an earlier failure leaves that one's plan in ``deployment``), the
    current generation's plan after, and while it recovers also the next generation's, once
    re-planned (its devices are deploying it)."""
    documents: list[Any] = []
    if run.state != RunState.STARTING:
        documents.append(Deployment.from_json(run.deployment).plan)
    if not any(documents) and run.chosen_plan_id is not None:
        documents = [Run.objects.filter(pk=run.pk).values_list("chosen_plan__document",
                                                               flat=True).first()]
    recovery = Recovery.from_json(run.recovery)
    if run.state == RunState.RECOVERING and recovery is not None:
        documents.append(recovery.next_plan)
    return [d for d in documents if isinstance(d, dict)]


def _stages(document: dict[str, Any]) -> list[tuple[int, int, tuple[str, ...]]]:
    """``(first, last, device uids)`` of each stage of a stored plan document (of a split
    plan: of its run plan's pipelines)."""
    if document.get("kind") in MULTI_PIPELINE_KINDS:
        run_plan = document.get("run_plan")
        pipelines = run_plan.get("pipelines") if isinstance(run_plan, dict) else None
        return [stage for pipeline in pipelines if isinstance(pipeline, dict)
                for stage in _stages(pipeline)] if isinstance(pipelines, list) else []
    stages = document.get("stages")
    out = []
    for stage in stages if isinstance(stages, list) else ():
        layers = stage.get("layers") if isinstance(stage, dict) else None
        devices = stage.get("devices") if isinstance(stage, dict) else None
        if (isinstance(layers, list) and len(layers) == 2 and isinstance(devices, list)
                and all(isinstance(v, int) and not isinstance(v, bool) for v in layers)):
            out.append((layers[0], layers[1], tuple(str(d) for d in devices)))
    return out


def run_num_layers(run: Run) -> int | None:
    """How many layers the run's model has: as its current plan cuts it (the stages cover
    them all), before it has one as the model spec says (devices.selectors.model_num_layers);
    None when nothing says."""
    for document in _current_plans(run):
        stages = _stages(document)
        if stages:
            return max(last for _, last, _ in stages) + 1
    return model_num_layers(model_spec=run.model_spec)


def _check_model_layers(run: Run, last: int) -> None:
    """A range first..last (first <= last) must end at a layer of the run's model (400 naming
    ``last`` otherwise)."""
    count = run_num_layers(run)
    if count is None:
        raise Conflict(f"run {run.pk} has no plan and its model's layers are unknown: it "
                       "holds no replica", state=run.state, action="store or read replicas")
    if last >= count:
        raise InvalidInput("last", f"is {last}, past the last layer ({count - 1}) of run "
                                   f"{run.pk}'s model ({count} layers)")


def _check_uploader(run: Run, device: Device, first: int, last: int) -> None:
    """An upload of first..last by ``device`` needs the run active (409) and the layers within
    the device's own stage in the run's current plan (403 naming the field)."""
    if run.state not in ACTIVE:
        *some, last_one = [s for s in RunState.values if s in ACTIVE]
        raise Conflict(f"run {run.pk} is {run.state}: it takes replicas only while it is "
                       f"{', '.join(some)} or {last_one}", state=run.state,
                       action="upload a replica")
    own = sorted({(a, e) for document in _current_plans(run)
                  for a, e, devices in _stages(document) if device.uid in devices})
    if not own:
        raise NotItsLayers("device", f"device {device.uid} holds no stage of run {run.pk}'s "
                                     "current plan")
    if any(a <= first and last <= e for a, e in own):
        return
    field = "last" if any(a <= first <= e for a, e in own) else "first"
    held = " or ".join(f"{a}..{e}" for a, e in own)
    raise NotItsLayers(field, f"layers {first}..{last} are not all of device {device.uid}'s "
                              f"stage of run {run.pk} (layers {held}): a device uploads its own "
                              "stage's layers only")


def _resume_point(run: Run) -> int | None:
    """The resume point of the recovery under way once it has chosen one (with its next
    plan: the typed Recovery reads a missing one as 0), else None."""
    if run.state != RunState.RECOVERING or Recovery.from_json(run.recovery) is None:
        return None
    resume = run.recovery.get("resume")
    if not run.recovery.get("next_plan") or isinstance(resume, bool) or not isinstance(
            resume, int):
        return None
    return resume


def replica_dir(run_id: int) -> Path:
    return Path(settings.REPLICA_DIR) / f"run-{run_id}"


def _absolute(relative: str) -> Path:
    """A row's file, refusing a path that leaves REPLICA_DIR (rows are written only here, but
    deleting or serving a file named by the database should not trust it blindly)."""
    root = Path(settings.REPLICA_DIR).resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"replica path {relative!r} is outside REPLICA_DIR")
    return path


def _check_range(first: int, last: int, applied: int) -> None:
    for field, value in (("first", first), ("last", last), ("applied", applied)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LAYER:
            raise InvalidInput(field, f"must be an integer between 0 and {MAX_LAYER}")
    if first > last:
        raise InvalidInput("last", f"must be at least first ({first}), is {last}")


def _check_tensors(data: bytes, *, run: Run, first: int, last: int, applied: int) -> None:
    """``data`` must be safetensors whose every tensor belongs to a layer of first..last (a
    stage uploads its own layers) and whose metadata, where given, agrees with the query."""
    limit = settings.REPLICA_MAX_BYTES
    if not data:
        raise InvalidInput("body", "is empty; expected safetensors")
    if len(data) > limit:
        raise InvalidInput("body", f"is {len(data)} bytes, more than REPLICA_MAX_BYTES ({limit})")
    try:
        tensors = safetensors_load(data)
    except (SafetensorError, ValueError, RuntimeError, TypeError) as exc:
        raise InvalidInput("body", f"is not safetensors ({exc})") from None
    for name in sorted(tensors):
        layer = tensor_layer(name)
        if layer is None:
            raise InvalidInput("body", f"tensor {name!r} is not named '<layer index>.<name>'")
        if not first <= layer <= last:
            raise InvalidInput("body", f"tensor {name!r} is of layer {layer}, outside layers "
                                       f"{first}..{last}")
    expected = {"run": run.pk, "first": first, "last": last, "applied": applied}
    metadata = _metadata(data)
    for key in METADATA_KEYS:
        if key in metadata and metadata[key] != str(expected[key]):
            raise InvalidInput("body", f"metadata {key} is {metadata[key]!r}, the request "
                                       f"says {expected[key]}")


def _metadata(data: bytes) -> dict[str, str]:
    """The safetensors header's ``__metadata__`` (the load above has checked the header)."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    metadata = header.get("__metadata__") or {}
    return {str(k): str(v) for k, v in metadata.items()}


def _write_atomically(directory: Path, data: bytes) -> Path:
    """``data`` in a temporary file of ``directory`` (the same file system, so that the
    os.replace that publishes it is atomic: a reader never sees half a replica)."""
    directory.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=directory, prefix=".upload-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)


def replica_store(*, run: Run, device: Device, first: int, last: int, applied: int,
                  data: bytes) -> WeightReplica:
    """Keep ``data``, the weights of layers ``first``..``last`` at ``applied`` that ``device``
    (a device of ``run``'s current plan, those layers its stage's) uploaded; InvalidInput
    naming the field (or Conflict: the run is not active; NotItsLayers: not its layers), and
    nothing stored, if it is not that. The same (layers, applied) again replaces the earlier
    upload; of each layer range only the two newest applied are kept (while a recovery
    resumes from a chosen point, the two newest up to it, and nothing past it is taken)."""
    _check_range(first, last, applied)
    _check_model_layers(run, last)
    _check_uploader(run, device, first, last)
    _check_tensors(data, run=run, first=first, last=last, applied=applied)
    directory = replica_dir(run.pk)
    relative = f"run-{run.pk}/{first}-{last}@{applied}.safetensors"
    digest = hashlib.sha256(data).hexdigest()
    tmp = _write_atomically(directory, data)
    try:
        with transaction.atomic():
            # one upload at a time, checked against the run as it is now (a recovery may have
            # moved the device's stage meanwhile)
            locked = (Run.objects.select_for_update()
                      .only("pk", "kind", "state", "deployment", "recovery", "chosen_plan")
                      .get(pk=run.pk))
            _check_uploader(locked, device, first, last)
            kept = WeightReplica.objects.filter(run=run, first=first, last=last)
            resume = _resume_point(locked)
            if resume is not None:
                if applied > resume:
                    raise Conflict(f"run {run.pk} is recovering from applied {resume}: a "
                                   f"replica at {applied} is of training it does again",
                                   state=locked.state, action="upload a replica")
                kept = kept.filter(applied__lte=resume)  # the others go with what it redoes
            newer = list(kept.filter(applied__gt=applied)
                         .order_by("-applied").values_list("applied", flat=True)[:KEEP])
            if len(newer) >= KEEP:
                raise InvalidInput("applied", f"is older than the {KEEP} replicas of layers "
                                              f"{first}..{last} kept (applied "
                                              f"{', '.join(map(str, newer))})")
            replica: WeightReplica
            replica, _ = WeightReplica.objects.update_or_create(
                run=run, first=first, last=last, applied=applied,
                defaults={"device": device.uid, "path": relative, "bytes": len(data),
                          "sha256": digest, "created_at": timezone.now()})
            os.replace(tmp, _absolute(relative))
            stale = list(kept.order_by("-applied").values_list("pk", "applied")[KEEP:])
            if locked.kind in MULTI_PIPELINE_KINDS:
                # a round's averaged model stays until the server has measured it (its
                # Celery task may come after later rounds' uploads, on a busy worker)
                measured = set(FaultEvent.objects.filter(run=run, kind="round_evaluated")
                               .values_list("detail__applied", flat=True))
                stale = [(pk, a) for pk, a in stale if a in measured]
            # each deleted row's file goes after the commit (replica_file_delete)
            WeightReplica.objects.filter(pk__in=[pk for pk, _ in stale]).delete()
    finally:
        tmp.unlink(missing_ok=True)
    log.info("run %s: replica of layers %s..%s at applied %s from %s (%s bytes)", run.pk,
             first, last, applied, device.uid, len(data))
    return replica


def replica_holdings(*, run: Run) -> list[dict[str, Any]]:
    """What the server holds for ``run``, in the holdings format of orchestrator.recovery."""
    rows = WeightReplica.objects.filter(run=run).order_by("first", "last", "applied")
    return [{"layers": [r.first, r.last], "applied": r.applied, "kind": "central"}
            for r in rows]


def _covering(rows: Iterable[WeightReplica], first: int, last: int, *, run: Run,
              applied: int) -> dict[int, list[int]]:
    """Which stored replica gives each layer of first..last: {replica id: [layers]}. Ranges of
    different stage layouts may overlap; each layer is taken from one file, the newest."""
    ordered = sorted(rows, key=lambda r: (r.created_at, r.pk), reverse=True)
    chosen: dict[int, list[int]] = {}
    for layer in range(first, last + 1):
        holder = next((r for r in ordered if r.first <= layer <= r.last), None)
        if holder is None:
            raise ReplicaMissing(run=run, layer=layer, applied=applied)
        chosen.setdefault(holder.pk, []).append(layer)
    return chosen


def replica_read(*, run: Run, first: int, last: int, applied: int) -> bytes:
    """Layers ``first``..``last`` of ``run`` at exactly ``applied`` as one safetensors blob,
    merged from the stored replicas (a new stage's range rarely matches an old one's);
    ReplicaMissing (404) naming the first layer no replica holds."""
    _check_range(first, last, applied)
    _check_model_layers(run, last)
    rows = {r.pk: r for r in WeightReplica.objects.filter(
        run=run, applied=applied, first__lte=last, last__gte=first)}
    tensors: dict[str, torch.Tensor] = {}
    for pk, layers in _covering(rows.values(), first, last, run=run, applied=applied).items():
        wanted = set(layers)
        try:
            with safe_open(str(_absolute(rows[pk].path)), framework="pt") as stored:
                for name in stored.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                    if tensor_layer(name) in wanted:
                        tensors[name] = stored.get_tensor(name)
        except (OSError, SafetensorError, ValueError) as exc:
            log.warning("run %s: replica %s (%s) is unreadable: %s", run.pk, pk,
                        rows[pk].path, exc)
            raise ReplicaMissing(run=run, layer=layers[0], applied=applied) from None
    metadata = {"run": str(run.pk), "first": str(first), "last": str(last),
                "applied": str(applied)}
    return safetensors_save(tensors, metadata=metadata)


def replica_file_delete(sender: type[WeightReplica], instance: WeightReplica,
                        **kwargs: Any) -> None:
    """A deleted replica's file goes once the deletion is committed (a rolled back deletion
    keeps its file); deleting a run deletes its replicas, so their files too."""
    path, run_id = instance.path, instance.run_id

    def unlink() -> None:
        if WeightReplica.objects.filter(path=path).exists():  # re-uploaded meanwhile
            return
        try:
            _absolute(path).unlink(missing_ok=True)
        except (OSError, ValueError) as exc:
            log.warning("replica file %s not deleted: %s", path, exc)
            return
        if not Run.objects.filter(pk=run_id).exists():  # the run was deleted
            with contextlib.suppress(OSError):
                replica_dir(run_id).rmdir()  # only when empty

    transaction.on_commit(unlink)


post_delete.connect(replica_file_delete, sender=WeightReplica, dispatch_uid="replica_file_delete")
