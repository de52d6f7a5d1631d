"""Split runs on the server (webapp.runs.services.split): created with clients and helpers,
planned with split-learning methods from the devices' profiles, deployed stage by stage (a
client's two, a helper's one per client), ready and done once each of a device's stages is."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.protocol import StageSpec
from tests.webapp.factories import DeviceFactory, LayerProfileFactory, ModelSpecFactory
from webapp.common.exceptions import InvalidInput
from webapp.devices.models import Device
from webapp.runs import services
from webapp.runs.models import Plan, Run, RunDevice
from webapp.runs.services import deployment, split

pytestmark = pytest.mark.django_db


def split_run(*, clients: int = 3, helpers: int = 2, methods: tuple[str, ...] = (
        "balanced-greedy", "exact"), **kwargs: Any) -> Run:
    spec = ModelSpecFactory()
    devices = [DeviceFactory() for _ in range(clients + helpers)]
    for k, device in enumerate(devices):
        # helpers four times the clients' speed
        LayerProfileFactory(device=device, model_spec=spec, layers=5,
                            scale=0.25 if k >= clients else 1.0 + 0.3 * k)
    settings = {"sigma1": 0, "sigma2": 2, "batches": 4, "epochs": 2, "time_limit_s": 1.0,
                **kwargs}
    return split.split_run_create(name="sl", model_spec=spec, clients=devices[:clients],
                                  helpers=devices[clients:], algorithms=list(methods),
                                  **settings)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(deployment, "device_command_send",
                        lambda *, uid, command: out.append((uid, command.to_json())))
    monkeypatch.setattr("webapp.runs.services.control.device_command_send",
                        lambda *, uid, command: out.append((uid, command.to_json())))
    return out


def test_a_split_run_keeps_its_roles_and_trains_one_micro_batch_a_batch() -> None:
    run = split_run()
    assert run.kind == "split" and run.schedule == "gpipe" and run.microbatches == 1
    assert (run.batches, run.epochs, run.chain_every, run.global_every) == (4, 2, 0, 0)
    uids = [rd.device.uid for rd in RunDevice.objects.filter(run=run).order_by("position")]
    assert run.split["clients"] == uids[:3] and run.split["helpers"] == uids[3:]
    assert run.split["cuts"] == {"sigma1": 0, "sigma2": 2}


@pytest.mark.parametrize(("change", "field", "reason"), [
    ({"sigma1": 2, "sigma2": 2}, "sigma2", "part-2"),
    ({"sigma2": 4}, "cuts.sigma2", "part-3"),  # the profile says 5 layers
    ({"sigma1": -1}, "sigma1", "at least 0"),
    ({"shard_split": "random"}, "shard_split", "iid or label-skew"),
    ({"batches": 0}, "batches", "positive"),
    ({"slot_ms": 0.0}, "slot_ms", "above 0"),
])
def test_bad_split_settings_are_refused_naming_the_field(change: dict[str, Any], field: str,
                                                         reason: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        split_run(**change)
    assert caught.value.errors[0].field == field and reason in caught.value.errors[0].reason
    assert not Run.objects.exists()


def test_no_helper_or_an_unknown_method_is_refused() -> None:
    with pytest.raises(InvalidInput, match=r"^helpers: needs at least one device"):
        split_run(helpers=0)
    with pytest.raises(InvalidInput, match=r"^algorithms\[0\]: unknown split-learning method"):
        split_run(methods=("ftpipehd",))


def test_planning_solves_the_study_of_the_measured_devices_with_each_method(
        django_capture_on_commit_callbacks: Any) -> None:
    run = split_run()
    with django_capture_on_commit_callbacks(execute=True):
        services.run_plan(run=run)
    run.refresh_from_db()
    assert run.state == Run.State.PLANNED
    plans = {p.algorithm: p for p in Plan.objects.filter(run=run)}
    assert set(plans) == {"balanced-greedy", "exact"}
    for plan in plans.values():
        assert plan.status == Plan.Status.DONE, plan.error
        doc = plan.document
        assert doc["kind"] == "split" and len(doc["run_plan"]["pipelines"]) == 3
        assert plan.period_s == pytest.approx(doc["schedule"]["makespan"]
                                              * doc["instance"]["slot_ms"] / 1000)
        # FedAvg groups: every part's copies, each round of 4 batches
        assert [len(g["members"]) for g in doc["run_plan"]["groups"]] == [3, 3, 3]
        assert all(g["every"] == [4, 4, 4] for g in doc["run_plan"]["groups"])
    # the exact method's batch is no longer than the greedy one's
    assert plans["exact"].period_s <= plans["balanced-greedy"].period_s + 1e-9


def test_a_helper_too_small_for_any_client_fails_planning_naming_it(
        django_capture_on_commit_callbacks: Any) -> None:
    run = split_run()
    helper = RunDevice.objects.filter(run=run).order_by("position").last().device
    Device.objects.filter(pk=helper.pk).update(memory_bytes=1000)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_plan(run=run)
    plan = Plan.objects.filter(run=run).first()
    assert plan.status == Plan.Status.FAILED and plan.error.startswith("helpers[1]:")
    assert "can serve no client" in plan.error


@pytest.mark.django_db(transaction=True)
def test_starting_deploys_every_stage_and_the_run_waits_for_each(sent) -> None:
    run = split_run()
    services.run_plan(run=run)
    services.run_start(run=Run.objects.get(pk=run.pk))
    deploys = [(uid, StageSpec.from_json(c["spec"])) for uid, c in sent
               if c["command"] == "deploy"]
    assert len(deploys) == 9  # 3 pipelines x 3 stages
    rows = {rd.device.uid: rd for rd in RunDevice.objects.filter(run=run)}
    clients, helpers = run.split["clients"], run.split["helpers"]
    for uid in clients:
        assert sorted((s.pipeline, s.stage) for d, s in deploys if d == uid) == [
            (clients.index(uid), 0), (clients.index(uid), 2)]
    served = sorted(s.pipeline for d, s in deploys if d in helpers)
    assert served == [0, 1, 2]
    assert all(rd.stage_state == RunDevice.StageState.DEPLOYING for rd in rows.values()
               if rd.parts)
    # a client ready with one of its two stages is not ready
    first = Device.objects.get(uid=clients[0])
    services.run_stage_ready(run=run, device=first, generation=0, pipeline=0, stage=0)
    assert RunDevice.objects.get(run=run, device=first).stage_state == "deploying"
    for uid, spec in deploys:
        services.run_stage_ready(run=run, device=Device.objects.get(uid=uid), generation=0,
                                 pipeline=spec.pipeline, stage=spec.stage)
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING
    assert {c["command"] for uid, c in sent if c["command"] == "start"} == {"start"}
    assert len([c for _, c in sent if c["command"] == "start"]) == 5  # once per device
    # done: a helper serving two clients is done with both
    for uid, spec in deploys[:-1]:
        services.run_stage_done(run=run, device=Device.objects.get(uid=uid), generation=0,
                                pipeline=spec.pipeline, stage=spec.stage)
    assert Run.objects.get(pk=run.pk).state == Run.State.RUNNING
    uid, spec = deploys[-1]
    services.run_stage_done(run=run, device=Device.objects.get(uid=uid), generation=0,
                            pipeline=spec.pipeline, stage=spec.stage)
    assert Run.objects.get(pk=run.pk).state == Run.State.FINISHED


@pytest.mark.django_db(transaction=True)
def test_a_report_naming_a_stage_the_device_does_not_hold_is_refused(sent) -> None:
    run = split_run()
    services.run_plan(run=run)
    services.run_start(run=Run.objects.get(pk=run.pk))
    client = Device.objects.get(uid=run.split["clients"][0])
    with pytest.raises(InvalidInput, match="holds no stage 1 of pipeline 0"):
        services.run_stage_ready(run=run, device=client, generation=0, pipeline=0, stage=1)
    with pytest.raises(InvalidInput, match="holds no stage"):
        services.run_stage_ready(run=run, device=client, generation=0)


def test_the_rest_api_creates_a_split_run_and_names_a_bad_field(api: Any) -> None:
    spec = ModelSpecFactory()
    devices = [DeviceFactory() for _ in range(3)]
    for device in devices:
        LayerProfileFactory(device=device, model_spec=spec, layers=4)
    body = {"name": "sl", "model_spec": spec.pk, "clients": [devices[0].pk, devices[1].pk],
            "helpers": [devices[2].pk], "algorithms": ["exact", "random-fcfs"], "sigma1": 0,
            "sigma2": 1, "batches": 5, "epochs": 2, "shard_split": "label-skew"}
    created = api.post("/api/runs/split/", body, format="json")
    assert created.status_code == 201, created.json()
    out = created.json()
    assert out["kind"] == "split" and out["split"]["shard_split"] == "label-skew"
    assert out["split"]["clients"] == [devices[0].uid, devices[1].uid]
    assert out["algorithms"] == ["exact", "random-fcfs"] and out["schedule"] == "gpipe"
    for change, field in (({"sigma2": 3}, "cuts.sigma2"), ({"helpers": [devices[0].pk]},
                                                           "helpers[0]"),
                          ({"algorithms": ["uniform"]}, "algorithms[0]"),
                          ({"helpers": []}, "helpers")):
        refused = api.post("/api/runs/split/", {**body, **change}, format="json")
        assert refused.status_code == 400, (change, refused.json())
        assert field in {e["field"] for e in refused.json()["errors"]}, refused.json()
    assert Run.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_each_clients_part_1_waits_for_the_others_at_each_batch(sent) -> None:
    run = split_run()
    services.run_plan(run=run)
    services.run_start(run=Run.objects.get(pk=run.pk))
    specs = [StageSpec.from_json(c["spec"]) for _, c in sent if c["command"] == "deploy"]
    assert {(s.stage, s.batch_sync) for s in specs} == {(0, True), (1, False), (2, False)}
    # pipeline 0's parts go to the server after every round (its held-out accuracy)
    assert {(s.pipeline == 0, s.global_every) for s in specs} == {(True, 4), (False, 0)}
