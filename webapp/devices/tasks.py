"""Periodic device housekeeping (Celery beat)."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from webapp.devices import services
from webapp.devices.models import Device


@shared_task(acks_late=True)
def devices_mark_offline() -> int:
    """Devices silent too long go offline; the runs they train recover without them."""
    from webapp.runs.recovery import run_device_lost  # runs build on devices, not back

    def lost(device: Device) -> None:
        run_device_lost(device=device, reason="its heartbeats stopped "
                                              f"({settings.DEVICE_OFFLINE_AFTER_S} s)",
                        detected_by="heartbeat")

    return services.devices_mark_offline(older_than_s=settings.DEVICE_OFFLINE_AFTER_S,
                                         on_offline=lost)
