from datetime import timedelta

import pytest
from django.utils import timezone

from tests.webapp.factories import (
    DeviceFactory,
    EnrollmentTokenFactory,
    LayerProfileFactory,
    ModelSpecFactory,
    UserFactory,
    profile_document,
)
from webapp.common.exceptions import InvalidInput
from webapp.common.secrets import secret_digest, secret_matches
from webapp.devices import services
from webapp.devices.models import Device, LayerProfile

pytestmark = pytest.mark.django_db

ENROL = {"name": "Pi 4 (lab)", "memory_bytes": 4 * 2**30, "bandwidth_bps": 2.5e6,
         "latency_s": 0.005}


def test_token_create_stores_only_a_digest_of_the_secret():
    user = UserFactory()
    token, secret = services.enrollment_token_create(created_by=user, label="lab",
                                                     max_uses=3, expires_in_s=600)
    assert secret.startswith("ept_")
    assert token.token_digest == secret_digest(secret) and secret not in token.token_digest
    assert token.prefix == secret[:10]
    assert token.max_uses == 3 and token.created_by == user
    assert timedelta(seconds=590) < token.expires_at - timezone.now() <= timedelta(seconds=600)


def test_token_create_defaults_to_the_configured_lifetime(settings):
    settings.ENROLLMENT_TOKEN_TTL_S = 7200
    token, _ = services.enrollment_token_create(created_by=None)
    assert timedelta(seconds=7190) < token.expires_at - timezone.now() <= timedelta(hours=2)


def test_token_revoke_keeps_the_first_time():
    token = EnrollmentTokenFactory()
    first = services.enrollment_token_revoke(token=token).revoked_at
    assert first is not None
    assert services.enrollment_token_revoke(token=token).revoked_at == first


def test_enrol_creates_an_online_device_with_a_hashed_key_and_a_stable_uid():
    token = EnrollmentTokenFactory()
    device, key = services.device_enrol(token=token.secret, hardware={"os": "Linux"}, **ENROL)
    assert device.status == Device.Status.ONLINE and device.last_heartbeat_at is not None
    assert device.uid.startswith("pi-4-lab-") and len(device.uid) == len("pi-4-lab-") + 6
    assert key.startswith("edk_") and key not in device.key_hash
    assert secret_matches(key, device.key_hash)
    assert device.hardware == {"os": "Linux"} and device.enrollment_token == token
    token.refresh_from_db()
    assert token.uses == 1
    services.device_rename(device=device, name="another name")
    device.refresh_from_db()
    assert device.uid.startswith("pi-4-lab-") and device.name == "another name"


def test_two_devices_with_one_name_get_different_uids():
    token = EnrollmentTokenFactory(max_uses=2)
    a, _ = services.device_enrol(token=token.secret, **ENROL)
    b, _ = services.device_enrol(token=token.secret, **ENROL)
    assert a.uid != b.uid


@pytest.mark.parametrize(("change", "reason"), [
    ({"revoked_at": timezone.now()}, "has been revoked"),
    ({"expires_at": timezone.now() - timedelta(seconds=1)}, "has expired"),
    ({"uses": 1}, "has been used by 1 device(s), its maximum"),
])
def test_enrol_refuses_an_unusable_token(change, reason):
    token = EnrollmentTokenFactory(**change)
    with pytest.raises(InvalidInput) as caught:
        services.device_enrol(token=token.secret, **ENROL)
    assert caught.value.errors[0].field == "token"
    assert caught.value.errors[0].reason == reason
    assert not Device.objects.exists()


def test_enrol_refuses_an_unknown_token():
    with pytest.raises(InvalidInput, match="token: is not a valid enrolment token"):
        services.device_enrol(token="ept_nonsense", **ENROL)


def test_retire_invalidates_the_key():
    device = DeviceFactory()
    services.device_retire(device=device)
    device.refresh_from_db()
    assert device.status == Device.Status.RETIRED and device.retired_at is not None
    assert device.key_hash == ""


def test_heartbeat_records_status_and_time():
    device = DeviceFactory(status=Device.Status.OFFLINE, last_heartbeat_at=None)
    services.device_heartbeat(device=device, status=Device.Status.BUSY)
    device.refresh_from_db()
    assert device.status == Device.Status.BUSY and device.last_heartbeat_at is not None


def test_mark_offline_touches_only_silent_live_devices():
    old = timezone.now() - timedelta(minutes=5)
    silent = DeviceFactory(last_heartbeat_at=old)
    never = DeviceFactory(last_heartbeat_at=None)
    fresh = DeviceFactory()
    retired = DeviceFactory(status=Device.Status.RETIRED, last_heartbeat_at=old)
    assert services.devices_mark_offline(older_than_s=60) == 2
    statuses = {d.pk: d.status for d in Device.objects.all()}
    assert statuses[silent.pk] == statuses[never.pk] == Device.Status.OFFLINE
    assert statuses[fresh.pk] == Device.Status.ONLINE
    assert statuses[retired.pk] == Device.Status.RETIRED


def test_model_spec_get_or_create_is_idempotent():
    a, created_a = services.model_spec_get_or_create(model="vgg5", dataset="cifar", batch_size=64)
    b, created_b = services.model_spec_get_or_create(model="vgg5", dataset="cifar", batch_size=64)
    assert (created_a, created_b) == (True, False) and a == b


def test_profile_upload_stores_and_replaces_the_devices_profile():
    device, spec = DeviceFactory(), ModelSpecFactory()
    services.layer_profile_upload(device=device, model_spec=spec,
                                  document=profile_document(layers=4))
    stored = services.layer_profile_upload(device=device, model_spec=spec,
                                           document=profile_document(layers=4, scale=2.0))
    assert LayerProfile.objects.count() == 1
    assert stored.num_layers == 4
    assert stored.forward_s == pytest.approx(2.0 * 0.01 * (1 + 2 + 3 + 4))
    assert stored.document["layers"][3]["backward_s"] == pytest.approx(0.16)


def test_a_devices_speed_is_measured_relative_to_the_fastest_that_profiled_the_model():
    # agents report no speed: every device showed 1x, a 4x slower one too
    spec = ModelSpecFactory()
    fast, slow = DeviceFactory(), DeviceFactory()
    services.layer_profile_upload(device=slow, model_spec=spec,
                                  document=profile_document(layers=4, scale=4.0))
    slow.refresh_from_db()
    assert slow.speed == pytest.approx(1.0)  # the only one yet
    services.layer_profile_upload(device=fast, model_spec=spec,
                                  document=profile_document(layers=4))
    fast.refresh_from_db()
    slow.refresh_from_db()
    assert (fast.speed, slow.speed) == (pytest.approx(1.0), pytest.approx(0.25))


@pytest.mark.parametrize(("document", "field", "reason"), [
    ({**profile_document(), "model": "vgg5"}, "profile.model", "is 'vgg5' but model spec"),
    ({**profile_document(), "batch_size": 8}, "profile.batch_size", "is 8 but model spec"),
    ({**profile_document(), "dataset": "cifar10"}, "profile.dataset", "is 'cifar10' but"),
    ({**profile_document(), "layers": []}, "profile.layers", "must not be empty"),
    ({"model": "mlp"}, "profile.batch_size", "is missing"),
])
def test_profile_upload_refuses_a_profile_that_does_not_fit(document, field, reason):
    with pytest.raises(InvalidInput) as caught:
        services.layer_profile_upload(device=DeviceFactory(), model_spec=ModelSpecFactory(),
                                      document=document)
    assert caught.value.errors[0].field == field
    assert caught.value.errors[0].reason.startswith(reason)


def test_profile_upload_names_the_bad_layer_field():
    document = profile_document()
    document["layers"][2]["forward_s"] = -1
    with pytest.raises(InvalidInput) as caught:
        services.layer_profile_upload(device=DeviceFactory(), model_spec=ModelSpecFactory(),
                                      document=document)
    assert caught.value.errors[0].field == "profile.layers[2].forward_s"
    assert caught.value.errors[0].reason == "must not be negative"


def test_a_runs_fixed_costs_are_blended_into_the_profiles_figures():
    profile = LayerProfileFactory()
    device, spec = profile.device, profile.model_spec
    assert services.profile_costs_measured(device=device, model_spec=spec, overhead_s=0.0004,
                                           message_s=0.0003, pass_overhead_s=0.0001)
    profile.refresh_from_db()  # the first measurement is kept as it is
    assert (profile.overhead_s, profile.message_s, profile.pass_overhead_s) == (
        0.0004, 0.0003, 0.0001)
    # a second run's: half way (one noisy run does not decide the next plans); a figure it
    # did not measure stays
    services.profile_costs_measured(device=device, model_spec=spec, overhead_s=0.0008,
                                    pass_overhead_s=0.0003)
    profile.refresh_from_db()
    assert profile.overhead_s == pytest.approx(0.0006)
    assert profile.pass_overhead_s == pytest.approx(0.0002)
    assert profile.message_s == 0.0003
    # another model's profile, or none: nothing changes
    other = ModelSpecFactory(model="vgg5")
    assert not services.profile_costs_measured(device=device, model_spec=other,
                                               overhead_s=0.001)
    assert LayerProfile.objects.get(pk=profile.pk).overhead_s == pytest.approx(0.0006)
