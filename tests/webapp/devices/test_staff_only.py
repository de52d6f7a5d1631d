"""Only staff users create and revoke enrolment tokens, retire devices, stop agents and change
their emulation, over the REST API (webapp.common.permissions.IsStaff: a 403 saying so) and on
the dashboard (its forms refuse, its pages show those buttons to staff only); any logged-in
user still reads everything."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.webapp.devices.test_stop_agent import listen
from tests.webapp.factories import DeviceFactory, EnrollmentTokenFactory, PlanFactory, RunFactory
from tests.webapp.runs.test_events import drain
from webapp.devices.models import Device, EnrollmentToken

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(user: object) -> Client:
    """The dashboard as a logged-in user who is not staff."""
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator(staff: object) -> Client:
    """The dashboard as a staff user."""
    client = Client()
    client.force_login(staff)
    return client


def staff_actions() -> list[tuple[str, str, dict, str]]:
    """(url, body, what the 403 says only staff may do) of every staff-only action."""
    token = EnrollmentTokenFactory()
    device = DeviceFactory(control_channel="specific.agent!1")
    return [
        ("/api/enrollment-tokens/", {"label": "lab"}, "create enrolment tokens"),
        (f"/api/enrollment-tokens/{token.pk}/revoke/", {}, "revoke enrolment tokens"),
        (f"/api/devices/{device.pk}/retire/", {}, "retire devices"),
        (f"/api/devices/{device.pk}/stop-agent/", {}, "stop a device's agent"),
        (f"/api/devices/{device.pk}/emulate/", {"slowdown": 2.0}, "change a device's emulation"),
    ]


def test_a_user_who_is_not_staff_gets_a_403_saying_why_and_nothing_changes(
        api, django_capture_on_commit_callbacks):
    actions = staff_actions()
    [device] = Device.objects.all()
    channel = listen(device.uid)
    with django_capture_on_commit_callbacks(execute=True) as sent:
        for url, body, what in actions:
            answer = api.post(url, body, format="json")
            assert answer.status_code == 403, (url, answer.content)
            assert answer.json() == {"detail": f"only staff users may {what}; ask an "
                                               "administrator (a user with is_staff) to do it "
                                               "or to make you staff"}, url
    assert sent == [] and drain(channel) == []  # no command reached the agent
    device.refresh_from_db()
    assert device.status == Device.Status.ONLINE and device.key_hash
    [token] = EnrollmentToken.objects.all()  # none created, the one there not revoked
    assert token.revoked_at is None


def test_staff_users_may_do_each(staff_api, django_capture_on_commit_callbacks):
    actions = staff_actions()
    with django_capture_on_commit_callbacks(execute=True):
        answers = [staff_api.post(url, body, format="json").status_code
                   for url, body, _ in actions]
    # allowed: the device is retired (200), so its agent is not there to stop or slow (409)
    assert answers == [201, 200, 200, 409, 409]
    device = DeviceFactory(control_channel="specific.agent!2")
    for url in (f"/api/devices/{device.pk}/stop-agent/", f"/api/devices/{device.pk}/emulate/"):
        assert staff_api.post(url, {"slowdown": 2.0}, format="json").status_code == 202


def test_without_a_session_it_stays_a_401(anon):
    for url, body, _ in staff_actions():
        assert anon.post(url, body, format="json").status_code == 401, url


def test_reads_and_renaming_stay_open_to_any_logged_in_user(api):
    token = EnrollmentTokenFactory()
    device = DeviceFactory()
    assert [t["id"] for t in api.get("/api/enrollment-tokens/").json()] == [token.pk]
    assert [d["id"] for d in api.get("/api/devices/").json()] == [device.pk]
    assert api.get(f"/api/devices/{device.pk}/").status_code == 200
    assert api.patch(f"/api/devices/{device.pk}/", {"name": "pi"},
                     format="json").json()["name"] == "pi"
    assert api.get("/api/profiles/").status_code == 200


# --------------------------------------------------------------------------- the dashboard


def test_the_dashboards_forms_refuse_a_user_who_is_not_staff(viewer: Client):
    device = DeviceFactory()
    assert viewer.get("/devices/").status_code == 200
    assert viewer.post("/devices/", {"name": "pi", "max_uses": "1"}).status_code == 403
    assert not EnrollmentToken.objects.exists()
    assert viewer.post(f"/devices/{device.pk}/retire/").status_code == 403
    device.refresh_from_db()
    assert device.status != Device.Status.RETIRED and device.key_hash


def test_the_staff_only_buttons_are_not_shown_to_a_user_who_is_not_staff(
        viewer: Client, operator: Client):
    device = DeviceFactory()
    run = RunFactory(devices=[device])
    PlanFactory(run=run)
    pages = {"devices": "/devices/?add=1", "device": f"/devices/{device.pk}/",
             "run": f"/runs/{run.pk}/", "overview": "/"}
    seen = {who: {name: client.get(url).content.decode() for name, url in pages.items()}
            for who, client in (("viewer", viewer), ("staff", operator))}
    staff_only = {
        "devices": ['id="add-device"', 'id="enrol"', "Create enrolment token"],
        "device": [f'action="/devices/{device.pk}/retire/"', "Retire device"],
        "run": ["data-stop-agent=", "Stop agent"],
        "overview": ['href="/devices/?add=1"'],
    }
    for page, marks in staff_only.items():
        for mark in marks:
            assert mark in seen["staff"][page], (page, mark)
            assert mark not in seen["viewer"][page], (page, mark)
    # what every user sees stays: the device list, the rename form, the run's devices
    assert 'id="devices-body"' in seen["viewer"]["devices"]
    assert re.search(r'<button class="btn" type="submit">Rename</button>',
                     seen["viewer"]["device"])
    assert f'data-device="{device.uid}"' in seen["viewer"]["run"]

