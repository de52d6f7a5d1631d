"""Training split learning on enrolled devices from the browser (``/split/train/``): what the
form offers, its fields as the body of ``POST /api/runs/split/``, and the run created and its
planning queued in one transaction. The form validates with the API's own input serializer
and calls the same service, so the page and the API refuse the same input for the same
reason; each error is shown next to the form field it belongs to."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.http import QueryDict
from rest_framework.fields import empty

from orchestrator.protocol.stagespec import SHARD_SPLITS
from orchestrator.sl.settings import MAX_TIME_LIMIT_S
from orchestrator.sl.solve import METHODS
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
from webapp.runs.services.split import split_run_create
from webapp.runs.split_apis import SplitRunCreateApi
from webapp.split.selectors import DEFAULT_METHODS, method_choices

ROLES = ("client", "helper")  # a device's radio: one of these, or "out" (not in the run)
ROLE_FIELD = re.compile(r"role-(\d+)")
# API fields shown next to a form field of another name (the cuts by their own names)
FORM_FIELDS = {"algorithms": "methods"}
# the form's fields that show their errors; the others' (settings the form leaves at the API's
# default) go above the form, with the API's name for the field
SHOWN = {"name", "model_spec", "devices", "clients", "helpers", "methods", "sigma1", "sigma2",
         "epochs", "batches", "shard_split", "time_limit_s", "lr"}
NUMBERS: dict[str, type[int] | type[float]] = {
    "sigma1": int, "sigma2": int, "batches": int, "epochs": int, "time_limit_s": float,
    "lr": float}
# what the form says of a list left empty: (form field, API field, reason)
EMPTY = (("clients", "clients", "choose at least one device as a client (it trains part-1 and "
                                "part-3 on its own data)"),
         ("helpers", "helpers", "choose at least one device as a helper (it trains part-2 for "
                                "the clients a plan gives it)"),
         ("methods", "algorithms", "tick at least one method: each plans the run once"))
CUTS_AT_FIRST = {"sigma1": 0, "sigma2": 1}  # what the form shows before a model is chosen


def train_form_field(path: str) -> str:
    """The train form's field of an API field path: ``cuts.sigma2`` -> ``sigma2``,
    ``helpers[0]`` -> ``helpers``, ``algorithms[1]`` -> ``methods``."""
    head = form_field(path.removeprefix("cuts."))
    return FORM_FIELDS.get(head, head)


def train_form_errors(errors: Iterable[dict[str, str]]) -> FormErrors:
    out: FormErrors = {}
    for error in errors:
        field, reason = train_form_field(error["field"]), error["reason"]
        if field not in (*SHOWN, NON_FIELD):
            field, reason = NON_FIELD, f"{error['field']}: {reason}"
        out.setdefault(field, []).append(reason)
    return out


def device_roles(form: QueryDict) -> dict[int, list[str]]:
    """Each device's roles as the form sent them (``role-<id>``), in the page's order."""
    return {int(m.group(1)): [r for r in form.getlist(key) if r in ROLES]
            for key in form if (m := ROLE_FIELD.fullmatch(key))}


def split_train_form_data(form: QueryDict) -> dict[str, Any]:
    """The train form's fields as the body of ``POST /api/runs/split/``: the devices chosen
    as clients and as helpers (in the page's order), the methods ticked; an unchosen model
    spec is absent (the API says it is required), a number left empty is refused as not a
    number, a setting not sent takes the API's default."""
    roles = device_roles(form)
    data: dict[str, Any] = {
        "name": form.get("name", "").strip(),
        "clients": [pk for pk, chosen in roles.items() if "client" in chosen],
        "helpers": [pk for pk, chosen in roles.items() if "helper" in chosen],
        "algorithms": form.getlist("methods")}
    if form.get("model_spec", "").strip():
        data["model_spec"] = form_number(form["model_spec"], int)
    for name, kind in NUMBERS.items():
        if name in form:
            data[name] = form_number(form[name], kind)
    if "shard_split" in form:
        data["shard_split"] = form["shard_split"].strip()
    return data


def _validated(data: dict[str, Any]) -> dict[str, Any]:
    """The API serializer's data, or FormInvalid with every field it refused (a list left
    empty said in the form's words)."""
    serializer = SplitRunCreateApi.SplitRunCreateInput(data=data)
    errors = {} if serializer.is_valid() else train_form_errors(
        flatten_errors(serializer.errors))
    for field, api_field, reason in EMPTY:
        if not data[api_field]:
            errors[field] = [reason]
    if errors:
        raise FormInvalid(errors)
    return dict(serializer.validated_data)


def split_run_create_and_plan(*, form: QueryDict, created_by: AbstractBaseUser) -> Run:
    """Create a split run from the train form and queue its planning (one transaction), or
    FormInvalid naming each bad field. Every device must have profiled the model: a method's
    study is built from the devices' measured layer times."""
    data = _validated(split_train_form_data(form))
    return form_run_create_and_plan(
        model_spec=data["model_spec"], devices=[*data["clients"], *data["helpers"]],
        errors=train_form_errors,
        create=lambda: split_run_create(**data, created_by=created_by))


def _chosen_methods(form: QueryDict | None, preset: QueryDict) -> list[str]:
    """The methods ticked: as sent; on a first visit those of ``?methods=`` (repeated or
    comma-separated, e.g. from a study's page), else the studies page's defaults."""
    if form is not None:
        return form.getlist("methods")
    asked = [m for raw in preset.getlist("methods") for m in raw.split(",") if m in METHODS]
    return asked or list(DEFAULT_METHODS)


def split_train_context(*, form: QueryDict | None, preset: QueryDict) -> dict[str, Any]:
    """What the train page shows: the model specs devices profiled (each with its layers),
    the devices that can train (each with its role as chosen), the methods, the API's
    defaults and the limits, and what was typed."""
    choices = new_run_choices()
    roles = device_roles(form) if form is not None else {}
    spec = form.get("model_spec", "") if form is not None else ""
    specs = [{"spec": s, "layers": model_num_layers(model_spec=s)} for s in choices["specs"]]
    names = {s.pk: f"{s.model}/{s.dataset}" for s in choices["specs"]}
    devices = [{"device": c["device"], "role": (roles.get(c["device"].pk) or ["out"])[0],
                "profiled": [names[pk] for pk in c["specs"] if pk in names],
                "unprofiled": bool(spec) and spec not in {str(pk) for pk in c["specs"]}}
               for c in choices["devices"]]
    defaults = {name: f.default for name, f in
                SplitRunCreateApi.SplitRunCreateInput().fields.items() if f.default is not empty}
    return {"specs": specs, "devices": devices, "form": form, "methods": method_choices(),
            "chosen_methods": _chosen_methods(form, preset),
            "defaults": {**CUTS_AT_FIRST, **defaults}, "shard_splits": SHARD_SPLITS,
            "limits": {"time_limit_s": MAX_TIME_LIMIT_S, "lr": LR_MAX}}
