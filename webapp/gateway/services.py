"""What the server does with an agent's control messages (docs/architecture.md, "Agent control
protocol"). The consumer only authenticates and dispatches; each message type has one handler
here, which validates the message and calls the devices' and runs' services."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.utils import timezone

from webapp.common.exceptions import InvalidInput
from webapp.devices import services as device_services
from webapp.devices.events import event_profiling, profiling_event_send
from webapp.devices.models import Device
from webapp.runs import recovery
from webapp.runs import services as run_services
from webapp.runs.models import Run

log = logging.getLogger(__name__)

Message = dict[str, Any]
Reply = Message | None


def _field(message: Message, name: str, kind: type | tuple[type, ...], *,
           required: bool = True) -> Any:
    value = message.get(name)
    if value is None and not required:
        return None
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise InvalidInput(name, f"must be a {getattr(kind, '__name__', 'value')}")
    if not isinstance(value, kind):
        names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise InvalidInput(name, f"must be a {names}, got {type(value).__name__}")
    return value


def _seconds(message: Message, name: str) -> float | None:
    """An optional duration a device measured: a number of seconds from 0 to 10."""
    value = _field(message, name, (int, float), required=False)
    if value is None:
        return None
    if not (math.isfinite(value) and 0 <= value <= 10):
        raise InvalidInput(name, "must be between 0 and 10 seconds")
    return float(value)


def _run_of(device: Device, message: Message) -> Run:
    run_id = _field(message, "run", int)
    run = Run.objects.filter(pk=run_id, run_devices__device=device).first()
    if run is None:
        raise InvalidInput("run", f"device {device.uid} has no run {run_id}")
    return run


def agent_connected(*, device_id: int, channel: str) -> Device:
    """A new control connection: it is the device's current one from now on."""
    device = Device.objects.get(pk=device_id)
    device.control_channel = channel
    device.status = Device.Status.ONLINE
    device.last_heartbeat_at = timezone.now()
    device.save(update_fields=["control_channel", "status", "last_heartbeat_at"])
    return device


def agent_disconnected(*, device_id: int, channel: str) -> bool:
    """The connection closed. If it was the device's current one, the device is offline and the
    runs it was training fail; a connection replaced by a newer one changes nothing."""
    with transaction.atomic():
        device = Device.objects.select_for_update().get(pk=device_id)
        if device.control_channel != channel:
            return False
        device.control_channel = ""
        device.data_address = ""
        if device.status != Device.Status.RETIRED:
            device.status = Device.Status.OFFLINE
        device.save(update_fields=["control_channel", "data_address", "status"])
    recovery.run_device_lost(device=device, reason="its agent disconnected",
                             detected_by="disconnect")
    return True


def _hello(device: Device, message: Message) -> Reply:
    address = _field(message, "data_address", str)
    if not address.startswith("tcp://") or len(address) > 200:
        raise InvalidInput("data_address", "must be tcp://host:port (at most 200 characters)")
    hardware = _field(message, "hardware", dict, required=False)
    device.data_address = address
    fields = ["data_address"]
    for name in ("overhead_s", "message_s"):  # the agent's measured fixed costs
        value = _seconds(message, name)
        if value is not None:
            setattr(device, name, value)
            fields.append(name)
    if hardware is not None:
        device.hardware = hardware
        fields.append("hardware")
    device.save(update_fields=fields)
    recovery.run_device_back(device=device)
    return {"type": "welcome", "device": device.uid, "name": device.name}


def _heartbeat(device: Device, message: Message) -> Reply:
    status = message.get("status", Device.Status.ONLINE)
    if status not in (Device.Status.ONLINE, Device.Status.BUSY):
        raise InvalidInput("status", "must be online or busy")
    device_services.device_heartbeat(device=device, status=status)
    return None


def _events(device: Device, message: Message) -> Reply:
    run = _run_of(device, message)
    stored = run_services.run_events_store(
        run=run, device=device, timeline=_field(message, "timeline", list, required=False) or [],
        faults=_field(message, "faults", list, required=False) or [],
        metrics=_field(message, "metrics", list, required=False) or [])
    updates = [e.get("microbatch") for e in message.get("timeline") or []
               if e.get("kind") == "update" and isinstance(e.get("microbatch"), int)]
    if updates:  # the dynamic re-partition's clock: how far training has got
        recovery.run_repartition_check(run_id=run.pk, progress=max(updates), seen=run)
    return {"type": "stored", "run": run.pk, **stored}


def _ack(device: Device, message: Message) -> Reply:
    command = _field(message, "command", str)
    ok = _field(message, "ok", bool)
    error = _field(message, "error", str, required=False) or ""
    generation = _field(message, "generation", int, required=False)
    if command == "deploy":
        run = _run_of(device, message)
        if ok:
            run_services.run_stage_ready(run=run, device=device, generation=generation)
        else:
            run_services.run_stage_failed(run=run, device=device, generation=generation,
                                          error=error or "the agent refused its stage")
    elif command == "halt" and ok:
        recovery.run_stage_halted(run=_run_of(device, message), device=device,
                                  generation=generation, holdings=message.get("holdings"))
    elif command == "probe" and ok:
        recovery.run_probe_answered(run=_run_of(device, message), device=device,
                                    holds=message.get("holds"))
    elif not ok:
        log.warning("device %s refused %s: %s", device.uid, command, error)
        if command == "profile":
            profiling_event_send(event_profiling(
                device, model=str(message.get("model", "")), state="failed",
                error=error or "the agent refused to profile"))
    return None


def _stage_done(device: Device, message: Message) -> Reply:
    run = _run_of(device, message)
    generation = _field(message, "generation", int, required=False)
    overhead = _seconds(message, "overhead_s")  # what the stage measured, for later plans
    per_message = _seconds(message, "message_s")
    in_passes = _seconds(message, "pass_overhead_s")
    if in_passes is not None and (overhead is None or in_passes > overhead):
        raise InvalidInput("pass_overhead_s", "must come with overhead_s and be at most it")
    run_services.run_stage_done(run=run, device=device, generation=generation)
    if overhead is not None:
        device_services.profile_costs_measured(device=device, model_spec=run.model_spec,
                                               overhead_s=overhead, message_s=per_message,
                                               pass_overhead_s=in_passes)
    return None


def _stage_failed(device: Device, message: Message) -> Reply:
    error = _field(message, "error", str)
    run_services.run_stage_failed(run=_run_of(device, message), device=device, error=error,
                                  generation=_field(message, "generation", int, required=False))
    return None


def _suspect(device: Device, message: Message) -> Reply:
    """Stage 0's backward timer fired: probe the run's devices."""
    log.warning("device %s suspects a device of run %s (waited %.2f s for micro-batch %s)",
                device.uid, message.get("run"), message.get("waited_s", 0.0),
                message.get("microbatch"))
    recovery.run_suspect(run=_run_of(device, message), device=device,
                         generation=_field(message, "generation", int))
    return None


def _profile_result(device: Device, message: Message) -> Reply:
    spec = _field(message, "model_spec", dict)
    try:
        model_spec, _ = device_services.model_spec_get_or_create(
            model=str(spec["model"]), dataset=str(spec["dataset"]),
            batch_size=int(spec["batch_size"]))
    except (KeyError, TypeError, ValueError):
        raise InvalidInput("model_spec", "must have model, dataset and batch_size") from None
    try:
        device_services.layer_profile_upload(device=device, model_spec=model_spec,
                                             document=_field(message, "profile", dict))
    except InvalidInput as exc:
        profiling_event_send(event_profiling(
            device, model=model_spec.model, state="failed",
            error=f"the server refused the profile: {exc}"))
        raise
    profiling_event_send(event_profiling(device, model=model_spec.model, state="stored"))
    return {"type": "profile_stored", "model_spec": model_spec.pk}


def _link(device: Device, message: Message) -> Reply:
    """The device's link as the agent measured (or emulates) it: latency, and bandwidth when
    known; planning uses them."""
    latency = _field(message, "latency_s", (int, float))
    if not (math.isfinite(latency) and 0 <= latency <= 60):
        raise InvalidInput("latency_s", "must be between 0 and 60")
    device.latency_s = float(latency)
    fields = ["latency_s"]
    bandwidth = _field(message, "bandwidth_bps", (int, float), required=False)
    if bandwidth is not None:
        if not (math.isfinite(bandwidth) and bandwidth > 0):
            raise InvalidInput("bandwidth_bps", "must be a positive number")
        device.bandwidth_bps = float(bandwidth)
        fields.append("bandwidth_bps")
    device.save(update_fields=fields)
    return None


def _links(device: Device, message: Message) -> Reply:
    links = _field(message, "links", list)
    checked = []
    for i, link in enumerate(links):
        if not isinstance(link, dict) or not isinstance(link.get("peer"), str):
            raise InvalidInput(f"links[{i}].peer", "must be a device uid")
        bandwidth, latency = link.get("bandwidth_bps"), link.get("latency_s")
        if not (isinstance(bandwidth, (int, float)) and math.isfinite(bandwidth)
                and bandwidth > 0):
            raise InvalidInput(f"links[{i}].bandwidth_bps", "must be a positive number")
        if not (isinstance(latency, (int, float)) and math.isfinite(latency)
                and 0 <= latency <= 60):
            raise InvalidInput(f"links[{i}].latency_s", "must be between 0 and 60")
        checked.append({"peer": link["peer"], "bandwidth_bps": float(bandwidth),
                        "latency_s": float(latency)})
    return {"type": "links_stored",
            "count": device_services.device_links_store(device=device, links=checked)}


def _profile_progress(device: Device, message: Message) -> Reply:
    done, total = _field(message, "done", int), _field(message, "total", int)
    model = _field(message, "model", str)
    log.info("device %s profiled %d of %d layers of %s", device.uid, done, total, model)
    profiling_event_send(event_profiling(device, model=model, state="running", done=done,
                                         total=total))
    return None


def _profile_failed(device: Device, message: Message) -> Reply:
    model, error = _field(message, "model", str), _field(message, "error", str)
    log.warning("device %s could not profile %s: %s", device.uid, model, error)
    profiling_event_send(event_profiling(device, model=model, state="failed", error=error))
    return None


HANDLERS: dict[str, Callable[[Device, Message], Reply]] = {
    "hello": _hello, "heartbeat": _heartbeat, "events": _events, "ack": _ack,
    "stage_done": _stage_done, "stage_failed": _stage_failed,
    "profile_result": _profile_result, "profile_progress": _profile_progress,
    "profile_failed": _profile_failed, "link": _link, "links": _links, "suspect": _suspect,
}


def agent_message(*, device_id: int, message: Any) -> Reply:
    """Handle one message from an agent; InvalidInput names the field that is wrong."""
    if not isinstance(message, dict):
        raise InvalidInput("body", "a message must be a JSON object")
    handler = HANDLERS.get(message.get("type"))  # type: ignore[arg-type]
    if handler is None:
        raise InvalidInput("type", f"must be one of {', '.join(sorted(HANDLERS))} or ping")
    device = Device.objects.get(pk=device_id)
    if device.status == Device.Status.RETIRED:
        raise InvalidInput("device", f"device {device.uid} is retired")
    return handler(device, message)
