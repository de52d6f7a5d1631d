"""A split run that loses a client or a helper (webapp.runs.recovery.split): the survivors
halt, the study is solved again on those left (a lost helper's clients go to another), and
the next generation resumes at the last round whose aggregated model the server holds,
restored from it; a lost client's shard leaves with it, the others keep theirs."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.protocol import StageSpec
from tests.webapp.factories import DeviceFactory, LayerProfileFactory, ModelSpecFactory
from tests.webapp.runs.test_split_rounds import PARTS, trained_blobs
from webapp.devices.models import Device
from webapp.runs import recovery, replicas, services
from webapp.runs.models import Generation, Run, RunDevice
from webapp.runs.services import deployment, split

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []

    def send(*, uid: str, command: Any) -> None:
        out.append((uid, command.to_json()))

    monkeypatch.setattr(deployment, "device_command_send", send)
    for module in ("services.control", "recovery.replan", "recovery.split", "recovery.commit",
                   "recovery.exclusion"):
        monkeypatch.setattr(f"webapp.runs.{module}.device_command_send", send)
    monkeypatch.setattr("webapp.runs.tasks.split_round_evaluate.delay", lambda *a: None)
    return out


def running(settings: Any, tmp_path: Any, *, clients: int = 3, helpers: int = 2) -> Run:
    settings.REPLICA_DIR = tmp_path / "replicas"
    spec = ModelSpecFactory(model="mlp", dataset="digits")
    devices = [DeviceFactory() for _ in range(clients + helpers)]
    for k, device in enumerate(devices):
        LayerProfileFactory(device=device, model_spec=spec, layers=4,
                            scale=0.3 if k >= clients else 1.0 + 0.2 * k)
    run = split.split_run_create(name="sl", model_spec=spec, clients=devices[:clients],
                                 helpers=devices[clients:], algorithms=["balanced-greedy"],
                                 sigma1=0, sigma2=2, batches=4, epochs=3,
                                 shard_split="label-skew")
    services.run_plan(run=run)
    services.run_start(run=Run.objects.get(pk=run.pk))
    ready_all(run, generation=0)
    run = Run.objects.get(pk=run.pk)
    assert run.state == Run.State.RUNNING
    return run


def ready_all(run: Run, *, generation: int) -> None:
    for rd in RunDevice.objects.filter(run=run).select_related("device"):
        for part in rd.parts:
            services.run_stage_ready(run=run, device=rd.device, generation=generation,
                                     pipeline=part["pipeline"], stage=part["stage"])


def round_uploaded(run: Run, applied: int) -> None:
    """Pipeline 0's three parts at ``applied``, as its client and helper upload them."""
    doc = run.chosen_plan.document["run_plan"]["pipelines"][0]["stages"]
    blobs = trained_blobs(run.pk, steps=10, applied=applied, run=run.pk)
    for (a, e), stage in zip(PARTS, doc, strict=True):
        replicas.replica_store(run=run, device=Device.objects.get(uid=stage["devices"][0]),
                               first=a, last=e, applied=applied, data=blobs[(a, e)])


def halt_survivors(run: Run, sent: list[tuple[str, dict[str, Any]]]) -> None:
    for uid, command in list(sent):
        if command["command"] == "halt":
            recovery.run_stage_halted(run=run, device=Device.objects.get(uid=uid),
                                      generation=command["generation"], holdings=[])


def deploys(sent: list[tuple[str, dict[str, Any]]], generation: int
            ) -> list[tuple[str, StageSpec, list[dict[str, Any]]]]:
    return [(uid, StageSpec.from_json(c["spec"]), c.get("restore") or []) for uid, c in sent
            if c["command"] == "deploy" and c["spec"].get("generation", 0) == generation]


def test_a_lost_helpers_clients_go_to_the_other_and_resume_at_the_last_round(
        settings: Any, tmp_path: Any, sent: list[tuple[str, dict[str, Any]]]) -> None:
    run = running(settings, tmp_path)
    clients, helpers = run.split["clients"], run.split["helpers"]
    first = {s.pipeline: s for _, s, _ in deploys(sent, 0)}
    round_uploaded(run, 4)  # round 1 ended; round 2 under way
    lost = helpers[0]
    recovery.run_device_lost(device=Device.objects.get(uid=lost), reason="gone",
                             detected_by="heartbeat")
    run.refresh_from_db()
    assert run.state == Run.State.RECOVERING
    halted = {uid for uid, c in sent if c["command"] == "halt"}
    assert halted == set(clients) | {helpers[1]}
    halt_survivors(run, sent)
    nxt = deploys(sent, 1)
    # every client's three stages again, part-2 of each on the helper left
    assert sorted((s.pipeline, s.stage) for _, s, _ in nxt) == [
        (p, k) for p in range(3) for k in range(3)]
    assert {uid for uid, s, _ in nxt if s.stage == 1} == {helpers[1]}
    for _, s, restore in nxt:
        assert s.first_microbatch == 4 and s.generation == 1
        assert restore == [{"layers": list(s.layers), "applied": 4, "source": "central"}]
        # each client keeps its own shard
        assert s.shard == first[s.pipeline].shard
    generation = Generation.objects.get(run=run, number=1)
    assert generation.resume_microbatch == 4 and generation.lost == [lost]
    ready_all(Run.objects.get(pk=run.pk), generation=1)
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING and run.generation == 1
    assert {uid for uid, c in sent if c["command"] == "start"
            and c.get("generation") == 1} == set(clients) | {helpers[1]}
    kinds = [f.kind for f in run.fault_events.order_by("id")]
    assert kinds[-5:] == ["device_lost", "recovery_started", "repartitioned",
                          "weights_redistributed", "recovered"]


def test_a_lost_client_leaves_and_the_round_goes_on_without_it(
        settings: Any, tmp_path: Any, sent: list[tuple[str, dict[str, Any]]]) -> None:
    run = running(settings, tmp_path)
    clients = run.split["clients"]
    first = {s.pipeline: (uid, s) for uid, s, _ in deploys(sent, 0)}
    lost = clients[0]  # pipeline 0's: the lowest left, 1, sends the rounds' averages now
    recovery.run_device_lost(device=Device.objects.get(uid=lost), reason="gone",
                             detected_by="disconnect")
    run.refresh_from_db()
    # nobody halts, nothing is re-planned: the run trains on, generation 0
    assert run.state == Run.State.RUNNING and run.generation == 0
    assert not [c for _, c in sent if c["command"] in ("halt", "deploy")
                and c.get("generation", 0) == 1]
    excluded = {uid: c for uid, c in sent if c["command"] == "exclude"}
    helper = first[0][1].stage_devices[1][0]
    serving = {s.stage_devices[1][0] for _, s in first.values()}
    assert set(excluded) == {clients[1], clients[2], *serving}
    assert all((c["pipelines"], c["uploader"]) == ([0], 1) for c in excluded.values())
    rows = {rd.device.uid: rd for rd in RunDevice.objects.filter(run=run)
            .select_related("device")}
    assert rows[lost].stage_state == "lost" and rows[lost].stage is None
    # the helper's copy for the lost client is counted out
    assert next(p for p in rows[helper].parts if p["pipeline"] == 0)["dropped"] is True
    kinds = [(f.kind, f.device, f.detail.get("goes_on_without"))
             for f in run.fault_events.order_by("id")]
    assert kinds[-1] == ("device_lost", lost, True)
    # the run finishes with the stages left
    for uid, rd in rows.items():
        for part in rd.parts:
            if uid != lost and not part.get("dropped"):
                services.run_stage_done(run=run, device=rd.device, generation=0,
                                        pipeline=part["pipeline"], stage=part["stage"])
    assert Run.objects.get(pk=run.pk).state == Run.State.FINISHED


def test_no_helper_left_fails_the_run_naming_it(
        settings: Any, tmp_path: Any, sent: list[tuple[str, dict[str, Any]]]) -> None:
    run = running(settings, tmp_path, clients=2, helpers=1)
    helper = Device.objects.get(uid=run.split["helpers"][0])
    recovery.run_device_lost(device=helper, reason="gone", detected_by="heartbeat")
    halt_survivors(Run.objects.get(pk=run.pk), sent)
    run.refresh_from_db()
    assert run.state == Run.State.FAILED and "no helper is left" in run.error


def test_losing_the_last_client_still_training_finishes_the_run(
        settings: Any, tmp_path: Any, sent: list[tuple[str, dict[str, Any]]]) -> None:
    run = running(settings, tmp_path)
    clients = run.split["clients"]
    lost = clients[2]
    # every stage but the lost client's pipeline's ends
    for rd in RunDevice.objects.filter(run=run).select_related("device"):
        for part in rd.parts:
            if part["pipeline"] != 2:
                services.run_stage_done(run=run, device=rd.device, generation=0,
                                        pipeline=part["pipeline"], stage=part["stage"])
    assert Run.objects.get(pk=run.pk).state == Run.State.RUNNING
    recovery.run_device_lost(device=Device.objects.get(uid=lost), reason="gone",
                             detected_by="disconnect")
    assert Run.objects.get(pk=run.pk).state == Run.State.FINISHED
