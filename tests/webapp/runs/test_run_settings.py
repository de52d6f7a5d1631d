"""A run's settings: replication periods and dynamic re-partition checks (fault tolerance),
the stages' SGD (learning rate, momentum) and 1F1B's vertical sync and weight aggregation,
chosen at creation (REST and run_create), shown with the run's generation and sent to the
agents in their stage specs."""

from __future__ import annotations

import inspect

import pytest

from orchestrator.schedule import MAX_MICROBATCHES
from tests.webapp.factories import (
    DeviceFactory,
    LayerProfileFactory,
    ModelSpecFactory,
    RunFactory,
)
from webapp.common.exceptions import InvalidInput
from webapp.runs import services
from webapp.runs.apis import RunListCreateApi
from webapp.runs.models import RUN_DEFAULTS, Plan, Run

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
    assert (run["vertical_sync"], run["aggregate_every"]) == (True, 0)


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
    ("vertical_sync", "yes", "must be true or false"),
    ("vertical_sync", 1, "must be true or false"),
    ("vertical_sync", None, "This field may not be null"),
    ("aggregate_every", -1, "Ensure this value is greater than or equal to 0"),
    ("aggregate_every", 1001, "Ensure this value is less than or equal to 1000"),
    ("aggregate_every", 2.5, "must be an integer"),
    ("aggregate_every", "2", "must be an integer"),
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
    ("momentum", 1.0), ("momentum", 0.9995), ("momentum", float("nan")), ("momentum", "0.9"),
    ("vertical_sync", 1), ("vertical_sync", "true"), ("vertical_sync", None),
    ("aggregate_every", -1), ("aggregate_every", 1001), ("aggregate_every", True),
    ("aggregate_every", 2.0)])
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


def test_a_run_keeps_its_vertical_sync_and_weight_aggregation(api):
    created = api.post("/api/runs/", body(vertical_sync=False, aggregate_every=1000),
                       format="json")
    assert created.status_code == 201, created.json()
    assert (created.json()["vertical_sync"], created.json()["aggregate_every"]) == (False, 1000)
    run = Run.objects.get(pk=created.json()["id"])
    assert (run.vertical_sync, run.aggregate_every) == (False, 1000)
    shown = api.get(f"/api/runs/{run.pk}/").json()
    assert (shown["vertical_sync"], shown["aggregate_every"]) == (False, 1000)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b-sync"])
def test_a_synchronous_schedule_takes_vertical_sync_but_refuses_aggregation(api, schedule):
    """GPipe and synchronous 1F1B have no stale weights: vertical sync is kept (and ignored),
    a positive aggregate_every is a 400 naming it, and no run is made."""
    refused = api.post("/api/runs/", body(schedule=schedule, aggregate_every=2), format="json")
    assert refused.status_code == 400
    assert refused.json()["errors"] == [{
        "field": "aggregate_every",
        "reason": f"must be 0 under {schedule}: weight aggregation is for the stale weight "
                  "versions of asynchronous 1f1b"}]
    assert not Run.objects.exists()
    for flag in (True, False):
        created = api.post("/api/runs/", body(schedule=schedule, vertical_sync=flag,
                                              aggregate_every=0), format="json")
        assert created.status_code == 201, created.json()
        assert created.json()["schedule"] == schedule
        assert (created.json()["vertical_sync"], created.json()["aggregate_every"]) == (flag, 0)
    with pytest.raises(InvalidInput) as caught:
        services.run_create(name="r", model_spec=ModelSpecFactory(), devices=[DeviceFactory()],
                            algorithms=["bsp"], schedule=schedule, aggregate_every=1)
    assert caught.value.errors[0].field == "aggregate_every"


def planned(**settings: object) -> tuple[Run, Plan]:
    """A run of three profiled devices with its ftpipehd plan computed."""
    spec = ModelSpecFactory()
    devices = [DeviceFactory() for _ in range(3)]
    for k, device in enumerate(devices):
        LayerProfileFactory(device=device, model_spec=spec, layers=6, scale=1.0 + k)
    run = RunFactory(model_spec=spec, devices=devices, state=Run.State.PLANNING, **settings)
    plan = Plan.objects.create(run=run, algorithm="ftpipehd")
    assert services.plan_compute(plan_id=plan.pk)["status"] == "done"
    plan.refresh_from_db()
    return run, plan


@pytest.mark.parametrize(("settings", "sent"), [
    ({"schedule": "1f1b"}, (True, 0)),  # the defaults
    ({"schedule": "1f1b", "vertical_sync": True, "aggregate_every": 3}, (True, 3)),
    ({"schedule": "1f1b", "vertical_sync": False, "aggregate_every": 1}, (False, 1)),
    ({"schedule": "gpipe", "vertical_sync": True}, (False, 0)),  # no stale weights to sync
    ({"schedule": "1f1b-sync", "vertical_sync": True}, (False, 0)),
])
def test_every_stage_spec_carries_the_runs_vertical_sync_and_aggregation(settings, sent):
    run, plan = planned(**settings)
    specs = services.stage_specs(run=run, plan=plan)
    assert len(specs) > 1
    assert {(s.vertical_sync, s.aggregate_every) for s in specs.values()} == {sent}
    sent_json = [s.to_json() for s in specs.values()]
    assert all(type(s["vertical_sync"]) is bool and type(s["aggregate_every"]) is int
               for s in sent_json)


@pytest.mark.parametrize(("fields", "ok"), [
    ({"microbatches": 8, "batches": MAX_MICROBATCHES // 8}, True),
    ({"microbatches": 8, "batches": MAX_MICROBATCHES // 8 + 1}, False),
    ({"microbatches": 4, "batches": 1000, "epochs": 13}, False),
    ({"microbatches": 1024, "batches": 10**9}, False),
])
def test_a_run_is_refused_more_micro_batches_than_an_agent_can_schedule(api, fields, ok):
    # each agent builds its generation's whole schedule when it deploys: the demo's run of a
    # million batches grew its agents to 7 GB each before the first micro-batch
    created = api.post("/api/runs/", body(**fields), format="json")
    if ok:
        assert created.status_code == 201, created.json()
        return
    assert created.status_code == 400
    assert "batches" in created.json()["errors"][0]["field"]
    assert f"at most {MAX_MICROBATCHES:,}" in created.json()["errors"][0]["reason"]
    assert not Run.objects.exists()


def test_the_demo_s_run_until_stopped_is_one_a_run_may_train():
    from webapp.demo.demo import DemoOptions

    for microbatches in (1, 8, 24):
        options = DemoOptions(microbatches=microbatches)
        total = options.batches_to_train() * microbatches
        assert MAX_MICROBATCHES - microbatches < total <= MAX_MICROBATCHES
