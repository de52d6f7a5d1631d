from datetime import timedelta

import pytest
from django.utils import timezone

from tests.webapp.factories import DeviceFactory
from webapp.devices.models import Device
from webapp.devices.tasks import devices_mark_offline

pytestmark = pytest.mark.django_db


def test_mark_offline_task_uses_the_configured_silence(settings):
    settings.DEVICE_OFFLINE_AFTER_S = 30
    quiet = DeviceFactory(last_heartbeat_at=timezone.now() - timedelta(seconds=45))
    DeviceFactory(last_heartbeat_at=timezone.now() - timedelta(seconds=10))
    assert devices_mark_offline.delay().get() == 1
    quiet.refresh_from_db()
    assert quiet.status == Device.Status.OFFLINE
