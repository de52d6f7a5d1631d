"""Who may call what: users with a session, agents with their device key."""

import pytest

from tests.webapp.factories import DeviceFactory

pytestmark = pytest.mark.django_db

USER_ENDPOINTS = [("get", "/api/devices/"), ("get", "/api/enrollment-tokens/"),
                  ("post", "/api/enrollment-tokens/"), ("get", "/api/model-specs/"),
                  ("get", "/api/runs/"), ("post", "/api/runs/"), ("get", "/api/profiles/")]
AGENT_ENDPOINTS = [("get", "/api/agent/me/"), ("post", "/api/agent/heartbeat/"),
                   ("post", "/api/agent/profiles/"), ("get", "/api/agent/runs/")]


@pytest.mark.parametrize(("method", "url"), USER_ENDPOINTS)
def test_user_endpoints_without_a_session_are_401(anon, method, url):
    answer = getattr(anon, method)(url, {}, format="json")
    assert answer.status_code == 401
    assert answer["WWW-Authenticate"].startswith("Session")
    assert answer.json() == {"detail": "Authentication credentials were not provided."}


@pytest.mark.parametrize(("method", "url"), USER_ENDPOINTS)
def test_a_device_key_does_not_open_user_endpoints(agent, method, url):
    answer = getattr(agent(DeviceFactory()), method)(url, {}, format="json")
    assert answer.status_code == 401


@pytest.mark.parametrize(("method", "url"), AGENT_ENDPOINTS)
def test_agent_endpoints_without_a_key_are_401(anon, method, url):
    answer = getattr(anon, method)(url, {}, format="json")
    assert answer.status_code == 401
    assert answer["WWW-Authenticate"] == 'Device realm="edgepipe"'


@pytest.mark.parametrize(("method", "url"), AGENT_ENDPOINTS)
def test_a_session_does_not_open_agent_endpoints(api, method, url):
    assert getattr(api, method)(url, {}, format="json").status_code == 401


@pytest.mark.parametrize("header", [
    "Device {uid}:edk_wrong-key",
    "Device no-such-device:{key}",
    "Device {uid}",
    "Device :{key}",
    "Device {uid}:",
])
def test_wrong_or_malformed_device_credentials_are_401(anon, header):
    device = DeviceFactory()
    answer = anon.get("/api/agent/me/",
                      HTTP_AUTHORIZATION=header.format(uid=device.uid, key=device.key))
    assert answer.status_code == 401
    assert "device" in answer.json()["detail"].lower()


def test_another_devices_key_does_not_pass_for_this_device(anon):
    mine, theirs = DeviceFactory(), DeviceFactory()
    answer = anon.get("/api/agent/me/", HTTP_AUTHORIZATION=f"Device {mine.uid}:{theirs.key}")
    assert answer.status_code == 401


def test_another_scheme_is_not_a_device_key(anon):
    answer = anon.get("/api/agent/me/", HTTP_AUTHORIZATION="Bearer abc")
    assert answer.status_code == 401
    assert answer.json()["detail"] == "Authentication credentials were not provided."


def test_enrolment_needs_no_credentials(anon):
    answer = anon.post("/api/agent/enrol/", {}, format="json")
    assert answer.status_code == 400
