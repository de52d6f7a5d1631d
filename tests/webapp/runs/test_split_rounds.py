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
from tests.webapp.factories import DeviceFactory, LayerProfileFactory, ModelSpecFactory
from webapp.devices.models import Device
from webapp.runs import replicas, selectors, services
from webapp.runs.models import MetricPoint, Run, RunDevice
from webapp.runs.services import deployment, split, split_rounds

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
