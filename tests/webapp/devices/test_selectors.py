import pytest

from tests.webapp.factories import DeviceFactory, LayerProfileFactory, ModelSpecFactory
from webapp.devices import selectors, services
from webapp.devices.models import Device

pytestmark = pytest.mark.django_db


def test_device_by_credentials_needs_the_right_uid_and_key():
    device = DeviceFactory()
    other = DeviceFactory()
    assert selectors.device_by_credentials(uid=device.uid, key=device.key) == device
    assert selectors.device_by_credentials(uid=device.uid, key=other.key) is None
    assert selectors.device_by_credentials(uid="no-such-uid", key=device.key) is None
    services.device_retire(device=device)
    assert selectors.device_by_credentials(uid=device.uid, key=device.key) is None


def test_device_list_filters_by_status():
    online = DeviceFactory()
    DeviceFactory(status=Device.Status.OFFLINE)
    assert list(selectors.device_list(status="online")) == [online]
    assert selectors.device_list().count() == 2


def test_layer_profile_list_filters_by_device_and_spec():
    spec_a, spec_b = ModelSpecFactory(model="a"), ModelSpecFactory(model="b")
    mine = LayerProfileFactory(model_spec=spec_a)
    LayerProfileFactory(model_spec=spec_b, device=mine.device)
    LayerProfileFactory(model_spec=spec_a)
    assert list(selectors.layer_profile_list(device_id=mine.device_id,
                                             model_spec_id=spec_a.pk)) == [mine]
    assert selectors.layer_profile_list(model_spec_id=spec_a.pk).count() == 2
