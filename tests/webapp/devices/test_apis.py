import pytest

from tests.webapp import testbed
from tests.webapp.factories import (
    DeviceFactory,
    EnrollmentTokenFactory,
    LayerProfileFactory,
    ModelSpecFactory,
    profile_document,
)
from webapp.common.secrets import secret_digest
from webapp.devices.models import Device, EnrollmentToken, LayerProfile

pytestmark = pytest.mark.django_db


def test_token_secret_is_shown_once_then_only_its_prefix(staff_api, staff, api):
    created = staff_api.post("/api/enrollment-tokens/", {"label": "lab", "max_uses": 2},
                             format="json")
    assert created.status_code == 201
    body = created.json()
    assert body["token"].startswith("ept_") and body["prefix"] == body["token"][:10]
    assert body["created_by"] == staff.username and body["max_uses"] == 2
    assert EnrollmentToken.objects.get().token_digest == secret_digest(body["token"])
    listed = api.get("/api/enrollment-tokens/").json()
    assert [t["id"] for t in listed] == [body["id"]]
    assert "token" not in listed[0] and body["token"] not in str(listed)


def test_revoked_token_no_longer_enrols(staff_api, anon):
    token = EnrollmentTokenFactory()
    revoked = staff_api.post(f"/api/enrollment-tokens/{token.pk}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    answer = anon.post("/api/agent/enrol/", testbed.enrol_body(testbed.DEVICES[0], token.secret),
                       format="json")
    assert answer.status_code == 400
    assert answer.json()["errors"] == [{"field": "token", "reason": "has been revoked"}]


def test_enrolled_device_authenticates_with_the_header_it_was_given(anon, api):
    token = EnrollmentTokenFactory()
    enrolled = anon.post("/api/agent/enrol/", testbed.enrol_body(testbed.DEVICES[2], token.secret),
                         format="json")
    assert enrolled.status_code == 201
    body = enrolled.json()
    assert body["authorization"] == f"Device {body['uid']}:{body['key']}"
    me = anon.get("/api/agent/me/", HTTP_AUTHORIZATION=body["authorization"])
    assert me.status_code == 200
    assert me.json()["uid"] == body["uid"] and me.json()["memory_bytes"] == 4294967296
    assert "key" not in me.json() and "key_hash" not in me.json()
    assert api.get(f"/api/devices/{body['id']}/").json()["hardware"] == {
        "description": "Raspberry Pi 4 B, Cortex-A72, 4 GB"}


def test_an_enrolment_with_a_huge_hardware_description_is_a_400(anon):
    # hello's hardware is bounded; the enrolment stored a 900 KB description as it came
    token = EnrollmentTokenFactory()
    body = {**testbed.enrol_body(testbed.DEVICES[0], token.secret),
            "hardware": {"blob": "x" * 900_000}}
    answer = anon.post("/api/agent/enrol/", body, format="json")
    assert answer.status_code == 400
    [error] = answer.json()["errors"]
    assert error["field"] == "hardware" and "at most 16384 bytes" in error["reason"]
    assert not Device.objects.exists()


def test_devices_list_detail_rename_retire(api, staff_api, agent):
    device = DeviceFactory(name="old")
    DeviceFactory(status=Device.Status.OFFLINE)
    assert len(api.get("/api/devices/").json()) == 2
    assert [d["id"] for d in api.get("/api/devices/?status=online").json()] == [device.pk]
    renamed = api.patch(f"/api/devices/{device.pk}/", {"name": "new"}, format="json")
    assert renamed.status_code == 200
    assert renamed.json()["name"] == "new" and renamed.json()["uid"] == device.uid
    assert agent(device).get("/api/agent/me/").status_code == 200
    retired = staff_api.post(f"/api/devices/{device.pk}/retire/")
    assert retired.json()["status"] == "retired"
    assert agent(device).get("/api/agent/me/").status_code == 401


def test_unknown_ids_are_404_with_a_readable_detail(api, staff_api):
    for url in ("/api/devices/999/", "/api/profiles/999/"):
        answer = api.get(url)
        assert answer.status_code == 404
        assert answer.json()["detail"].endswith("999 does not exist")
    assert staff_api.post("/api/enrollment-tokens/999/revoke/").status_code == 404
    assert staff_api.post("/api/devices/999/retire/").status_code == 404


def test_model_spec_create_returns_the_existing_one_the_second_time(api):
    body = {"model": "vgg5", "dataset": "digits", "batch_size": 64}
    first = api.post("/api/model-specs/", body, format="json")
    second = api.post("/api/model-specs/", body, format="json")
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["id"] == second.json()["id"]
    assert api.get("/api/model-specs/").json() == [first.json()]


def test_agent_uploads_its_profile_and_users_read_it(api, agent):
    device = DeviceFactory()
    spec = ModelSpecFactory(**testbed.SPEC)
    document = testbed.device_profile(testbed.DEVICES[1])
    uploaded = agent(device).post("/api/agent/profiles/",
                                  {"model_spec": spec.pk, "profile": document}, format="json")
    assert uploaded.status_code == 201
    assert uploaded.json()["num_layers"] == 37 and uploaded.json()["device_uid"] == device.uid
    listed = api.get(f"/api/profiles/?device={device.pk}&model_spec={spec.pk}").json()
    assert [p["id"] for p in listed] == [uploaded.json()["id"]]
    detail = api.get(f"/api/profiles/{uploaded.json()['id']}/").json()
    assert detail["document"]["layers"][5]["forward_s"] == document["layers"][5]["forward_s"]


def test_profiles_list_by_spec(api):
    mine = LayerProfileFactory()
    LayerProfileFactory(model_spec=ModelSpecFactory(model="other"))
    listed = api.get(f"/api/profiles/?model_spec={mine.model_spec_id}").json()
    assert [p["id"] for p in listed] == [mine.pk]


def test_heartbeat_sets_the_devices_status(agent):
    device = DeviceFactory(status=Device.Status.OFFLINE)
    answer = agent(device).post("/api/agent/heartbeat/", {"status": "busy"}, format="json")
    assert answer.status_code == 200 and answer.json()["status"] == "busy"
    device.refresh_from_db()
    assert device.status == Device.Status.BUSY


def test_a_device_uploads_profiles_only_as_itself(agent):
    device = DeviceFactory()
    spec = ModelSpecFactory()
    agent(device).post("/api/agent/profiles/", {"model_spec": spec.pk,
                                                "profile": profile_document()}, format="json")
    assert list(LayerProfile.objects.values_list("device_id", flat=True)) == [device.pk]
