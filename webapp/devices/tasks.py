"""Periodic device housekeeping (Celery beat)."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from webapp.devices import services


@shared_task(acks_late=True)
def devices_mark_offline() -> int:
    return services.devices_mark_offline(older_than_s=settings.DEVICE_OFFLINE_AFTER_S)
