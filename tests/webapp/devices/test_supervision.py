"""Restarting an agent from the browser (webapp.devices.supervision): the demo's testbed
supervises the agents it started, survives one stopping, and starts it again when a staff user
asks (*Restart agent*); elsewhere nothing can, and the API says so."""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from tests.webapp.factories import DeviceFactory
from webapp.common.exceptions import Conflict
from webapp.demo.processes import ProcessGroup
from webapp.demo.scenario import LocalTestbed
from webapp.devices import supervision
from webapp.devices.models import Device, Supervision

pytestmark = pytest.mark.django_db

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def stopped(**kwargs) -> Device:
    """A device whose agent was stopped: offline, no connection."""
    return DeviceFactory(status=Device.Status.OFFLINE, control_channel="", **kwargs)


def watched(device: Device, *, seen_s_ago: float = 0.0) -> Supervision:
    return Supervision.objects.create(device=device, supervisor="manage.py demo (pid 1) on h",
                                      seen_at=timezone.now() - timedelta(seconds=seen_s_ago))


def test_a_restart_is_recorded_for_the_supervisor_and_taken_once():
    device = stopped()
    watched(device)
    requested = supervision.device_agent_restart(device=device)
    assert requested.restart_requested_at is not None
    assert supervision.restarts_take(uids=[device.uid, "other"]) == [device.uid]
    assert supervision.restarts_take(uids=[device.uid]) == []


@pytest.mark.parametrize(("kwargs", "seen_s_ago", "says"), [
    ({}, None, "nothing on this server can start the agent"),
    ({}, 60.0, "nothing on this server can start the agent"),  # the supervisor went away
    ({"status": Device.Status.ONLINE, "control_channel": "specific.x!y"}, 0.0,
     "has its agent connected: stop it first"),
    ({"status": Device.Status.RETIRED}, 0.0, "is retired"),
])
def test_a_restart_nothing_can_do_is_a_conflict(kwargs, seen_s_ago, says):
    device = DeviceFactory(**{"status": Device.Status.OFFLINE, "control_channel": "",
                              **kwargs})
    if seen_s_ago is not None:
        watched(device, seen_s_ago=seen_s_ago)
    with pytest.raises(Conflict, match=says):
        supervision.device_agent_restart(device=device)
    assert not Supervision.objects.filter(restart_requested_at__isnull=False).exists()


def test_the_api_asks_for_a_restart_as_staff_only(staff_api, api):
    device = stopped()
    watched(device)
    url = f"/api/devices/{device.pk}/restart-agent/"
    assert api.post(url).status_code == 403
    answer = staff_api.post(url)
    assert answer.status_code == 202, answer.content
    assert answer.json()["device"] == device.uid
    assert answer.json()["supervisor"].startswith("manage.py demo")
    assert staff_api.post("/api/devices/99999/restart-agent/").status_code == 404
    unwatched = stopped()
    refused = staff_api.post(f"/api/devices/{unwatched.pk}/restart-agent/")
    assert refused.status_code == 409
    assert "start it on the device (python -m agent run)" in refused.json()["detail"]


def test_the_testbed_survives_an_agent_stopping_and_starts_it_again_when_asked(
        tmp_path: Path, monkeypatch):
    # Prepare: a testbed whose agents are stand-in processes, their devices in the database
    group = ProcessGroup(log_dir=tmp_path / "logs")
    said: list[str] = []
    bed = LocalTestbed(say=said.append)
    bed.processes = group
    devices = {a.name: DeviceFactory(name=a.name) for a in bed.agents}
    bed.devices = [{"uid": d.uid, "name": d.name} for d in devices.values()]
    started: list[str] = []

    def start_agent(agent, *, token):  # the real one runs python -m agent run
        started.append(agent.name)
        group.start(bed.agent_process(agent), SLEEP)

    monkeypatch.setattr(bed, "_start_agent", start_agent)
    try:
        for agent in bed.agents:
            group.start(bed.agent_process(agent), SLEEP)
        group.start("web", SLEEP)
        # Execute: demo-slow's agent stops (as after Stop agent)
        group.kill("agent-demo-slow")
        group.children["agent-demo-slow"].killed = False  # it stopped on its own
        bed.check_children()
        # Assert: no DemoError, the testbed says it, and supervises every device
        assert "agent demo-slow stopped; Restart agent on its row of the run page starts it " \
               "again" in said
        assert Supervision.objects.count() == 3
        assert supervision.supervised(devices["demo-slow"])
        # Execute: a staff user asks for the restart
        Device.objects.filter(pk=devices["demo-slow"].pk).update(
            status=Device.Status.OFFLINE, control_channel="")
        supervision.device_agent_restart(device=Device.objects.get(pk=devices["demo-slow"].pk))
        bed._supervised_at = -float("inf")  # the next look, without waiting a second
        bed.check_children()
        # Assert: started again, once; the request is taken
        assert started == ["demo-slow"] and group.running("agent-demo-slow")
        assert "restarting agent demo-slow, as asked from the browser" in said
        assert not Supervision.objects.filter(restart_requested_at__isnull=False).exists()
        # the servers are still watched: one that stops ends the demo
        group.kill("web")
        group.children["web"].killed = False
        time.sleep(0.1)
        with pytest.raises(Exception, match="web stopped unexpectedly"):
            bed.check_children()
    finally:
        group.stop_all(grace_s=5)
