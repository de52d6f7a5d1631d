"""A split run's rounds evaluated on the server (webapp.runs.services.split_rounds): once
pipeline 0's three parts at a round's end are uploaded, the aggregated model's held-out
accuracy is measured once, stored as a metric point and said in a round_evaluated event."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agent.data import load_dataset
from agent.weights import snapshot, state_refs, to_bytes
from agent.zoo import build_model
from orchestrator.events import TimelineEvent
from tests.webapp.factories import (
    DeviceFactory,
    LayerProfileFactory,
    ModelSpecFactory,
    RunFactory,
)
from webapp.devices.models import Device
from webapp.runs import replicas, selectors, services
from webapp.runs.models import MetricPoint, Run, RunDevice
from webapp.runs.services import deployment, split, split_rounds, timeline_events_store

pytestmark = pytest.mark.django_db(transaction=True)

PARTS = [(0, 0), (1, 2), (3, 3)]  # mlp's four layers cut after 0 and 2


def trained_blobs(seed: int, *, steps: int, applied: int, run: int) -> dict[tuple[int, int],
                                                                           bytes]:
    """An MLP trained ``steps`` SGD steps on digits, as its three parts' safetensors."""
    data = load_dataset("digits")
    zoo = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes,
                      seed=seed)
    model = zoo.full()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = data.microbatch(step, 64, seed=0)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return {(a, e): to_bytes(snapshot(state_refs(zoo.stage(a, e), a)), run=run, first=a,
                             last=e, applied=applied) for a, e in PARTS}


def test_held_out_accuracy_is_the_models_on_the_last_fifth_of_the_data() -> None:
    untrained = split_rounds.held_out_accuracy(
        model="mlp", dataset="digits", seed=3,
        parts=trained_blobs(3, steps=0, applied=0, run=1))
    trained = split_rounds.held_out_accuracy(
        model="mlp", dataset="digits", seed=3,
        parts=trained_blobs(3, steps=120, applied=0, run=1))
    assert untrained[1] == trained[1] == 360  # 20% of digits' 1,797 samples
    assert untrained[0] < 0.3 and trained[0] > 0.45


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """No agent to send commands to; the evaluations queued, not run."""
    monkeypatch.setattr(deployment, "device_command_send", lambda **kwargs: None)
    monkeypatch.setattr("webapp.runs.services.control.device_command_send",
                        lambda **kwargs: None)
    queued: list[tuple[int, int]] = []
    monkeypatch.setattr("webapp.runs.tasks.split_round_evaluate.delay",
                        lambda run_id, applied: queued.append((run_id, applied)))
    return queued


def running_split_run(settings: Any, tmp_path: Any) -> Run:
    settings.REPLICA_DIR = tmp_path / "replicas"
    spec = ModelSpecFactory(model="mlp", dataset="digits")
    devices = [DeviceFactory() for _ in range(3)]
    for device in devices:
        LayerProfileFactory(device=device, model_spec=spec, layers=4)
    run = split.split_run_create(name="sl", model_spec=spec, clients=devices[:2],
                                 helpers=devices[2:], algorithms=["balanced-greedy"],
                                 sigma1=0, sigma2=2, batches=5, epochs=2)
    services.run_plan(run=run)
    services.run_start(run=Run.objects.get(pk=run.pk))
    for rd in RunDevice.objects.filter(run=run).select_related("device"):
        for part in rd.parts:
            services.run_stage_ready(run=run, device=rd.device, generation=0,
                                     pipeline=part["pipeline"], stage=part["stage"])
    run = Run.objects.get(pk=run.pk)
    assert run.state == Run.State.RUNNING
    return run


def test_a_round_is_evaluated_once_its_three_parts_are_in(
        settings: Any, tmp_path: Any, quiet: list[tuple[int, int]]) -> None:
    run = running_split_run(settings, tmp_path)
    client0 = Device.objects.get(uid=run.split["clients"][0])
    helper = Device.objects.get(uid=run.chosen_plan.document["run_plan"]["pipelines"][0]
                                ["stages"][1]["devices"][0])
    blobs = trained_blobs(run.pk, steps=60, applied=5, run=run.pk)
    for (a, e), device in zip(PARTS, (client0, helper, client0), strict=True):
        replicas.replica_store(run=run, device=device, first=a, last=e, applied=5,
                               data=blobs[(a, e)])
        queued = split_rounds.split_round_stored(run=run, applied=5)
        assert queued == ((a, e) == PARTS[-1])
    assert quiet == [(run.pk, 5)]
    accuracy = split_rounds.split_round_evaluate(run_id=run.pk, applied=5)
    assert accuracy is not None and accuracy > 0.3
    # once: a second evaluation of the same round stores nothing more
    assert split_rounds.split_round_evaluate(run_id=run.pk, applied=5) is None
    points = MetricPoint.objects.filter(run=run, kind="test_accuracy")
    assert [p.value for p in points] == [accuracy]
    rounds = split_rounds.split_rounds(run=run)
    assert [(r["round"], r["applied"], r["samples"]) for r in rounds] == [(1, 5, 360)]
    assert rounds[0]["accuracy"] == accuracy
    assert any(f["kind"] == "round_evaluated" for f in selectors.run_faults(run=run))


def test_a_pipeline_run_queues_no_evaluation(quiet: list[tuple[int, int]]) -> None:
    run = Run(pk=1, kind="pipeline")
    assert split_rounds.split_round_stored(run=run, applied=5) is False
    assert quiet == []


def test_the_pages_read_a_split_runs_plan_ghosts_and_progress(
        settings: Any, tmp_path: Any, quiet: list[tuple[int, int]], api: Any) -> None:
    run = running_split_run(settings, tmp_path)
    clients = run.split["clients"]
    doc = run.chosen_plan.document
    planned = doc["makespan_s"]
    # the layout: clients' row, helpers' row (part-2 of whom)
    layouts = api.get(f"/api/dashboard/runs/{run.pk}/plans/layouts/").json()["layouts"]
    assert [len(s["devices"]) for s in layouts[0]["stages"]] == [2, 1]
    assert layouts[0]["stages"][1]["devices"][0]["passes"].startswith("part-2 of ")
    # two batches trained by both clients, the second by the first only so far
    events = []
    for m, clients_done in ((0, 2), (1, 2), (2, 1)):
        for j in range(clients_done):
            events += [TimelineEvent(run.pk, clients[j], 0, "forward", m, 0, m + 0.1 * j,
                                     m + 0.1 * j + 0.05, pipeline=j),
                       TimelineEvent(run.pk, clients[j], 0, "backward", m, 0, m + 0.5,
                                     m + 0.6 + 0.1 * j, pipeline=j)]
    timeline_events_store(run=run, records=events)
    progress = api.get(f"/api/runs/{run.pk}/split/").json()
    assert progress["planned_makespan_s"] == pytest.approx(planned)
    assert [b["batch"] for b in progress["batches"]] == [0, 1]
    assert progress["batches"][0]["makespan_s"] == pytest.approx(0.7)
    assert [(c["device"], c["batches_done"], c["batches"]) for c in progress["clients"]] == [
        (clients[0], 3, 10), (clients[1], 2, 10)]
    assert all(c["helper"] == doc["helpers"][0] for c in progress["clients"])
    # ghosts: the schedule's batch once every planned makespan from the first event
    ghost = api.get(f"/api/dashboard/runs/{run.pk}/planned/?start=0&end=2.5").json()
    assert ghost["batch_period_s"] == pytest.approx(planned)
    assert ghost["anchor_s"] == 0.0
    per_batch = {}
    for e in ghost["events"]:
        per_batch.setdefault(e["microbatch"], []).append(e)
    assert min(per_batch[0], key=lambda e: e["start"])["start"] == 0.0
    assert {e.get("pipeline", 0) for e in ghost["events"]} == {0, 1}
    # a pipeline run has no split progress
    assert api.get(f"/api/runs/{RunFactory().pk}/split/").status_code == 409


def test_a_rounds_model_is_kept_until_measured_after_later_rounds_uploads(
        settings: Any, tmp_path: Any, quiet: list[tuple[int, int]]) -> None:
    # a busy worker evaluates round 1 after rounds 2 and 3 were uploaded: its parts are kept
    # (the two newest of each layer range were, and round 1 went unmeasured)
    run = running_split_run(settings, tmp_path)
    client0 = Device.objects.get(uid=run.split["clients"][0])
    helper = Device.objects.get(uid=run.chosen_plan.document["run_plan"]["pipelines"][0]
                                ["stages"][1]["devices"][0])
    for applied in (5, 10, 15):
        blobs = trained_blobs(run.pk, steps=5, applied=applied, run=run.pk)
        for (a, e), device in zip(PARTS, (client0, helper, client0), strict=True):
            replicas.replica_store(run=run, device=device, first=a, last=e, applied=applied,
                                   data=blobs[(a, e)])
    assert split_rounds.split_round_evaluate(run_id=run.pk, applied=5) is not None
