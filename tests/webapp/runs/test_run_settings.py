"""A run's settings: replication periods and dynamic re-partition checks (fault tolerance) and
the stages' SGD (learning rate, momentum), chosen at creation (REST and run_create) and shown
with the run's generation."""

from __future__ import annotations

import inspect

import pytest

from tests.webapp.factories import DeviceFactory, ModelSpecFactory
from webapp.common.exceptions import InvalidInput
from webapp.runs import services
from webapp.runs.apis import RunListCreateApi
from webapp.runs.models import RUN_DEFAULTS, Run

pytestmark = pytest.mark.django_db

SETTINGS = ("chain_every", "global_every", "repartition_after", "repartition_every")


def body(**changes: object) -> dict[str, object]:
    return {"name": "r", "model_spec": ModelSpecFactory().pk,
            "devices": [DeviceFactory().pk, DeviceFactory().pk], "algorithms": ["ftpipehd"],
            **changes}


def test_a_run_takes_the_documented_defaults(api):
    created = api.post("/api/runs/", body(), format="json")
    assert created.status_code == 201, created.json()
    run = created.json()
    assert {k: run[k] for k in (*SETTINGS, "generation")} == {
        "chain_every": 2, "global_every": 10, "repartition_after": 10,
        "repartition_every": 100, "generation": 0}
    assert (run["lr"], run["momentum"]) == (0.1, 0.0)


def test_rest_and_the_service_default_to_the_run_model_s_defaults():
    """One source for a run's defaults: the model's fields. REST's input serializer and
    run_create's keywords take theirs from RUN_DEFAULTS; neither restates a literal."""
    model = {name: Run._meta.get_field(name).default for name in RUN_DEFAULTS}
    assert model == RUN_DEFAULTS
    rest = RunListCreateApi.RunCreateInput().fields
    assert {name: rest[name].default for name in RUN_DEFAULTS} == model
    keywords = inspect.signature(services.run_create).parameters
    assert {name: keywords[name].default for name in RUN_DEFAULTS} == model
    run = services.run_create(name="r", model_spec=ModelSpecFactory(),
                              devices=[DeviceFactory()], algorithms=["ftpipehd"])
    assert {name: getattr(run, name) for name in RUN_DEFAULTS} == model


def test_a_run_trains_with_the_sgd_it_was_created_with(api):
    created = api.post("/api/runs/", body(lr=0.05, momentum=0.9), format="json")
    assert created.status_code == 201, created.json()
    assert (created.json()["lr"], created.json()["momentum"]) == (0.05, 0.9)
    run = Run.objects.get(pk=created.json()["id"])
    assert (run.lr, run.momentum) == (0.05, 0.9)


def test_a_run_keeps_the_settings_it_was_created_with(api):
    chosen = {"chain_every": 0, "global_every": 5, "repartition_after": 1,
              "repartition_every": 0}
    created = api.post("/api/runs/", body(**chosen), format="json")
    assert created.status_code == 201, created.json()
    assert {k: created.json()[k] for k in SETTINGS} == chosen
    run = Run.objects.get(pk=created.json()["id"])
    assert {k: getattr(run, k) for k in SETTINGS} == chosen
    assert api.get(f"/api/runs/{run.pk}/").json()["repartition_after"] == 1


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("chain_every", -1, "Ensure this value is greater than or equal to 0"),
    ("global_every", "10", "must be an integer"),
    ("repartition_after", 0, "Ensure this value is greater than or equal to 1"),
    ("repartition_every", 2.5, "must be an integer"),
    ("repartition_every", None, "This field may not be null"),
])
def test_a_bad_setting_is_a_400_naming_it(api, field, value, reason):
    answer = api.post("/api/runs/", body(**{field: value}), format="json")
    assert answer.status_code == 400
    assert answer.json()["errors"][0]["field"] == field
    assert answer.json()["errors"][0]["reason"].startswith(reason)
    assert not Run.objects.exists()


@pytest.mark.parametrize(("field", "value"), [
    ("chain_every", -2), ("global_every", True), ("repartition_after", 0),
    ("repartition_every", 1.0), ("lr", 0.0), ("lr", float("inf")), ("lr", True),
    ("momentum", 1.0), ("momentum", 0.9995), ("momentum", float("nan")), ("momentum", "0.9")])
def test_run_create_checks_the_settings_itself(field, value):
    """The run form and the benches call the service without the API's validation."""
    with pytest.raises(InvalidInput) as caught:
        services.run_create(name="r", model_spec=ModelSpecFactory(), devices=[DeviceFactory()],
                            algorithms=["bsp"], **{field: value})
    assert caught.value.errors[0].field == field
    assert not Run.objects.exists()


def test_run_create_takes_the_settings():
    run = services.run_create(name="r", model_spec=ModelSpecFactory(), devices=[DeviceFactory()],
                              algorithms=["bsp"], chain_every=1, global_every=0,
                              repartition_after=3, repartition_every=7)
    run.refresh_from_db()
    assert (run.chain_every, run.global_every, run.repartition_after,
            run.repartition_every, run.generation, run.recovery) == (1, 0, 3, 7, 0, {})
