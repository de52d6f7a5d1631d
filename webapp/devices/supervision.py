"""Restarting a device's agent from the browser, where a local supervisor can (the demo's
testbed, which started the agents as child processes): the supervisor says it is there and
takes the restarts asked for; the web process only records the request. A device whose agent
runs on its own machine has no supervisor: its agent is started there."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from webapp.common.exceptions import Conflict
from webapp.devices.models import Device, Supervision

ACTIVE = (Device.Status.ONLINE, Device.Status.BUSY)


def supervised(device: Device) -> bool:
    """Does a supervisor that gave a sign of life lately watch the device's agent?"""
    cutoff = timezone.now() - timedelta(seconds=settings.SUPERVISOR_SILENT_S)
    return Supervision.objects.filter(device=device, seen_at__gte=cutoff).exists()


def device_agent_restart(*, device: Device) -> Supervision:
    """Ask the device's supervisor to start its agent again (after *Stop agent*, say). Conflict
    when the device is retired, its agent is connected, or nothing here can start it."""
    action = "restart its agent"
    if device.status == Device.Status.RETIRED:
        raise Conflict(f"device {device.name!r} ({device.uid}) is retired",
                       state=device.status, action=action)
    if device.status in ACTIVE and device.control_channel:
        raise Conflict(f"device {device.name!r} ({device.uid}) has its agent connected: stop "
                       "it first", state=device.status, action=action)
    with transaction.atomic():
        cutoff = timezone.now() - timedelta(seconds=settings.SUPERVISOR_SILENT_S)
        supervision = (Supervision.objects.select_for_update()
                       .filter(device=device, seen_at__gte=cutoff).first())
        if supervision is None:
            raise Conflict(f"nothing on this server can start the agent of {device.name!r} "
                           f"({device.uid}): start it on the device (python -m agent run)",
                           state=device.status, action=action)
        supervision.restart_requested_at = timezone.now()
        supervision.save(update_fields=["restart_requested_at"])
    return supervision


def devices_supervise(*, uids: Sequence[str], supervisor: str) -> None:
    """The supervisor's sign of life for the devices whose agents it started."""
    now = timezone.now()
    for device in Device.objects.filter(uid__in=list(uids)):
        Supervision.objects.update_or_create(device=device, defaults={
            "supervisor": supervisor, "seen_at": now})


def restarts_take(*, uids: Sequence[str]) -> list[str]:
    """The devices among ``uids`` whose restart was asked for, each taken once."""
    taken = []
    for supervision in (Supervision.objects.filter(device__uid__in=list(uids),
                                                   restart_requested_at__isnull=False)
                        .select_related("device")):
        if Supervision.objects.filter(pk=supervision.pk, restart_requested_at__isnull=False
                                      ).update(restart_requested_at=None):
            taken.append(supervision.device.uid)
    return taken
