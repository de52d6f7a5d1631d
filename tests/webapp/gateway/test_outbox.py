"""Commands from a process whose channel layer does not reach the agents (a Celery worker on
the embedded setup, whose in-memory layer is its own): stored, and sent on by the web
process's connection of the device. Before, a probe's verdict (a worker task) halted a run's
stages with commands nobody received, and the run stayed recovering for ever."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from tests.webapp.factories import DeviceFactory
from tests.webapp.gateway.agents import agent
from webapp import celery as celery_app
from webapp.devices import commands
from webapp.devices.models import PendingCommand

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch, settings) -> None:  # type: ignore[no-untyped-def]
    """This process as the embedded setup's worker: its commands go through the database."""
    monkeypatch.setattr(commands, "_through_outbox", False)  # undone after the test
    settings.COMMANDS_OUTBOX = True
    celery_app._commands_through_outbox()  # what the worker_init signal runs
    assert commands._through_outbox


def test_a_workers_command_is_stored_and_the_agents_connection_sends_it(
        worker: None, settings) -> None:  # type: ignore[no-untyped-def]
    settings.COMMANDS_OUTBOX_POLL_S = 0.05
    device, other = DeviceFactory(), DeviceFactory()
    with transaction.atomic():
        commands.device_command_send(uid=device.uid, command=commands.command_build(
            "halt", run=7, generation=2))
        assert not PendingCommand.objects.exists()  # on commit, as a group send
    commands.device_command_send(uid=other.uid, command=commands.command_build(
        "probe", run=7))
    stale = PendingCommand.objects.create(device=device.uid, command={"command": "stale"})
    PendingCommand.objects.filter(pk=stale.pk).update(
        created_at=timezone.now() - timedelta(seconds=commands.OUTBOX_MAX_AGE_S + 1))
    assert sorted(PendingCommand.objects.values_list("device", flat=True)) == sorted(
        [device.uid, device.uid, other.uid])

    async def scenario() -> dict[str, object]:
        link = agent(device)
        connected, _ = await link.connect()
        assert connected
        received = await link.receive_json_from(timeout=5)
        assert await link.receive_nothing(timeout=0.3)  # the stale one is dropped
        await link.disconnect()
        return received

    received = async_to_sync(scenario)()
    assert received["command"] == "halt" and received["run"] == 7
    assert received["generation"] == 2
    # what was the device's is gone (sent, or too old); the other device's waits for it
    assert list(PendingCommand.objects.values_list("device", flat=True)) == [other.uid]


def test_without_the_outbox_commands_go_to_the_channel_layer(
        settings) -> None:  # type: ignore[no-untyped-def]
    settings.COMMANDS_OUTBOX = False
    celery_app._commands_through_outbox()
    assert not commands._through_outbox
    device = DeviceFactory()
    commands.device_command_send(uid=device.uid, command=commands.command_build(
        "probe", run=1))
    assert not PendingCommand.objects.exists()
