"""Writes on devices: enrolment tokens, enrolment, renaming and retiring, heartbeats, model specs
and uploaded layer profiles."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from orchestrator.capacity import FixedCostFigures, fixed_costs_blended
from orchestrator.errors import FormatError
from orchestrator.formats import ModelProfile, parse_profile
from orchestrator.protocol import (
    Command,
    EmulateCommand,
    ExitCommand,
    MeasureCommand,
    ProfileCommand,
)
from webapp.common.exceptions import Conflict, InvalidInput
from webapp.common.secrets import secret_digest, secret_hash, secret_new
from webapp.devices.commands import device_command_send, device_group
from webapp.devices.events import device_event_send
from webapp.devices.models import Device, DeviceLink, EnrollmentToken, LayerProfile, ModelSpec
from webapp.devices.selectors import MAX_PROFILE_LAYERS, model_num_layers

TOKEN_PREFIX = "ept"
KEY_PREFIX = "edk"
# the close code of a retired device's control connection (4000 + HTTP 403: its key no longer
# opens anything); the gateway consumer closes with the code the message carries
CLOSE_RETIRED = 4003


def enrollment_token_create(*, created_by: AbstractBaseUser | None, label: str = "",
                            max_uses: int = 1, expires_in_s: int | None = None
                            ) -> tuple[EnrollmentToken, str]:
    """A new enrolment token and its secret (returned once; only its digest is stored)."""
    secret = secret_new(TOKEN_PREFIX)
    ttl = settings.ENROLLMENT_TOKEN_TTL_S if expires_in_s is None else expires_in_s
    now = timezone.now()
    token = EnrollmentToken.objects.create(
        label=label, prefix=secret[:10], token_digest=secret_digest(secret),
        created_by=created_by, created_at=now, expires_at=now + timedelta(seconds=ttl),
        max_uses=max_uses)
    return token, secret


def enrollment_token_revoke(*, token: EnrollmentToken) -> EnrollmentToken:
    """Revoke a token (revoking twice keeps the first time)."""
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


def _new_uid(name: str) -> str:
    base = slugify(name)[:40].strip("-") or "device"
    while True:
        uid = f"{base}-{secrets.token_hex(3)}"
        if not Device.objects.filter(uid=uid).exists():
            return uid


@transaction.atomic
def device_enrol(*, token: str, name: str, memory_bytes: int, bandwidth_bps: float,
                 latency_s: float = 0.0, uplink_bps: float | None = None,
                 downlink_bps: float | None = None, speed: float = 1.0,
                 hardware: dict[str, Any] | None = None) -> tuple[Device, str]:
    """Enrol a device with an enrolment token; returns the device and its key (shown once,
    stored as a salted hash)."""
    found = (EnrollmentToken.objects.select_for_update()
             .filter(token_digest=secret_digest(token)).first())
    if found is None:
        raise InvalidInput("token", "is not a valid enrolment token")
    refusal = found.refusal(timezone.now())
    if refusal:
        raise InvalidInput("token", refusal)
    found.uses += 1
    found.save(update_fields=["uses"])
    key = secret_new(KEY_PREFIX)
    device = Device.objects.create(
        uid=_new_uid(name), name=name, status=Device.Status.ONLINE,
        last_heartbeat_at=timezone.now(), hardware=hardware or {}, speed=speed,
        memory_bytes=memory_bytes, bandwidth_bps=bandwidth_bps, latency_s=latency_s,
        uplink_bps=uplink_bps, downlink_bps=downlink_bps, key_hash=secret_hash(key),
        enrollment_token=found)
    device_event_send(device)
    return device, key


def device_rename(*, device: Device, name: str) -> Device:
    device.name = name
    device.save(update_fields=["name"])
    device_event_send(device)
    return device


def _connection_close(uid: str, *, code: int, reason: str) -> None:
    """Have the gateway close the control connection(s) of device ``uid``: every one in its
    Channels group (webapp.gateway.consumers.AgentConsumer.agent_close)."""
    async_to_sync(get_channel_layer().group_send)(
        device_group(uid), {"type": "agent.close", "code": code, "reason": reason})


def device_retire(*, device: Device) -> Device:
    """Take a device out of service: its key stops working, new runs cannot use it, and its
    agent's control connection is closed (code CLOSE_RETIRED) once this commits; the runs it
    trained in recover without it, as after any disconnection. Retiring again closes any
    connection again."""
    if device.status != Device.Status.RETIRED:
        device.status = Device.Status.RETIRED
        device.retired_at = timezone.now()
        device.key_hash = ""
        device.save(update_fields=["status", "retired_at", "key_hash"])
        device_event_send(device)
    transaction.on_commit(partial(_connection_close, device.uid, code=CLOSE_RETIRED,
                                  reason="device retired"))
    return device


def device_heartbeat(*, device: Device, status: str) -> Device:
    """A sign of life from the agent, saying whether it is idle (online) or training (busy)."""
    device.status = status
    device.last_heartbeat_at = timezone.now()
    device.save(update_fields=["status", "last_heartbeat_at"])
    device_event_send(device)
    return device


@transaction.atomic
def profile_costs_measured(*, device: Device, model_spec: ModelSpec, overhead_s: float,
                           message_s: float | None = None,
                           pass_overhead_s: float | None = None) -> bool:
    """What a micro-batch of ``model_spec`` cost a stage on ``device`` beyond its layers and
    its sends (``pass_overhead_s`` of it inside the passes), and what a send cost, as a stage
    it just ran measured them: blended into the figures kept with the device's profile of the
    model (orchestrator.capacity.fixed_costs_blended), for the plans made from now on (a run
    keeps the figures it was planned with, RunDevice, so that its prediction is not fitted to
    its own measurement). False without a profile."""
    profile = (LayerProfile.objects.select_for_update()
               .filter(device=device, model_spec=model_spec).first())
    if profile is None:
        return False
    kept = None if profile.overhead_s is None else FixedCostFigures(
        overhead_s=profile.overhead_s, pass_overhead_s=profile.pass_overhead_s,
        message_s=profile.message_s)
    blended = fixed_costs_blended(kept, FixedCostFigures(
        overhead_s=overhead_s, pass_overhead_s=pass_overhead_s, message_s=message_s))
    profile.overhead_s = blended.overhead_s
    profile.pass_overhead_s = blended.pass_overhead_s
    profile.message_s = blended.message_s
    profile.save(update_fields=["overhead_s", "pass_overhead_s", "message_s"])
    return True


def devices_mark_offline(*, older_than_s: float,
                         on_offline: Callable[[Device], object] | None = None) -> int:
    """Mark offline the online or busy devices silent for ``older_than_s``; returns how many.
    ``on_offline`` is called for each after the change is committed (the runs they train
    recover without them)."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    with transaction.atomic():
        silent = list(Device.objects.select_for_update()
                      .filter(status__in=[Device.Status.ONLINE, Device.Status.BUSY])
                      .exclude(last_heartbeat_at__gte=cutoff))
        for device in silent:
            device.status = Device.Status.OFFLINE
        Device.objects.bulk_update(silent, ["status"])
        for device in silent:
            device_event_send(device)
    if on_offline is not None:
        for device in silent:
            on_offline(device)
    return len(silent)


def model_spec_get_or_create(*, model: str, dataset: str, batch_size: int
                             ) -> tuple[ModelSpec, bool]:
    return ModelSpec.objects.get_or_create(model=model, dataset=dataset, batch_size=batch_size)


def profile_parse(document: Any, *, field: str = "profile") -> ModelProfile:
    """A model-profile document as the orchestrator reads it; a bad one is a 400 naming the
    field inside it (``profile.layers[3].forward_s``)."""
    try:
        return parse_profile(document, file=field)
    except FormatError as exc:
        raise InvalidInput(f"{field}.{exc.field}" if exc.field else field, exc.reason) from None


def _check_layer_count(*, device: Device, model_spec: ModelSpec, document: Any) -> None:
    """A profile must have the model's number of layers (the zoo's, or for a model outside it
    the one the other devices' profiles of the spec have; at most MAX_PROFILE_LAYERS for a
    first one): checked before the profile is parsed, which takes long for a huge one."""
    layers = document.get("layers") if isinstance(document, dict) else None
    if not isinstance(layers, list) or not layers:
        return  # the parse names what is wrong
    expected = model_num_layers(model_spec=model_spec, exclude_device=device)
    if expected is not None and len(layers) != expected:
        raise InvalidInput("profile.layers", f"has {len(layers)} layers but {model_spec.model} "
                                             f"(model spec {model_spec.pk}) has {expected}")
    if expected is None and len(layers) > MAX_PROFILE_LAYERS:
        raise InvalidInput("profile.layers", f"has {len(layers)} layers, more than the "
                                             f"{MAX_PROFILE_LAYERS} a model may have")


def layer_profile_upload(*, device: Device, model_spec: ModelSpec, document: Any
                         ) -> LayerProfile:
    """Store (or replace) the profile a device measured for a model spec; InvalidInput naming
    the field when it does not fit the spec (its model, batch size, data set or number of
    layers)."""
    _check_layer_count(device=device, model_spec=model_spec, document=document)
    profile = profile_parse(document)
    if profile.model != model_spec.model:
        raise InvalidInput("profile.model", f"is {profile.model!r} but model spec "
                                            f"{model_spec.pk} is {model_spec.model!r}")
    if profile.batch_size != model_spec.batch_size:
        raise InvalidInput("profile.batch_size", f"is {profile.batch_size} but model spec "
                                                 f"{model_spec.pk} has {model_spec.batch_size}")
    if profile.dataset is not None and profile.dataset != model_spec.dataset:
        raise InvalidInput("profile.dataset", f"is {profile.dataset!r} but model spec "
                                              f"{model_spec.pk} is {model_spec.dataset!r}")
    stored, _ = LayerProfile.objects.update_or_create(
        device=device, model_spec=model_spec,
        defaults={"document": profile.to_json(), "num_layers": profile.num_layers,
                  "forward_s": sum(la.forward_s for la in profile.layers),
                  "backward_s": sum(la.backward_s for la in profile.layers),
                  "measured_at": timezone.now()})
    _speeds_measured(model_spec)
    return stored


def _speeds_measured(model_spec: ModelSpec) -> None:
    """Each device that profiled ``model_spec``: its speed relative to the fastest of them
    (the fastest's time per batch over its own), as the devices pages show it. Agents do not
    report a speed: it is what they measured."""
    totals = {device_id: forward + backward for device_id, forward, backward in
              LayerProfile.objects.filter(model_spec=model_spec)
              .values_list("device_id", "forward_s", "backward_s")}
    usable = {d: t for d, t in totals.items() if t > 0}
    if not usable:
        return
    fastest = min(usable.values())
    for device_id, total in usable.items():
        Device.objects.filter(pk=device_id).update(speed=round(fastest / total, 6))


def device_profile_request(*, device: Device, model_spec: ModelSpec) -> Command:
    """Ask the device's agent to profile a model layer by layer; the profile arrives as its
    LayerProfile when the agent has measured it. Returns the command sent."""
    if device.status == Device.Status.RETIRED:
        raise Conflict(f"device {device.uid} is retired", state=device.status, action="profile")
    if not device.control_channel:
        raise Conflict(f"device {device.named} has no agent connected: start it "
                       "with `python -m agent run`", state=device.status, action="profile")
    command = ProfileCommand(model=model_spec.model, dataset=model_spec.dataset,
                             batch_size=model_spec.batch_size)
    device_command_send(uid=device.uid, command=command)
    return command


def device_agent_stop(*, device: Device) -> Command:
    """Fault injection: tell the device's agent to exit at once, as if killed (its control
    connection closes, and a run it holds a stage of loses it). Returns the command sent;
    Conflict when no agent is connected to receive it."""
    if device.status == Device.Status.RETIRED:
        raise Conflict(f"device {device.named} is retired",
                       state=device.status, action="stop its agent")
    if not device.control_channel or device.status == Device.Status.OFFLINE:
        raise Conflict(f"device {device.named} has no agent connected: there "
                       "is no agent to stop", state=device.status, action="stop its agent")
    command = ExitCommand()
    device_command_send(uid=device.uid, command=command)
    return command


def device_emulate(*, device: Device, slowdown: float) -> Command:
    """Tell the device's agent to emulate a device ``slowdown`` times slower from now on (a
    device heating up, for tests and demos of the dynamic re-partition). Returns the command
    sent; Conflict when no agent is connected."""
    if not device.control_channel or device.status in (Device.Status.OFFLINE,
                                                        Device.Status.RETIRED):
        raise Conflict(f"device {device.named} has no agent connected",
                       state=device.status, action="change its emulated slowdown")
    command = EmulateCommand(slowdown=float(slowdown))
    device_command_send(uid=device.uid, command=command)
    return command


def data_peers(devices: Sequence[Device]) -> tuple[dict[str, str], dict[str, str]]:
    """The data-plane ``peers`` (uid: address) and ``keys`` (uid: CURVE public key) a command
    gives an agent, of those of ``devices`` whose agent said both when it connected."""
    usable = [d for d in devices if d.data_address and d.data_key]
    return ({d.uid: d.data_address for d in usable}, {d.uid: d.data_key for d in usable})


def device_links_measure(*, devices: Sequence[Device]) -> list[str]:
    """Ask every connected device among ``devices`` to measure its links to the others over the
    data plane; returns the uids asked. The measurements arrive as DeviceLink rows."""
    connected = [d for d in devices if d.control_channel and d.data_address and d.data_key
                 and d.status != Device.Status.RETIRED]
    if len(connected) < 2:
        raise Conflict(f"{len(connected)} of these devices have an agent connected; measuring "
                       "links needs two", state="offline", action="measure links")
    peers, keys = data_peers(connected)
    for device in connected:
        device_command_send(uid=device.uid, command=MeasureCommand(peers=peers, keys=keys))
    return [d.uid for d in connected]


def device_links_store(*, device: Device, links: Sequence[dict[str, Any]]) -> int:
    """Store the links ``device`` measured (``{peer, bandwidth_bps, latency_s}`` each)."""
    by_uid = {d.uid: d for d in Device.objects.filter(uid__in=[link["peer"] for link in links])}
    stored = 0
    for link in links:
        target = by_uid.get(link["peer"])
        if target is None or target.pk == device.pk:
            raise InvalidInput("links", f"{link['peer']!r} is not another enrolled device")
        DeviceLink.objects.update_or_create(
            source=device, target=target,
            defaults={"bandwidth_bps": link["bandwidth_bps"], "latency_s": link["latency_s"],
                      "measured_at": timezone.now()})
        stored += 1
    return stored
