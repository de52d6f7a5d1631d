"""Global replicas are a device's own: it uploads only the layers of its stage in the run's
current plan (403 naming the field otherwise), only while the run is active (409), and
uploads and downloads name only layers of the run's model (400), so that a huge range cannot
tie up the web process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from safetensors.torch import load

from tests.webapp.factories import DeviceFactory, PlanFactory, RunFactory
from tests.webapp.runs.test_replicas import plan_document, put, staged_run, url, use_plan, weights
from webapp.common.exceptions import InvalidInput
from webapp.runs import replicas
from webapp.runs.models import Run, WeightReplica

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def replica_dir(settings, tmp_path: Path) -> Path:
    settings.REPLICA_DIR = tmp_path / "replicas"
    return settings.REPLICA_DIR


def stored() -> list[tuple[str, int, int]]:
    return sorted(WeightReplica.objects.values_list("device", "first", "last"))


def test_a_device_cannot_overwrite_another_stages_layers(agent):
    run, (a, b) = staged_run()  # a: layers 0..2, b: 3..5
    assert put(agent(b), run, 3, 5, 8, weights(3, 5)).status_code == 201
    for first, last, field in ((3, 5, "first"), (0, 5, "last"), (2, 3, "last"), (4, 4, "first")):
        answer = put(agent(a), run, first, last, 8, weights(first, last, value=666.0))
        assert answer.status_code == 403, (first, last, answer.content)
        assert answer.json() == {"detail": (
            f"{field}: layers {first}..{last} are not all of device {a.uid}'s stage of run "
            f"{run.pk} (layers 0..2): a device uploads its own stage's layers only")}
    assert stored() == [(b.uid, 3, 5)]
    merged = load(agent(a).get(url(run, 3, 5, 8)).content)
    assert float(merged["3.bias"][0]) == 4.0  # b's, untouched
    # its own layers, or part of them, it may
    assert put(agent(a), run, 0, 2, 8, weights(0, 2)).status_code == 201
    assert put(agent(a), run, 1, 2, 8, weights(1, 2)).status_code == 201


def test_replicas_of_a_stage_with_replicas_come_from_any_of_its_devices(agent):
    run, (a, b) = staged_run()
    c = DeviceFactory()
    run.run_devices.create(device=c, position=2)
    use_plan(run, (0, 2, [a, c]), (3, 5, [b]))
    assert put(agent(c), run, 0, 2, 8, weights(0, 2)).status_code == 201
    assert put(agent(c), run, 3, 5, 8, weights(3, 5)).status_code == 403


def test_after_a_repartition_the_new_plan_decides(agent):
    run, (a, b) = staged_run()
    use_plan(run, (0, 4, [a]), (5, 5, [b]))  # generation 1 moved layers 3 and 4 to a
    assert put(agent(a), run, 3, 4, 8, weights(3, 4)).status_code == 201
    assert put(agent(b), run, 3, 5, 8, weights(3, 5)).status_code == 403


def test_while_recovering_the_plan_replaced_and_the_one_deployed_both_count(agent):
    run, (a, b) = staged_run()
    run.state = Run.State.RECOVERING
    run.recovery = {"generation": 1, "lost": [a.uid],  # a was lost
                    "next_plan": plan_document((0, 5, [b]))}
    run.save(update_fields=["state", "recovery"])
    assert put(agent(a), run, 0, 2, 8, weights(0, 2)).status_code == 201  # a late upload
    assert put(agent(b), run, 0, 5, 8, weights(0, 5)).status_code == 201  # its new stage
    assert put(agent(a), run, 3, 5, 8, weights(3, 5)).status_code == 403


def test_while_starting_the_chosen_plan_decides(agent):
    run, (a, b) = staged_run()
    # a start after a failure: deployment still holds the earlier start's plan
    run.chosen_plan = PlanFactory(run=run, document=plan_document((0, 4, [b]), (5, 5, [a])))
    run.state = Run.State.STARTING
    run.save(update_fields=["chosen_plan", "state"])
    assert put(agent(b), run, 0, 4, 8, weights(0, 4)).status_code == 201
    assert put(agent(a), run, 0, 2, 8, weights(0, 2)).status_code == 403
    assert put(agent(a), run, 5, 5, 8, weights(5, 5)).status_code == 201


@pytest.mark.parametrize("state", [Run.State.DRAFT, Run.State.PLANNED, Run.State.FINISHED,
                                   Run.State.FAILED, Run.State.CANCELLED])
def test_a_run_that_is_not_active_takes_no_replica(agent, state):
    run, (a, _) = staged_run()
    Run.objects.filter(pk=run.pk).update(state=state)
    answer = put(agent(a), run, 0, 2, 8, weights(0, 2))
    assert answer.status_code == 409
    assert answer.json() == {
        "detail": f"run {run.pk} is {state}: it takes replicas only while it is starting, "
                  "running, recovering or paused",
        "state": state, "action": "upload a replica"}
    assert not WeightReplica.objects.exists()


@pytest.mark.parametrize("state", [Run.State.PAUSED, Run.State.RECOVERING,
                                   Run.State.STARTING])
def test_an_active_run_takes_them(agent, state):
    run, (a, _) = staged_run()
    run.chosen_plan = PlanFactory(run=run, document=run.deployment["plan"])
    run.state = state
    run.save(update_fields=["chosen_plan", "state"])
    assert put(agent(a), run, 0, 2, 8, weights(0, 2)).status_code == 201


def test_a_range_past_the_models_last_layer_is_a_400_for_uploads_and_downloads(agent):
    run, (a, _) = staged_run()  # 6 layers
    assert put(agent(a), run, 0, 2, 8, weights(0, 2)).status_code == 201
    for answer in (put(agent(a), run, 0, 4_000_000, 8, weights(0, 2)),
                   agent(a).get(url(run, 0, 6, 8)),
                   agent(a).get(url(run, 0, 4_000_000, 8))):
        assert answer.status_code == 400
        [error] = answer.json()["errors"]
        assert error["field"] == "last"
        assert error["reason"].endswith(f"past the last layer (5) of run {run.pk}'s model "
                                        "(6 layers)")
    assert agent(a).get(url(run, 0, 2, 8)).status_code == 200


def test_reading_a_huge_stored_range_is_bounded_by_the_model(agent, replica_dir):
    """A replica covering layers 0..4,000,000 (stored before these checks) no longer ties up
    the web process: a download names at most the model's layers."""
    run, (a, _) = staged_run()
    assert put(agent(a), run, 0, 2, 8, weights(0, 2)).status_code == 201
    WeightReplica.objects.filter(run=run).update(last=4_000_000)
    began = time.perf_counter()
    answer = agent(a).get(url(run, 0, 4_000_000, 8))
    assert answer.status_code == 400 and answer.json()["errors"][0]["field"] == "last"
    ok = agent(a).get(url(run, 0, 5, 8))
    assert ok.status_code == 200 and len(load(ok.content)) == 6
    assert time.perf_counter() - began < 2.0


def test_the_model_layer_count_before_a_plan_is_the_model_specs():
    run = RunFactory()  # the mlp, no plan yet
    assert replicas.run_num_layers(run) == 4
    with pytest.raises(InvalidInput) as refused:
        replicas.replica_read(run=run, first=0, last=4, applied=0)
    assert refused.value.errors[0].field == "last"
