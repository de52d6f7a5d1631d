"""Profiles: the list's query parameters are checked (a 400 naming the parameter, not a 500 from
the database), and an uploaded profile must have its model's number of layers (the zoo's, or
for a model outside it the one its first profile has), checked before it is parsed."""

from __future__ import annotations

import time

import pytest

from agent.zoo import MODELS, build_model
from tests.webapp.factories import (
    DeviceFactory,
    LayerProfileFactory,
    ModelSpecFactory,
    profile_document,
)
from webapp.common.exceptions import InvalidInput
from webapp.devices import services
from webapp.devices.models import LayerProfile
from webapp.devices.selectors import MAX_PROFILE_LAYERS, ZOO_NUM_LAYERS, model_num_layers

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("query", "field", "reason"), [
    ("device=99999999999999999999999", "device", "Ensure this value is less than or equal to "
                                                 "9223372036854775807."),
    ("model_spec=99999999999999999999999", "model_spec", "Ensure this value is less than or "
                                                         "equal to 9223372036854775807."),
    ("device=-1", "device", "Ensure this value is greater than or equal to 1."),
    ("model_spec=0", "model_spec", "Ensure this value is greater than or equal to 1."),
    ("device=pi", "device", "A valid integer is required."),
    ("device=9223372036854775808", "device", "Ensure this value is less than or equal to "
                                             "9223372036854775807."),
])
def test_a_bad_profile_filter_is_a_400_naming_the_parameter(api, query, field, reason):
    answer = api.get(f"/api/profiles/?{query}")
    assert answer.status_code == 400, answer.content
    assert answer.json()["errors"] == [{"field": field, "reason": reason}]


def test_the_largest_id_is_a_valid_filter_that_finds_nothing(api):
    LayerProfileFactory()
    answer = api.get("/api/profiles/?device=9223372036854775807&model_spec=9223372036854775807")
    assert answer.status_code == 200 and answer.json() == []


def test_the_zoos_layer_counts_are_the_agents():
    assert set(ZOO_NUM_LAYERS) == set(MODELS)
    for name in MODELS:
        for shape in ((3, 32, 32), (1, 8, 8)):
            model = build_model(name, input_shape=shape, num_classes=10)
            assert model.num_layers == ZOO_NUM_LAYERS[name], (name, shape)


def upload(agent, device, spec, document):
    return agent(device).post("/api/agent/profiles/",
                              {"model_spec": spec.pk, "profile": document}, format="json")


@pytest.mark.parametrize("layers", [3, 5, 50_000])
def test_a_zoo_models_profile_with_another_layer_count_is_a_400(agent, layers):
    spec = ModelSpecFactory()  # the mlp: 4 layers
    began = time.perf_counter()
    answer = upload(agent, DeviceFactory(), spec, profile_document(layers=layers))
    took = time.perf_counter() - began
    assert answer.status_code == 400, answer.content
    assert answer.json()["errors"] == [{
        "field": "profile.layers",
        "reason": f"has {layers} layers but mlp (model spec {spec.pk}) has 4"}]
    assert not LayerProfile.objects.exists()
    assert took < 3.0  # refused before the profile is parsed (which took 6 s)


def test_a_zoo_models_profile_with_its_layer_count_is_stored(agent):
    spec = ModelSpecFactory(model="vgg5", dataset="synthetic-cifar")
    answer = upload(agent, DeviceFactory(), spec, profile_document(model="vgg5", layers=5))
    assert answer.status_code == 201 and answer.json()["num_layers"] == 5


def test_another_models_first_profile_fixes_its_layer_count(agent):
    spec = ModelSpecFactory(model="resnet101")
    first, second, third = DeviceFactory(), DeviceFactory(), DeviceFactory()
    assert model_num_layers(model_spec=spec) is None
    assert upload(agent, first, spec, profile_document(model="resnet101", layers=37)
                  ).status_code == 201
    assert model_num_layers(model_spec=spec) == 37
    refused = upload(agent, second, spec, profile_document(model="resnet101", layers=36))
    assert refused.status_code == 400
    assert refused.json()["errors"][0] == {
        "field": "profile.layers",
        "reason": f"has 36 layers but resnet101 (model spec {spec.pk}) has 37"}
    assert upload(agent, third, spec, profile_document(model="resnet101", layers=37)
                  ).status_code == 201
    # the only profile's device may replace it with another count; not once others agree
    other = ModelSpecFactory(model="custom")
    assert upload(agent, first, other, profile_document(model="custom", layers=3)
                  ).status_code == 201
    assert upload(agent, first, other, profile_document(model="custom", layers=4)
                  ).status_code == 201
    assert LayerProfile.objects.get(model_spec=other).num_layers == 4


def test_a_first_profile_of_another_model_has_at_most_max_profile_layers(agent):
    spec = ModelSpecFactory(model="synthetic")
    too_many = MAX_PROFILE_LAYERS + 1
    answer = upload(agent, DeviceFactory(), spec,
                    profile_document(model="synthetic", layers=too_many))
    assert answer.status_code == 400
    assert answer.json()["errors"] == [{
        "field": "profile.layers",
        "reason": f"has {too_many} layers, more than the {MAX_PROFILE_LAYERS} a model may have"}]


def test_the_agents_profile_result_is_checked_the_same(agent):
    """The control connection's profile_result goes through the same service."""
    spec = ModelSpecFactory()
    with pytest.raises(InvalidInput) as refused:
        services.layer_profile_upload(device=DeviceFactory(), model_spec=spec,
                                      document=profile_document(layers=6))
    assert refused.value.errors[0].field == "profile.layers"
