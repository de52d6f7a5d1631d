"""Writes on split-learning studies: creating one (validated; one pending schedule per method,
each computed by a Celery task queued after commit), computing a schedule with
:func:`orchestrator.sl.solve.solve`, queueing unfinished schedules again, and creating a study
from the page's form (the API's input serializer, then the same service)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from functools import partial
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.files.uploadedfile import UploadedFile
from django.db import DatabaseError, transaction
from django.http import QueryDict
from django.utils import timezone
from django.utils.datastructures import MultiValueDict

from orchestrator.errors import FormatError, PlanningError
from orchestrator.sl.formats import Instance, parse_instance
from orchestrator.sl.solve import DEFAULT_TIME_LIMIT_S, METHODS, solve
from webapp.common.errors import flatten_errors
from webapp.common.exceptions import InvalidInput, distinct_choices
from webapp.dashboard.services import FormErrors, FormInvalid, form_field, form_number
from webapp.split import selectors
from webapp.split.models import SplitSchedule, SplitStudy
from webapp.split.serializers import SplitStudyCreateInput

log = logging.getLogger(__name__)

MAX_TIME_LIMIT_S = 120.0
MAX_SWITCH_SLOTS = 100
MAX_SEED = 2**31 - 1
MAX_CLIENTS = 200
MAX_HELPERS = 50
# the methods work slot by slot: every client's longest chain of steps, summed, bounds the slots
# a schedule may need
MAX_HORIZON_SLOTS = 100_000
MAX_UPLOAD_BYTES = 2**20
UPLOADED = "uploaded"


# --------------------------------------------------------------------------- creation


def _check_methods(methods: Sequence[str]) -> list[str]:
    return distinct_choices(methods, METHODS, field="methods", what="method")


def _check_settings(*, name: str, time_limit_s: float, switch_slots: int, seed: int) -> None:
    if not name.strip():
        raise InvalidInput("name", "must not be blank")
    if len(name) > 100:
        raise InvalidInput("name", "must have at most 100 characters")
    if not 0 < time_limit_s <= MAX_TIME_LIMIT_S:
        raise InvalidInput("time_limit_s", f"must be more than 0 and at most "
                                           f"{MAX_TIME_LIMIT_S:g} seconds")
    if not 0 <= switch_slots <= MAX_SWITCH_SLOTS:
        raise InvalidInput("switch_slots", f"must be between 0 and {MAX_SWITCH_SLOTS}")
    if not 0 <= seed <= MAX_SEED:
        raise InvalidInput("seed", f"must be between 0 and {MAX_SEED}")


def _shared_instance(file: str, index: int | None) -> Instance:
    known = selectors.shared_instance_files()
    if file not in known:
        raise InvalidInput("file", f"{file!r} is not a shared instance file; known: "
                                   f"{', '.join(known)}")
    if index is None:
        raise InvalidInput("index", f"is required with file: which instance of {file}")
    instances = selectors.shared_instances(file)
    if not 0 <= index < len(instances):
        raise InvalidInput("index", f"{file} has {len(instances)} instances, so the index must "
                                    f"be between 0 and {len(instances) - 1}")
    return instances[index]


def _uploaded_instance(raw: Any) -> Instance:
    """An instance document, its errors named by their JSON path (``instance.p[3][1]``)."""
    try:
        return parse_instance(raw, file="instance")
    except FormatError as exc:
        raise InvalidInput(f"instance.{exc.field}" if exc.field else "instance",
                           exc.reason) from None


def _where(uploaded: bool, inst: Instance, path: str) -> tuple[str, str]:
    """The field an error about ``path`` of the instance names, and how its reason starts."""
    if uploaded:
        return f"instance.{path}", ""
    return "index", f"instance {inst.name}: {path} "


def _check_size(inst: Instance, *, uploaded: bool) -> None:
    for path, count, most in (("clients", inst.clients, MAX_CLIENTS),
                              ("helpers", inst.helpers, MAX_HELPERS)):
        if count > most:
            field, lead = _where(uploaded, inst, path)
            raise InvalidInput(field, f"{lead}is {count}; a study takes at most {most}")
    horizon = sum(max(inst.chain_slots(j, i) for i in range(inst.helpers))
                  for j in range(inst.clients))
    if horizon > MAX_HORIZON_SLOTS:
        field = "instance" if uploaded else "index"
        raise InvalidInput(field, f"the clients' longest chains add up to {horizon} time slots; "
                                  f"a study takes at most {MAX_HORIZON_SLOTS} (use longer slots)")


def _check_memory(inst: Instance, *, uploaded: bool) -> None:
    """The obvious memory shortfalls (a client no helper can hold, more demand than capacity);
    the methods find the subtle ones and say so."""
    largest = max(inst.capacity)
    unit = inst.memory_unit
    for j, need in enumerate(inst.demand):
        if need > largest:
            field, lead = _where(uploaded, inst, f"demand[{j}]")
            raise InvalidInput(field, f"{lead}is {need:g} {unit} but the largest helper has "
                                      f"{largest:g} {unit}")
    if sum(inst.demand) > sum(inst.capacity):
        field, lead = _where(uploaded, inst, "demand")
        raise InvalidInput(field, f"{lead}adds up to {sum(inst.demand):g} {unit} but the helpers "
                                  f"have {sum(inst.capacity):g} {unit} in all")


def _study_instance(instance: Any, file: str | None, index: int | None
                    ) -> tuple[Instance, str]:
    """The instance to study and where it came from."""
    if instance is not None and (file is not None or index is not None):
        raise InvalidInput("instance", "give an instance document or a shared file and index, "
                                       "not both")
    if instance is not None:
        inst, source = _uploaded_instance(instance), UPLOADED
    elif file is not None:
        inst, source = _shared_instance(file, index), f"{file}#{index}"
    elif index is not None:
        raise InvalidInput("file", "is required with index: which shared instance file")
    else:
        raise InvalidInput("instance", "give an instance document, or a shared file and the "
                                       "index of one of its instances")
    _check_size(inst, uploaded=instance is not None)
    _check_memory(inst, uploaded=instance is not None)
    return inst, source


@transaction.atomic
def split_study_create(*, name: str, methods: Sequence[str], instance: Any = None,
                       file: str | None = None, index: int | None = None,
                       time_limit_s: float = DEFAULT_TIME_LIMIT_S, switch_slots: int = 0,
                       seed: int = 0, created_by: AbstractBaseUser | None = None) -> SplitStudy:
    """A study of one instance (an instance document, or ``index`` of the shared ``file``) with
    one pending schedule per method, each queued for a worker once the study is committed."""
    _check_settings(name=name, time_limit_s=time_limit_s, switch_slots=switch_slots, seed=seed)
    chosen = _check_methods(methods)
    inst, source = _study_instance(instance, file, index)
    document = inst.to_json()
    study = SplitStudy.objects.create(
        name=name.strip(), instance=document, source=source, clients=inst.clients,
        helpers=inst.helpers, time_limit_s=time_limit_s, switch_slots=switch_slots, seed=seed,
        created_by=created_by)
    schedules = SplitSchedule.objects.bulk_create(SplitSchedule(study=study, method=m)
                                                  for m in chosen)
    from webapp.split.tasks import split_schedule_compute  # the task module imports this one

    for schedule in schedules:
        transaction.on_commit(partial(split_schedule_compute.delay, schedule.pk))
    return study


# --------------------------------------------------------------------------- computing


def _schedule_claim(schedule_id: int) -> SplitSchedule | None:
    """Mark a schedule running (again, if a worker died on it); None if it is computed."""
    with transaction.atomic():
        row = (SplitSchedule.objects.select_for_update().select_related("study")
               .filter(pk=schedule_id).first())
        if row is None or row.status not in selectors.UNFINISHED:
            return None
        row.status = SplitSchedule.Status.RUNNING
        row.started_at = timezone.now()
        row.save(update_fields=["status", "started_at"])
        return row


def _solved(row: SplitSchedule) -> dict[str, Any]:
    study = row.study
    schedule = solve(instance=selectors.split_study_instance(study=study), method=row.method,
                     time_limit_s=study.time_limit_s, seed=study.seed,
                     switch_slots=study.switch_slots)
    return {"schedule": schedule.to_json(), "makespan": schedule.makespan,
            "solver_s": schedule.solver_s, "lower_bound": schedule.lower_bound, "error": ""}


def split_schedule_compute(*, schedule_id: int) -> dict[str, Any]:
    """Compute one method's schedule (the body of the Celery task) and store it, or the reason
    it failed. Idempotent: a schedule already computed is left alone, and one whose worker died
    is computed again."""
    row = _schedule_claim(schedule_id)
    if row is None:
        return {"schedule": schedule_id, "status": "skipped"}
    try:
        fields = _solved(row)
        status = SplitSchedule.Status.DONE
    except (PlanningError, FormatError, ValueError) as exc:
        fields, status = {"error": str(exc)}, SplitSchedule.Status.FAILED
    except DatabaseError:
        raise  # the task retries
    except Exception as exc:  # a bug in a method must not leave the schedule running forever
        log.exception("split schedule %s (%s) crashed", schedule_id, row.method)
        fields = {"error": f"the method crashed: {type(exc).__name__}: {exc}"}
        status = SplitSchedule.Status.FAILED
    SplitSchedule.objects.filter(pk=schedule_id).update(status=status,
                                                        finished_at=timezone.now(), **fields)
    return {"schedule": schedule_id, "status": status}


def split_schedules_requeue_unfinished() -> list[int]:
    """Queue again every schedule still pending or running (for the embedded topology, whose
    filesystem broker forgets a message its killed worker had taken; computing twice is
    harmless)."""
    from webapp.split.tasks import split_schedule_compute

    ids = list(SplitSchedule.objects.filter(status__in=selectors.UNFINISHED)
               .values_list("pk", flat=True))
    for pk in ids:
        split_schedule_compute.delay(pk)
    return ids


# --------------------------------------------------------------------------- the page's form

# API fields whose errors the form shows next to another of its fields
FORM_FIELDS = {"file": "instance", "index": "instance"}


def _form_errors(errors: list[dict[str, str]]) -> FormErrors:
    """API errors under the form's fields; a path inside a field stays in the reason
    (``instance.p[0][1]: must be at least 1``)."""
    out: FormErrors = {}
    for error in errors:
        head = form_field(error["field"])
        reason = error["reason"] if error["field"] == head else \
            f"{error['field']}: {error['reason']}"
        out.setdefault(FORM_FIELDS.get(head, head), []).append(reason)
    return out


def _upload(upload: UploadedFile | None) -> Any:
    if upload is None:
        raise FormInvalid({"instance": ["choose a JSON file to upload, or a shared instance"]})
    if upload.size is not None and upload.size > MAX_UPLOAD_BYTES:
        raise FormInvalid({"instance": [f"the file is larger than {MAX_UPLOAD_BYTES // 2**20} "
                                        "MiB"]})
    try:
        return json.loads(upload.read().decode("utf-8"))
    except UnicodeDecodeError:
        raise FormInvalid({"instance": ["the file is not UTF-8 text"]}) from None
    except json.JSONDecodeError as exc:
        raise FormInvalid({"instance": [f"the file is not valid JSON: {exc.msg} at line "
                                        f"{exc.lineno} column {exc.colno}"]}) from None


def split_form_data(form: QueryDict, files: MultiValueDict[str, UploadedFile]
                    ) -> tuple[dict[str, Any], FormErrors]:
    """The form's fields as the body of ``POST /api/split/studies/``, and the errors found
    in the instance part already (no shared instance chosen, an unreadable upload)."""
    data: dict[str, Any] = {"name": form.get("name", "").strip(),
                            "methods": form.getlist("methods")}
    for name, kind in (("time_limit_s", float), ("switch_slots", int), ("seed", int)):
        if name in form:
            data[name] = form_number(form[name], kind)
    errors: FormErrors = {}
    try:
        if form.get("source") == "upload":
            data["instance"] = _upload(files.get("upload"))
        elif form.get("shared", "").strip():
            file, _, index = form["shared"].strip().rpartition("#")
            data["file"], data["index"] = file, form_number(index, int)
        else:
            raise FormInvalid({"instance": ["choose a shared instance, or upload one"]})
    except FormInvalid as exc:
        errors = exc.errors
    return data, errors


def split_study_create_from_form(*, form: QueryDict, files: MultiValueDict[str, UploadedFile],
                                 created_by: AbstractBaseUser) -> SplitStudy:
    """Create a study from the split-learning page's form, or FormInvalid naming each bad
    field."""
    data, errors = split_form_data(form, files)
    serializer = SplitStudyCreateInput(data=data)
    if not serializer.is_valid():
        errors = {**_form_errors(flatten_errors(serializer.errors)), **errors}
    if errors:
        raise FormInvalid(errors)
    try:
        return split_study_create(**serializer.validated_data, created_by=created_by)
    except InvalidInput as exc:
        raise FormInvalid(_form_errors([e.to_json() for e in exc.errors])) from None
