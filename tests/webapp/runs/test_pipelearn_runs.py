"""PipeLearn runs on the server (webapp.runs.services.pipelearn): created with a server and
devices, planned with PipeLearn, SFL and FL from the devices' profiles, deployed stage by
stage (a device's own, the server's copy for each device)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.protocol import StageSpec
from tests.webapp.factories import DeviceFactory, LayerProfileFactory, ModelSpecFactory
from webapp.common.exceptions import InvalidInput
from webapp.devices.models import Device
from webapp.runs import recovery, services
from webapp.runs.models import Plan, Run, RunDevice
from webapp.runs.services import deployment, pipelearn

pytestmark = pytest.mark.django_db


def pipelearn_run(*, devices_count: int = 3, **kwargs: Any) -> Run:
    spec = ModelSpecFactory(model="mlp", dataset="digits", batch_size=16)
    server, *devices = [DeviceFactory() for _ in range(devices_count + 1)]
    Device.objects.filter(pk=server.pk).update(memory_bytes=8 * 2**30)
    for k, device in enumerate([server, *devices]):
        LayerProfileFactory(device=device, model_spec=spec, layers=4,
                            scale=0.2 if k == 0 else 1.0 + 0.5 * k)
    settings = {"batches": 3, "epochs": 2, "clients": devices, **kwargs}
    return pipelearn.pipelearn_run_create(name="pl", model_spec=spec,
                                          server=Device.objects.get(pk=server.pk), **settings)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []

    def send(*, uid: str, command: Any) -> None:
        out.append((uid, command.to_json()))

    monkeypatch.setattr(deployment, "device_command_send", send)
    monkeypatch.setattr("webapp.runs.services.control.device_command_send", send)
    monkeypatch.setattr("webapp.runs.recovery.exclusion.device_command_send", send)
    return out


def test_a_pipelearn_run_keeps_its_server_and_devices() -> None:
    run = pipelearn_run()
    assert run.kind == "pipelearn" and run.algorithms == ["pipelearn", "sfl", "fl"]
    uids = [rd.device.uid for rd in RunDevice.objects.filter(run=run).order_by("position")]
    assert run.pipelearn == {"server": uids[0], "clients": uids[1:], "batch_size": 16,
                             "shard_split": "iid", "overrides": {}}


@pytest.mark.parametrize(("change", "field"), [
    ({"batch_size": 0}, "batch_size"), ({"batches": 0}, "batches"),
    ({"shard_split": "random"}, "shard_split"), ({"algorithms": ["split"]}, "algorithms[0]"),
    ({"clients": []}, "clients")])
def test_bad_settings_are_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        pipelearn_run(**change)
    assert caught.value.errors[0].field == field
    assert not Run.objects.exists()


def test_each_method_is_planned_from_the_profiles(django_capture_on_commit_callbacks: Any
                                                  ) -> None:
    run = pipelearn_run()
    with django_capture_on_commit_callbacks(execute=True):
        services.run_plan(run=run)
    run.refresh_from_db()
    assert run.state == Run.State.PLANNED, [p.error for p in run.plans.all()]
    plans = {p.algorithm: p for p in Plan.objects.filter(run=run)}
    for method, plan in plans.items():
        doc = plan.document
        assert plan.status == Plan.Status.DONE and doc["kind"] == "pipelearn"
        assert doc["method"] == method and len(doc["run_plan"]["pipelines"]) == 3
        assert plan.period_s == pytest.approx(doc["epoch_s"] / 3)
    # one split point for every device, so that each epoch averages whole models
    for method in ("pipelearn", "sfl"):
        splits = {d["split"] for d in plans[method].document["devices"].values()}
        assert len(splits) == 1, (method, splits)
        assert len(plans[method].document["run_plan"]["groups"]) == 2
    fl = plans["fl"].document["run_plan"]["pipelines"]
    assert {len(p["stages"]) for p in fl} == {1}
    sfl = plans["sfl"].document["run_plan"]["pipelines"]
    assert {p["microbatches"] for p in sfl} == {1}


def test_a_server_without_memory_for_every_devices_part_fails_the_plan_naming_it(
        django_capture_on_commit_callbacks: Any) -> None:
    run = pipelearn_run()
    server = Device.objects.get(uid=run.pipelearn["server"])
    Device.objects.filter(pk=server.pk).update(memory_bytes=1000)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_plan(run=run, algorithms=["sfl"])
    plan = Plan.objects.get(run=run)
    assert plan.status == Plan.Status.FAILED and plan.error.startswith("server: ")


@pytest.mark.django_db(transaction=True)
def test_starting_deploys_each_devices_stage_and_the_servers_copies(sent) -> None:
    run = pipelearn_run()
    services.run_plan(run=run)
    plan = Plan.objects.get(run=run, algorithm="pipelearn")
    services.run_start(run=Run.objects.get(pk=run.pk), plan=plan)
    deploys = [(uid, StageSpec.from_json(c["spec"])) for uid, c in sent
               if c["command"] == "deploy"]
    server, clients = run.pipelearn["server"], run.pipelearn["clients"]
    assert sorted((s.pipeline, s.stage) for uid, s in deploys if uid == server) == [
        (0, 1), (1, 1), (2, 1)]
    for j, client in enumerate(clients):
        [(uid, mine)] = [(u, s) for u, s in deploys if u == client]
        n = plan.document["devices"][client]["parallel_batches"]
        assert (mine.pipeline, mine.stage, mine.flush_every) == (j, 0, n)
        assert mine.batch_size == 16 // n and mine.shard == (j, 3)
        assert mine.microbatches == 3 * n * 2
    # ready once each of the server's three stages is
    for uid, s in deploys:
        services.run_stage_ready(run=run, device=Device.objects.get(uid=uid), generation=0,
                                 pipeline=s.pipeline, stage=s.stage)
    assert Run.objects.get(pk=run.pk).state == Run.State.RUNNING
    # a lost device fails the run, saying so
    recovery.run_device_lost(device=Device.objects.get(uid=server), reason="gone",
                             detected_by="heartbeat")
    run.refresh_from_db()
    assert run.state == Run.State.FAILED and "lost its server" in run.error


def test_the_rest_api_creates_a_pipelearn_run(api: Any) -> None:
    spec = ModelSpecFactory()
    devices = [DeviceFactory() for _ in range(3)]
    body = {"name": "pl", "model_spec": spec.pk, "server": devices[0].pk,
            "clients": [devices[1].pk, devices[2].pk], "batches": 4, "epochs": 2}
    created = api.post("/api/runs/pipelearn/", body, format="json")
    assert created.status_code == 201, created.json()
    out = created.json()
    assert out["kind"] == "pipelearn" and out["pipelearn"]["server"] == devices[0].uid
    refused = api.post("/api/runs/pipelearn/", {**body, "clients": [devices[0].pk]},
                       format="json")
    assert refused.status_code == 400
    assert refused.json()["errors"][0]["field"] == "clients[0]"


@pytest.mark.django_db(transaction=True)
def test_the_ghost_bars_are_the_time_models_epoch_in_the_runtimes_rows(sent, api: Any) -> None:
    run = pipelearn_run()
    services.run_plan(run=run)
    plan = Plan.objects.get(run=run, algorithm="pipelearn")
    services.run_start(run=Run.objects.get(pk=run.pk), plan=plan)
    ghost = api.get(f"/api/dashboard/runs/{run.pk}/planned/?start=0&end=600").json()
    server, clients = run.pipelearn["server"], run.pipelearn["clients"]
    assert ghost["batch_period_s"] == pytest.approx(plan.document["epoch_s"])
    rows = {(e["device"], e["stage"], e.get("pipeline", 0)) for e in ghost["events"]
            if e["kind"] in ("forward", "backward")}
    assert rows == {*((c, 0, j) for j, c in enumerate(clients)),
                    *((server, 1, j) for j in range(len(clients)))}
    # every device's N forwards an iteration, its iterations an epoch, the run's epochs
    for client in clients:
        n = plan.document["devices"][client]["parallel_batches"]
        forwards = [e for e in ghost["events"] if e["device"] == client
                    and e["kind"] == "forward"]
        assert sorted(e["microbatch"] for e in forwards) == list(range(n * 3 * 2))
    layout = api.get(f"/api/dashboard/runs/{run.pk}/plans/{plan.pk}/timeline/").json()
    assert layout["makespan_s"] == pytest.approx(plan.document["epoch_s"])
    assert {r["device"] for r in layout["rows"]} == {server, *clients}


def test_the_user_overrides_a_devices_split_and_n(django_capture_on_commit_callbacks: Any,
                                                   api: Any) -> None:
    run = pipelearn_run()
    spec, server = run.model_spec, Device.objects.get(uid=run.pipelearn["server"])
    clients = [Device.objects.get(uid=u) for u in run.pipelearn["clients"]]
    body = {"name": "pl", "model_spec": spec.pk, "server": server.pk,
            "clients": [c.pk for c in clients], "algorithms": ["pipelearn"], "batches": 3,
            "epochs": 2, "overrides": [{"device": clients[1].pk, "split": 3,
                                        "parallel_batches": 4}]}
    created = api.post("/api/runs/pipelearn/", body, format="json")
    assert created.status_code == 201, created.json()
    chosen = Run.objects.get(pk=created.json()["id"])
    assert chosen.pipelearn["overrides"] == {clients[1].uid: [3, 4]}
    with django_capture_on_commit_callbacks(execute=True):
        services.run_plan(run=chosen)
    doc = Plan.objects.get(run=chosen).document
    assert (doc["devices"][clients[1].uid]["split"],
            doc["devices"][clients[1].uid]["parallel_batches"]) == (3, 4)
    assert doc["microbatch_sizes"][1] == 4  # B = 16 in 4
    # a split point outside the model's layers, N below 1 or above B, a device not a client
    for override, field in (({"split": 4}, "overrides[0].split"),
                            ({"split": 0}, "overrides[0].split"),
                            ({"parallel_batches": 17}, "overrides[0].parallel_batches"),
                            ({"device": server.pk}, "overrides[0].device")):
        bad = {**body, "overrides": [{**body["overrides"][0], **override}]}
        refused = api.post("/api/runs/pipelearn/", bad, format="json")
        assert refused.status_code == 400, (override, refused.json())
        assert refused.json()["errors"][0]["field"] == field, refused.json()


@pytest.mark.django_db(transaction=True)
def test_a_lost_devices_epoch_finishes_without_it(sent) -> None:
    run = pipelearn_run()
    services.run_plan(run=run)
    services.run_start(run=Run.objects.get(pk=run.pk),
                       plan=Plan.objects.get(run=run, algorithm="sfl"))
    for uid, c in [(u, c) for u, c in sent if c["command"] == "deploy"]:
        spec = StageSpec.from_json(c["spec"])
        services.run_stage_ready(run=run, device=Device.objects.get(uid=uid), generation=0,
                                 pipeline=spec.pipeline, stage=spec.stage)
    server, clients = run.pipelearn["server"], run.pipelearn["clients"]
    recovery.run_device_lost(device=Device.objects.get(uid=clients[1]), reason="gone",
                             detected_by="disconnect")
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING
    excluded = {uid: c for uid, c in sent if c["command"] == "exclude"}
    assert set(excluded) == {server, clients[0], clients[2]}
    assert all(c["pipelines"] == [1] and c["uploader"] == 0 for c in excluded.values())
    parts = RunDevice.objects.get(run=run, device__uid=server).parts
    assert [p.get("dropped", False) for p in parts] == [False, True, False]


@pytest.mark.django_db(transaction=True)
def test_a_round_is_the_uploading_pipelines_n_times_the_epochs_iterations(sent) -> None:
    from webapp.runs.services.split_rounds import round_length

    run = pipelearn_run()
    services.run_plan(run=run)
    plan = Plan.objects.get(run=run, algorithm="pipelearn")
    services.run_start(run=Run.objects.get(pk=run.pk), plan=plan)
    n = plan.document["run_plan"]["pipelines"][0]["microbatches"]
    assert round_length(Run.objects.get(pk=run.pk)) == 3 * n  # 3 iterations an epoch
