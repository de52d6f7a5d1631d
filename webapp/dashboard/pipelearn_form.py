"""Training PipeLearn on enrolled devices from the browser (``/runs/new/pipelearn/``): what the
form offers, its fields as the body of ``POST /api/runs/pipelearn/``, and the run created and
its planning queued in one transaction. The form validates with the API's own input
serializer and calls the same service, so the page and the API refuse the same input for the
same reason; each error is shown next to the form field it belongs to, a device's own P and N
next to its row."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.http import QueryDict
from rest_framework.fields import empty

from orchestrator.pipelearn_plan import METHODS
from orchestrator.protocol.stagespec import SHARD_SPLITS
from webapp.common.errors import flatten_errors
from webapp.dashboard.selectors import new_run_choices
from webapp.dashboard.services import (
    NON_FIELD,
    FormErrors,
    FormInvalid,
    form_field,
    form_number,
    form_run_create_and_plan,
)
from webapp.devices.selectors import model_num_layers
from webapp.runs.models import LR_MAX, Run
from webapp.runs.pipelearn_apis import PipelearnRunCreateApi
from webapp.runs.services.pipelearn import MAX_BATCH, pipelearn_run_create

Input = PipelearnRunCreateApi.PipelearnRunCreateInput
METHOD_DESCRIPTIONS = {
    "pipelearn": "each device's split point P and its N parallel micro-batches, chosen from "
                 "the time model so that device, link and server overlap",
    "sfl": "split federated learning: the same split points, one batch at a time (N = 1)",
    "fl": "federated learning: every device trains the whole model on its own data",
}
# a device row's P and N: the API's fields of an override, and what the row calls them
OVERRIDE_INPUTS = {"split": "P", "parallel_batches": "N"}
OVERRIDE_FIELD = re.compile(r"(split|parallel_batches)-(\d+)")
OVERRIDE_ERROR = re.compile(r"overrides\[(\d+)\](?:\.(\w+))?")
# API fields shown next to a form field of another name
FORM_FIELDS = {"algorithms": "methods"}
# the form's fields that show their errors; the others' (momentum, left at the API's default)
# go above the form, with the API's name for the field
SHOWN = {"name", "model_spec", "server", "clients", "devices", "methods", "batch_size",
         "batches", "epochs", "shard_split", "lr"}
NUMBERS: dict[str, type[int] | type[float]] = {
    "batch_size": int, "batches": int, "epochs": int, "lr": float}
# what the form says of a choice left empty: (form field, API field, reason)
EMPTY = (("server", "server", "choose one device as the server: it trains every device's "
                              "last layers"),
         ("clients", "clients", "tick at least one other device: each keeps its data and "
                                "trains the first layers"),
         ("methods", "algorithms", "tick at least one method: each plans the run once"))


def row_field(device: int) -> str:
    """The form field of a device row's errors (its P and N)."""
    return f"device-{device}"


def device_overrides(form: QueryDict) -> dict[int, dict[str, str]]:
    """The P and N typed on each device row (``split-<id>``, ``parallel_batches-<id>``), in
    the page's order; a row left empty is absent (the planner chooses its P and N)."""
    out: dict[int, dict[str, str]] = {}
    for key in form:
        if (m := OVERRIDE_FIELD.fullmatch(key)) and form[key].strip():
            out.setdefault(int(m.group(2)), {})[m.group(1)] = form[key].strip()
    return out


def pipelearn_form_data(form: QueryDict) -> dict[str, Any]:
    """The form's fields as the body of ``POST /api/runs/pipelearn/``: the server and the
    devices ticked (in the page's order), the methods ticked, each row's P and N as an
    override; an unchosen model spec or server is absent (the API says it is required), B
    left empty is the model spec's, another number left empty is refused as not a number."""
    data: dict[str, Any] = {
        "name": form.get("name", "").strip(),
        "clients": [form_number(v) for v in form.getlist("clients")],
        "algorithms": form.getlist("methods"),
        "overrides": [{"device": pk, **{k: form_number(v) for k, v in typed.items()}}
                      for pk, typed in device_overrides(form).items()]}
    for name in ("model_spec", "server", "batch_size"):
        if form.get(name, "").strip():
            data[name] = form_number(form[name])
    for name, kind in NUMBERS.items():
        if name in form and name != "batch_size":
            data[name] = form_number(form[name], kind)
    if "shard_split" in form:
        data["shard_split"] = form["shard_split"].strip()
    return data


def pipelearn_form_errors(errors: Iterable[dict[str, str]], *, rows: list[int]) -> FormErrors:
    """The API's errors by form field: ``overrides[i].split`` on the row of the i-th override
    (of the devices ``rows``), said as P's; ``clients[1]`` on the devices, ``algorithms[0]``
    on the methods; a field the form does not show above it, with the API's name."""
    out: FormErrors = {}
    for error in errors:
        path, reason = error["field"], error["reason"]
        row = OVERRIDE_ERROR.match(path)
        if row and int(row.group(1)) < len(rows):
            field = row_field(rows[int(row.group(1))])
            if row.group(2) in OVERRIDE_INPUTS:
                reason = f"{OVERRIDE_INPUTS[row.group(2)]}: {reason}"
        else:
            field = FORM_FIELDS.get(form_field(path), form_field(path))
            if field not in (*SHOWN, NON_FIELD):
                field, reason = NON_FIELD, f"{path}: {reason}"
        out.setdefault(field, []).append(reason)
    return out


def _row_errors(data: dict[str, Any], typed: dict[int, dict[str, str]]) -> FormErrors:
    """A row's P and N are those of a device of the run, and both or neither are typed."""
    clients = set(data["clients"])
    out: FormErrors = {}
    for pk, given in typed.items():
        if pk not in clients:
            out[row_field(pk)] = ["P and N are a device's of the run: tick it as a device, or "
                                  "clear them"]
        elif len(given) < len(OVERRIDE_INPUTS):
            out[row_field(pk)] = ["give both P and N, or leave both empty for the planner to "
                                  "choose"]
    return out


def _validated(data: dict[str, Any], typed: dict[int, dict[str, str]]) -> dict[str, Any]:
    """The API serializer's data, or FormInvalid with every field it refused (a choice left
    empty and a row's P and N that cannot be an override said in the form's words)."""
    serializer = Input(data=data)
    errors = {} if serializer.is_valid() else pipelearn_form_errors(
        flatten_errors(serializer.errors), rows=list(typed))
    errors.update(_row_errors(data, typed))
    for field, api_field, reason in EMPTY:
        if not data.get(api_field):
            errors[field] = [reason]
    if errors:
        raise FormInvalid(errors)
    return dict(serializer.validated_data)


def pipelearn_run_create_and_plan(*, form: QueryDict, created_by: AbstractBaseUser) -> Run:
    """Create a PipeLearn run from the form and queue its planning (one transaction), or
    FormInvalid naming each bad field. The server and every device must have profiled the
    model: each method is planned from their measured layer times."""
    typed = device_overrides(form)
    data = _validated(pipelearn_form_data(form), typed)
    return form_run_create_and_plan(
        model_spec=data["model_spec"], devices=[data["server"], *data["clients"]],
        errors=lambda errors: pipelearn_form_errors(errors, rows=list(typed)),
        create=lambda: pipelearn_run_create(**data, created_by=created_by))


def pipelearn_form_context(*, form: QueryDict | None, errors: FormErrors) -> dict[str, Any]:
    """What the page shows: the model specs devices profiled (each with its layers and B),
    the devices that can train (each as chosen: the server, a device or left out, its P and N
    as typed, its errors), the methods, the API's defaults and limits, and what was typed."""
    choices = new_run_choices()
    spec = form.get("model_spec", "") if form is not None else ""
    server = form.get("server", "") if form is not None else ""
    clients = set(form.getlist("clients")) if form is not None else set()
    typed = device_overrides(form) if form is not None else {}
    names = {s.pk: f"{s.model}/{s.dataset}" for s in choices["specs"]}
    devices = [{"device": d, "server": server == str(d.pk), "client": str(d.pk) in clients,
                "split": typed.get(d.pk, {}).get("split", ""),
                "parallel_batches": typed.get(d.pk, {}).get("parallel_batches", ""),
                "errors": errors.get(row_field(d.pk), []),
                "profiled": [names[pk] for pk in c["specs"] if pk in names],
                "unprofiled": bool(spec) and spec not in {str(pk) for pk in c["specs"]}}
               for c in choices["devices"] for d in [c["device"]]]
    defaults = {name: f.default for name, f in Input().fields.items() if f.default is not empty}
    return {
        "specs": [{"spec": s, "layers": model_num_layers(model_spec=s)}
                  for s in choices["specs"]],
        "devices": devices, "form": form, "errors": errors,
        "methods": [{"name": m, "description": METHOD_DESCRIPTIONS[m]} for m in METHODS],
        "chosen_methods": form.getlist("methods") if form is not None else list(METHODS),
        "defaults": defaults, "shard_splits": SHARD_SPLITS,
        "limits": {"lr": LR_MAX, "batch_size": MAX_BATCH}}
