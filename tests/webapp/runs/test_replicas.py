"""Global replicas: agents upload their stage's weights as safetensors and download any layer
range merged from what the server holds (webapp.runs.replicas and its REST endpoint)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load, save

from tests.webapp.factories import DeviceFactory, RunFactory
from webapp.common.exceptions import InvalidInput
from webapp.runs import replicas
from webapp.runs.models import Run, RunDevice, WeightReplica

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def replica_dir(settings, tmp_path: Path) -> Path:
    settings.REPLICA_DIR = tmp_path / "replicas"
    return settings.REPLICA_DIR


def weights(a: int, e: int, *, value: float = 1.0, **metadata: object) -> bytes:
    """A stage's weights of layers a..e: a weight and a bias per layer, every entry
    ``value + layer``; ``metadata`` as the agent writes it (run, first, last, applied)."""
    tensors = {}
    for layer in range(a, e + 1):
        tensors[f"{layer}.weight"] = torch.full((2, 3), value + layer)
        tensors[f"{layer}.bias"] = torch.full((2,), value + layer)
    return save(tensors, metadata={k: str(v) for k, v in metadata.items()} or None)


def plan_document(*stages: tuple[int, int, list]) -> dict:
    """A plan whose stages hold layers first..last on these devices."""
    return {"algorithm": "test", "stages": [
        {"layers": [a, e], "devices": [d.uid for d in devices]} for a, e, devices in stages]}


def use_plan(run: Run, *stages: tuple[int, int, list]) -> None:
    """Make ``stages`` the run's current plan (a run's generation as it runs)."""
    run.deployment = {**run.deployment, "plan": plan_document(*stages)}
    run.save(update_fields=["deployment"])
    for k, (_, _, devices) in enumerate(stages):
        RunDevice.objects.filter(run=run, device__in=devices).update(stage=k)


def staged_run(stages: int = 2) -> tuple[Run, list]:
    """A running run of a 3 x ``stages``-layer model, device k holding layers 3k..3k+2."""
    devices = [DeviceFactory() for _ in range(stages)]
    run = RunFactory(state=Run.State.RUNNING, devices=devices)
    use_plan(run, *[(3 * k, 3 * k + 2, [d]) for k, d in enumerate(devices)])
    return run, devices


def url(run: Run, first: int | str, last: int | str, applied: int | str) -> str:
    return f"/api/agent/runs/{run.pk}/replicas/?first={first}&last={last}&applied={applied}"


def put(client, run: Run, first, last, applied, data: bytes):
    return client.put(url(run, first, last, applied), data=data,
                      content_type="application/octet-stream")


def stored_files(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file())


# --------------------------------------------------------------------------- REST


def test_two_stages_upload_and_a_new_stage_downloads_a_range_across_both(agent, replica_dir):
    run, (a, b) = staged_run()
    first = put(agent(a), run, 0, 2, 8, weights(0, 2, run=run.pk, first=0, last=2, applied=8))
    second = put(agent(b), run, 3, 5, 8, weights(3, 5))
    assert first.status_code == 201, first.json()
    assert second.status_code == 201, second.json()
    row = WeightReplica.objects.get(pk=first.json()["id"])
    assert first.json() == {"id": row.pk, "bytes": row.bytes, "sha256": row.sha256}
    assert (row.device, row.first, row.last, row.applied) == (a.uid, 0, 2, 8)
    assert row.path == f"run-{run.pk}/0-2@8.safetensors"
    on_disk = (replica_dir / row.path).read_bytes()
    assert hashlib.sha256(on_disk).hexdigest() == row.sha256 and len(on_disk) == row.bytes

    answer = agent(a).get(url(run, 1, 4, 8))
    assert answer.status_code == 200
    assert answer["Content-Type"] == "application/octet-stream"
    merged = load(answer.content)
    assert sorted(merged) == sorted(f"{k}.{n}" for k in range(1, 5) for n in ("weight", "bias"))
    for layer in range(1, 5):
        assert torch.equal(merged[f"{layer}.weight"], torch.full((2, 3), 1.0 + layer))
    # the same answer for an agent that asks for the raw bytes explicitly
    explicit = agent(b).get(url(run, 1, 4, 8), HTTP_ACCEPT="application/octet-stream")
    assert explicit.status_code == 200
    assert {k: v.tolist() for k, v in load(explicit.content).items()} == {
        k: v.tolist() for k, v in merged.items()}


def test_the_download_carries_the_asked_range_in_its_metadata(agent):
    run, (a, _) = staged_run()
    put(agent(a), run, 0, 2, 4, weights(0, 2))
    blob = replicas.replica_read(run=run, first=1, last=2, applied=4)
    header = replicas._metadata(blob)
    assert header == {"run": str(run.pk), "first": "1", "last": "2", "applied": "4"}


def test_a_missing_layer_is_a_404_naming_it(agent):
    run, (a, b) = staged_run()
    put(agent(a), run, 0, 2, 8, weights(0, 2))
    put(agent(b), run, 3, 5, 4, weights(3, 5))  # an older applied: not the one asked
    answer = agent(a).get(url(run, 0, 5, 8))
    assert answer.status_code == 404
    assert answer["Content-Type"] == "application/json"
    assert answer.json()["layer"] == 3
    assert answer.json()["detail"].startswith("layer 3: ")
    # JSON even to an agent that accepts only the raw bytes
    raw = agent(a).get(url(run, 0, 5, 8), HTTP_ACCEPT="application/octet-stream")
    assert raw.status_code == 404 and raw.json()["layer"] == 3


def test_the_server_keeps_the_two_newest_applied_of_a_range(
        agent, replica_dir, django_capture_on_commit_callbacks):
    run, (a, _) = staged_run()
    for applied in (4, 8, 12):
        with django_capture_on_commit_callbacks(execute=True):
            assert put(agent(a), run, 0, 2, applied, weights(0, 2, value=applied)
                       ).status_code == 201
    assert sorted(WeightReplica.objects.values_list("applied", flat=True)) == [8, 12]
    assert stored_files(replica_dir) == ["0-2@12.safetensors", "0-2@8.safetensors"]
    assert replicas.replica_holdings(run=run) == [
        {"layers": [0, 2], "applied": 8, "kind": "central"},
        {"layers": [0, 2], "applied": 12, "kind": "central"}]
    # the same applied again replaces it
    with django_capture_on_commit_callbacks(execute=True):
        assert put(agent(a), run, 0, 2, 12, weights(0, 2, value=100)).status_code == 201
    assert WeightReplica.objects.count() == 2
    again = load(agent(a).get(url(run, 0, 0, 12)).content)
    assert torch.equal(again["0.bias"], torch.full((2,), 100.0))
    # older than both kept: refused, nothing written
    answer = put(agent(a), run, 0, 2, 4, weights(0, 2))
    assert answer.status_code == 400
    assert answer.json()["errors"][0]["field"] == "applied"
    assert stored_files(replica_dir) == ["0-2@12.safetensors", "0-2@8.safetensors"]


def _oversize(settings) -> bytes:
    settings.REPLICA_MAX_BYTES = 64
    return weights(0, 1)


@pytest.mark.parametrize(("make", "query", "field", "reason"), [
    (lambda s: b"not safetensors at all", (0, 1, 4), "body", "is not safetensors"),
    (lambda s: b"", (0, 1, 4), "body", "is empty"),
    (lambda s: weights(0, 2), (0, 1, 4), "body", "tensor '2.bias' is of layer 2, outside layers "
                                                 "0..1"),
    (lambda s: save({"weight": torch.zeros(2)}), (0, 1, 4), "body",
     "tensor 'weight' is not named '<layer index>.<name>'"),
    (lambda s: weights(0, 1, applied=8), (0, 1, 4), "body",
     "metadata applied is '8', the request says 4"),
    (_oversize, (0, 1, 4), "body", "is "),
    (lambda s: weights(0, 1), (2, 1, 4), "last", "must be at least first (2), is 1"),
    (lambda s: weights(0, 1), ("x", 1, 4), "first", "A valid integer is required"),
    (lambda s: weights(0, 1), (0, -1, 4), "last", "Ensure this value is greater than or equal"),
    (lambda s: weights(0, 1), (0, 1, ""), "applied", "A valid integer is required"),
])
def test_a_bad_upload_is_a_400_naming_the_field_and_nothing_is_stored(
        agent, settings, replica_dir, make, query, field, reason):
    run, (a, _) = staged_run()
    answer = put(agent(a), run, *query, make(settings))
    assert answer.status_code == 400, answer.content
    error = answer.json()["errors"][0]
    assert error["field"] == field
    assert error["reason"].startswith(reason), error["reason"]
    assert not WeightReplica.objects.exists()
    assert stored_files(replica_dir) == []


def test_a_missing_query_parameter_is_named(agent):
    run, (a, _) = staged_run()
    answer = agent(a).put(f"/api/agent/runs/{run.pk}/replicas/?first=0&last=1",
                          data=weights(0, 1), content_type="application/octet-stream")
    assert answer.status_code == 400
    assert answer.json()["errors"] == [{"field": "applied", "reason": "This field is required."}]
    assert agent(a).get(f"/api/agent/runs/{run.pk}/replicas/?first=0").status_code == 400


def test_a_body_larger_than_djangos_form_limit_is_taken(agent, settings):
    """Django's request.body stops at DATA_UPLOAD_MAX_MEMORY_SIZE; replicas are bigger."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    run, (a, _) = staged_run()
    big = save({"0.weight": torch.zeros(4096)})
    answer = put(agent(a), run, 0, 0, 4, big)
    assert answer.status_code == 201, answer.content
    assert answer.json()["bytes"] == len(big)


def test_only_a_staged_device_of_the_run_uploads_or_downloads(agent, api, replica_dir):
    run, (a, _) = staged_run()
    put(agent(a), run, 0, 1, 4, weights(0, 1))
    stranger = DeviceFactory()
    for answer in (put(agent(stranger), run, 0, 1, 8, weights(0, 1)),
                   agent(stranger).get(url(run, 0, 1, 4))):
        assert answer.status_code == 403
        assert answer.json() == {"detail": f"device {stranger.uid} is not a device of run "
                                           f"{run.pk}"}
    # a user's session is not a device key
    assert api.get(url(run, 0, 1, 4)).status_code == 401
    assert put(api, run, 0, 1, 8, weights(0, 1)).status_code == 401
    # a device of the run the plan leaves out holds no stage: it has nothing to upload
    idle = DeviceFactory()
    RunDevice.objects.create(run=run, device=idle, position=5)
    answer = put(agent(idle), run, 0, 1, 8, weights(0, 1))
    assert answer.status_code == 403
    assert answer.json() == {"detail": f"device: device {idle.uid} holds no stage of run "
                                       f"{run.pk}'s current plan"}
    assert list(WeightReplica.objects.values_list("applied", flat=True)) == [4]
    assert stored_files(replica_dir) == ["0-1@4.safetensors"]


# --------------------------------------------------------------------------- services


def test_replica_store_refuses_bad_input_before_writing(replica_dir):
    run, (a, _) = staged_run()
    with pytest.raises(InvalidInput) as caught:
        replicas.replica_store(run=run, device=a, first=0, last=1, applied=4,
                               data=weights(1, 2))
    assert caught.value.errors[0].field == "body"
    assert not replica_dir.exists() or stored_files(replica_dir) == []


def test_overlapping_layouts_take_each_layer_once(agent):
    """After a re-partition the old and the new layout's replicas may both hold a layer."""
    run, (a, b) = staged_run()
    use_plan(run, (0, 3, [a]), (4, 5, [b]))
    assert put(agent(a), run, 0, 3, 8, weights(0, 3, value=1.0)).status_code == 201
    use_plan(run, (0, 1, [a]), (2, 5, [b]))  # a re-partition
    assert put(agent(b), run, 2, 5, 8, weights(2, 5, value=50.0)).status_code == 201
    merged = load(replicas.replica_read(run=run, first=0, last=5, applied=8))
    assert len(merged) == 12
    assert torch.equal(merged["1.bias"], torch.full((2,), 2.0))  # only the first holds it
    assert torch.equal(merged["3.bias"], torch.full((2,), 53.0))  # the newest upload


def test_a_layer_without_parameters_is_held_by_the_range_that_covers_it(agent):
    run, (a, _) = staged_run()
    put(agent(a), run, 0, 2, 4, save({"0.weight": torch.ones(1), "2.weight": torch.ones(1)}))
    merged = load(replicas.replica_read(run=run, first=1, last=2, applied=4))
    assert sorted(merged) == ["2.weight"]  # layer 1 (an activation) has no tensor, not missing


def test_deleting_a_run_deletes_its_replica_files(agent, replica_dir,
                                                   django_capture_on_commit_callbacks):
    run, (a, b) = staged_run()
    put(agent(a), run, 0, 1, 4, weights(0, 1))
    put(agent(b), run, 3, 4, 4, weights(3, 4))
    other, (c, _) = staged_run()
    put(agent(c), other, 0, 1, 4, weights(0, 1))
    with django_capture_on_commit_callbacks(execute=True):
        run.delete()
    assert not (replica_dir / f"run-{run.pk}").exists()
    assert stored_files(replica_dir / f"run-{other.pk}") == ["0-1@4.safetensors"]
