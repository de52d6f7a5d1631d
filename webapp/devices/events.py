"""What the devices' Channels group (``devices``) carries: one function builds each event, one
sends it after the transaction commits, and :func:`snapshot_apply` is how the Devices page
applies them to the snapshot it got on connecting (the page's script does the same).

Events: ``device`` (a device enrolled, sent a heartbeat, changed status, was renamed or
retired: the device as the REST API shows it, replacing the page's copy) and ``profiling``
(``{device, model, done, total, state, error}``: an agent's progress profiling a model, with
``state`` one of ``running``, ``stored``, ``failed``; transient, so not in the snapshot: the
stored profile is what the device's page shows once profiling ends). The snapshot is
``{"type": "snapshot", "devices": [...]}``, every device (retired ones too) ordered by name then
id; applying the events keeps that order, so an old snapshot brought forward equals a fresh one
(tests/webapp/dashboard/test_device_events.py)."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from webapp.devices.models import Device

Event = dict[str, Any]

DEVICES_GROUP = "devices"


def device_json(device: Device) -> dict[str, Any]:
    """The device in the REST API's shape (``GET /api/devices/<id>/``)."""
    from webapp.devices.apis import DeviceOutput  # the API module imports the services

    return dict(DeviceOutput(device).data)


def device_order(device: dict[str, Any]) -> tuple[str, int]:
    return (device["name"], device["id"])


def event_device(device: Device) -> Event:
    """A device changed: enrolled, heartbeat, status, name or retirement."""
    return {"type": "device", "device": device_json(device)}


def event_profiling(device: Device, *, model: str, state: str, done: int = 0, total: int = 0,
                    error: str = "") -> Event:
    """An agent's progress profiling ``model``: ``running`` (``done`` of ``total`` layers),
    ``stored`` (the profile is in the database) or ``failed`` (``error`` says why)."""
    return {"type": "profiling", "device": device.pk, "model": model, "state": state,
            "done": done, "total": total, "error": error}


def devices_snapshot(devices: Iterable[Device]) -> Event:
    """Everything the Devices page shows, at once."""
    return {"type": "snapshot",
            "devices": sorted((device_json(d) for d in devices), key=device_order)}


def _group_send(event: Event) -> None:
    async_to_sync(get_channel_layer().group_send)(DEVICES_GROUP,
                                                  {"type": "devices.event", "event": event})


def device_event_send(device: Device) -> None:
    """Send the device's new state to the devices group once the current transaction commits
    (built now, so later changes in the same request are sent by their own call)."""
    transaction.on_commit(partial(_group_send, event_device(device)))


def profiling_event_send(event: Event) -> None:
    transaction.on_commit(partial(_group_send, event))


def snapshot_apply(snapshot: Event, event: Event) -> Event:
    """The snapshot after ``event``: a device event replaces (or adds) that device; a
    profiling event leaves it as it is."""
    if event["type"] == "profiling":
        return snapshot
    if event["type"] != "device":
        raise ValueError(f"unknown event type {event['type']!r}")
    device = event["device"]
    others = [d for d in snapshot["devices"] if d["id"] != device["id"]]
    return {**snapshot, "devices": sorted([*others, device], key=device_order)}
