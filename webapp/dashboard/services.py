"""Writes the dashboard's forms make. They validate with the REST API's own input serializers
and call the same services, so a page and the API refuse the same input for the same reason;
:func:`form_errors` turns the API's field paths (``devices[1]``, ``algorithms[0]``) into the
form field each error belongs next to."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.http import QueryDict
from rest_framework import serializers

from webapp.common.errors import BODY, flatten_errors
from webapp.common.exceptions import InvalidInput
from webapp.dashboard.selectors import devices_without_profile
from webapp.devices import services as device_services
from webapp.devices.apis import DeviceDetailApi, TokenListCreateApi
from webapp.devices.models import Device, ModelSpec
from webapp.runs import services as run_services
from webapp.runs.apis import RunListCreateApi
from webapp.runs.models import Run

FormErrors = dict[str, list[str]]
NON_FIELD = "form"


class FormInvalid(Exception):
    """A form's input was refused; ``errors`` maps each form field to its reasons."""

    def __init__(self, errors: FormErrors) -> None:
        super().__init__("; ".join(f"{f}: {r}" for f, rs in errors.items() for r in rs))
        self.errors = errors


def form_field(path: str) -> str:
    """The form field an API field path belongs to: ``devices[1]`` -> ``devices``,
    ``profile.layers[0]`` -> ``profile``, ``body`` -> the form as a whole."""
    head = path.split(".", 1)[0].split("[", 1)[0]
    return NON_FIELD if head in ("", BODY) else head


def form_errors(errors: list[dict[str, str]]) -> FormErrors:
    out: FormErrors = {}
    for error in errors:
        out.setdefault(form_field(error["field"]), []).append(error["reason"])
    return out


def _validated(serializer_class: type[serializers.Serializer], data: dict[str, Any]
               ) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    if not serializer.is_valid():
        raise FormInvalid(form_errors(flatten_errors(serializer.errors)))
    return dict(serializer.validated_data)


def form_number(raw: str, kind: type[int] | type[float] = int) -> int | float | str:
    """A form's number as the JSON API would get it: an integer (or with ``kind=float`` a
    decimal number), or the text as typed (which the API's serializer then refuses, saying
    what it must be)."""
    text = raw.strip()
    try:
        return kind(text)
    except ValueError:
        return text


def _present(form: QueryDict, name: str) -> bool:
    return bool(form.get(name, "").strip())


def run_form_data(form: QueryDict) -> dict[str, Any]:
    """The new-run form's fields as the body of ``POST /api/runs/``: an unchosen model spec or
    schedule is absent (the API says it is required, or takes its default); a number field
    left empty is refused as not a number; vertical sync is true when its box is ticked."""
    data: dict[str, Any] = {"name": form.get("name", "").strip(),
                            "devices": [form_number(v) for v in form.getlist("devices")],
                            "algorithms": form.getlist("algorithms")}
    for name in ("microbatches", "batches", "aggregate_every", "chain_every", "global_every",
                 "repartition_after", "repartition_every"):
        if name in form:
            data[name] = form_number(form[name])
    # a checkbox: the form sends "off" (a hidden field) and, when it is ticked, "on" after it
    if "vertical_sync" in form:
        data["vertical_sync"] = "on" in form.getlist("vertical_sync")
    for name in ("lr", "momentum"):
        if name in form:
            data[name] = form_number(form[name], float)
    if _present(form, "model_spec"):
        data["model_spec"] = form_number(form["model_spec"])
    for name in ("schedule", "recovery_policy"):
        if _present(form, name):
            data[name] = form[name].strip()
    return data


def form_run_create_and_plan(*, model_spec: ModelSpec, devices: Sequence[Device],
                             create: Callable[[], Run],
                             errors: Callable[[list[dict[str, str]]], FormErrors]) -> Run:
    """What every run form does once its input is valid: refuse (FormInvalid under
    "devices") when some of ``devices`` have not profiled ``model_spec`` (planning needs their
    layer times), else ``create`` the run and queue its planning in one transaction; a
    service's refusal becomes FormInvalid through ``errors`` (the form's field names)."""
    chosen = list(dict.fromkeys(devices))
    missing = [chosen[k] for k in devices_without_profile(model_spec=model_spec,
                                                          devices=chosen)]
    if missing:
        it, has = ("it", "has") if len(missing) == 1 else ("them", "have")
        raise FormInvalid({"devices": [
            f"{', '.join(d.name for d in missing)} {has} not profiled {model_spec}: "
            f"have {it} profile the model first, or leave {it} out of the run"]})
    try:
        with transaction.atomic():
            run = create()
            run_services.run_plan(run=run)
    except InvalidInput as exc:
        raise FormInvalid(errors([e.to_json() for e in exc.errors])) from None
    return run


def run_create_and_plan(*, form: QueryDict, created_by: AbstractBaseUser) -> Run:
    """Create a run from the new-run form and queue its planning, or FormInvalid naming each
    bad field. Every device must have profiled the model (planning needs its layer times)."""
    data = _validated(RunListCreateApi.RunCreateInput, run_form_data(form))
    return form_run_create_and_plan(
        model_spec=data["model_spec"], devices=data["devices"], errors=form_errors,
        create=lambda: run_services.run_create(**data, created_by=created_by))


def device_rename_from_form(*, device: Device, form: QueryDict) -> Device:
    data = _validated(DeviceDetailApi.DeviceRenameInput, {"name": form.get("name", "").strip()})
    return device_services.device_rename(device=device, **data)


def enrolment_create(*, form: QueryDict, created_by: AbstractBaseUser, server_url: str
                     ) -> dict[str, Any]:
    """A new enrolment token for the Devices page's "Add device" panel, with the exact
    commands to run on the device (the secret is shown this once)."""
    name = form.get("name", "").strip()
    body: dict[str, Any] = {"label": name}
    if _present(form, "max_uses"):
        body["max_uses"] = form_number(form["max_uses"])
    data = _validated(TokenListCreateApi.TokenCreateInput, body)
    token, secret = device_services.enrollment_token_create(created_by=created_by, **data)
    return {"token": token, "secret": secret, "name": name,
            "commands": enrolment_commands(server_url=server_url, secret=secret, name=name)}


def enrolment_commands(*, server_url: str, secret: str, name: str = "") -> list[str]:
    enrol = f"python -m agent enrol --server {shlex.quote(server_url)} --token {secret}"
    if name:
        enrol += f" --name {shlex.quote(name)}"
    return ["pip install -r requirements-agent.txt", enrol, "python -m agent run"]
