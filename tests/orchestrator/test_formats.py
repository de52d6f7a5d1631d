"""The shared formats: real testbed files load, documents round-trip, and every kind of bad
input is refused with the file, the field and the value named."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import FormatError
from orchestrator.formats import (
    check_compatible,
    load_devices,
    load_profile,
    parse_devices,
    parse_profile,
)
from orchestrator.planformat import load_plan, parse_plan
from tests.conftest import DATA

PROFILE = DATA / "profiles" / "resnet101_cifar10.model.json"
DEVICES = DATA / "profiles" / "resnet101_cifar10.devices.json"


def small_profile() -> dict[str, Any]:
    layer = {"name": "conv1", "kind": "conv", "forward_s": 0.01, "backward_s": 0.02,
             "output_bytes": 1000, "param_bytes": 100, "activation_bytes": 2000}
    return {"model": "m", "batch_size": 32, "reference": "laptop",
            "layers": [dict(layer, name=f"l{i}") for i in range(4)]}


def small_devices() -> dict[str, Any]:
    return {"devices": [
        {"id": "a", "speed": 1.0, "memory_bytes": 10**9, "bandwidth_bps": 1e7},
        {"id": "b", "memory_bytes": 10**9, "bandwidth_bps": 1e6, "latency_s": 0.002,
         "resources": [{"kind": "cpu", "speed": 0.2}, {"kind": "gpu", "speed": 0.3,
                                                        "backward_speed": 0.25}]},
    ], "links": [{"a": "a", "b": "b", "bandwidth_bps": 5e6}]}


def test_shared_testbed_loads() -> None:
    profile = load_profile(PROFILE)
    devices = load_devices(DEVICES)
    check_compatible(profile, devices)
    assert profile.num_layers == 37
    assert devices.ids == ("edge-vm", "m1-laptop", "rpi4", "jetson-cpu", "jetson-gpu")
    assert devices.device("rpi4").layer_times is not None


def test_documents_round_trip() -> None:
    profile = load_profile(PROFILE)
    devices = load_devices(DEVICES)
    assert parse_profile(json.loads(json.dumps(profile.to_json()))) == profile
    assert parse_devices(json.loads(json.dumps(devices.to_json()))) == devices
    mixed = parse_devices(small_devices())
    assert parse_devices(mixed.to_json()) == mixed


def test_speed_is_the_sum_of_resources_and_links_win() -> None:
    devices = parse_devices(small_devices())
    b = devices.device("b")
    assert b.speed == pytest.approx(0.5)
    assert b.compute_resources[1].backward_speed == 0.25
    assert b.compute_resources[0].backward_speed == 0.2  # defaults to speed
    assert devices.bandwidth_bps("a", "b") == 5e6  # the link entry, not min(1e7, 1e6)
    assert devices.latency_s("a", "b") == 0.002
    no_link = parse_devices({"devices": small_devices()["devices"]})
    assert no_link.bandwidth_bps("b", "a") == 1e6


def mutate(doc: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    target = out
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


_DELETE = object()


@pytest.mark.parametrize(("path", "value", "field", "reason"), [
    (["layers", 1, "forward_s"], -0.5, "layers[1].forward_s", "must not be negative"),
    (["layers", 2, "backward_s"], float("nan"), "layers[2].backward_s", "must be finite"),
    (["layers", 0, "output_bytes"], 1.5, "layers[0].output_bytes", "must be an integer"),
    (["layers", 0, "param_bytes"], "big", "layers[0].param_bytes", "must be an integer"),
    (["layers", 3, "name"], _DELETE, "layers[3].name", "is missing"),
    (["layers", 0, "foward_s"], 0.1, "layers[0].foward_s", "is not a known field"),
    (["batch_size"], 0, "batch_size", "must be at least 1"),
    (["layers"], [], "layers", "must not be empty"),
    (["model"], "", "model", "must be a non-empty string"),
])
def test_bad_profile_names_file_field_and_value(path: list[Any], value: Any, field: str,
                                                reason: str) -> None:
    with pytest.raises(FormatError) as caught:
        parse_profile(mutate(small_profile(), path, value), file="vgg.json")
    message = str(caught.value)
    assert message.startswith(f"vgg.json: {field}: {reason}")
    assert caught.value.field == field


def test_profile_without_work_is_refused() -> None:
    doc = small_profile()
    for layer in doc["layers"]:
        layer["forward_s"] = layer["backward_s"] = 0
    with pytest.raises(FormatError, match="no work"):
        parse_profile(doc)


@pytest.mark.parametrize(("path", "value", "field", "reason"), [
    (["devices", 0, "speed"], 0, "devices[0].speed", "must be greater than zero"),
    (["devices", 0, "bandwidth_bps"], float("inf"), "devices[0].bandwidth_bps", "must be finite"),
    (["devices", 1, "speed"], 0.9, "devices[1].speed", "must equal the sum"),
    (["devices", 1, "id"], "a", "devices[1].id", "is repeated"),
    (["devices", 0, "memory_bytes"], _DELETE, "devices[0].memory_bytes", "is missing"),
    (["devices", 1, "resources", 1, "kind"], "cpu", "devices[1].resources[1].kind", "is repeated"),
    (["links", 0, "b"], "zz", "links[0].b", "is not a device of this set"),
    (["links", 0, "b"], "a", "links[0].b", "links a device to itself"),
    (["devices", 0, "latency"], 0.1, "devices[0].latency", "is not a known field"),
])
def test_bad_devices_names_file_field_and_value(path: list[Any], value: Any, field: str,
                                                reason: str) -> None:
    with pytest.raises(FormatError) as caught:
        parse_devices(mutate(small_devices(), path, value), file="lab.json")
    assert str(caught.value).startswith(f"lab.json: {field}: {reason}")


def test_device_without_speed_or_resources() -> None:
    doc = mutate(small_devices(), ["devices", 0, "speed"], _DELETE)
    with pytest.raises(FormatError, match=r"devices\[0\]\.speed: is missing"):
        parse_devices(doc)


def test_layer_times_of_the_wrong_length_are_refused() -> None:
    devices = small_devices()
    devices["devices"][0]["layer_times"] = {"forward_s": [0.1] * 3, "backward_s": [0.1] * 3}
    with pytest.raises(FormatError) as caught:
        check_compatible(parse_profile(small_profile(), file="p.json"),
                         parse_devices(devices, file="d.json"))
    assert str(caught.value).startswith(
        "d.json: devices[0].layer_times.forward_s: has 3 entries but the profile")
    devices["devices"][0]["layer_times"] = {"forward_s": [0.1] * 4, "backward_s": [0.1] * 3}
    with pytest.raises(FormatError, match="has 3 entries but forward_s has 4"):
        parse_devices(devices)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="no such file"):
        load_profile(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"model": ')
    with pytest.raises(FormatError, match=r"broken\.json: is not valid JSON"):
        load_profile(broken)


def plan_doc(stages: list[tuple[list[int], list[str]]]) -> dict[str, Any]:
    return {"algorithm": "manual", "stages": [{"layers": layers, "devices": devs}
                                              for layers, devs in stages]}


@pytest.mark.parametrize(("stages", "field", "reason"), [
    ([([0, 1], ["a"]), ([3, 3], ["b"])], "stages[1].layers", "skips layers 2..2"),
    ([([0, 2], ["a"]), ([2, 3], ["b"])], "stages[1].layers", "repeats layers 2..2"),
    ([([0, 1], ["a"]), ([2, 2], ["b"])], "stages", "leave layers 3..3 unassigned"),
    ([([0, 5], ["a"])], "stages[0].layers", "goes past the last layer"),
    ([([0, 1], ["a"]), ([2, 3], ["c"])], "stages[1].devices[0]", "is not a known device"),
    ([([0, 1], ["a"]), ([2, 3], ["a"])], "stages[1].devices[0]", "already serves stage 0"),
    ([([0, 1], []), ([2, 3], ["a"])], "stages[0].devices", "must not be empty"),
    ([([1, 0], ["a"])], "stages[0].layers", "skips layers 0..0"),
])
def test_bad_plans_are_refused(stages: list[tuple[list[int], list[str]]], field: str,
                               reason: str) -> None:
    profile = parse_profile(small_profile())
    devices = parse_devices(small_devices())
    with pytest.raises(FormatError) as caught:
        parse_plan(plan_doc(stages), profile=profile, devices=devices, file="plan.json")
    assert str(caught.value).startswith(f"plan.json: {field}: {reason}")


def test_plan_round_trip_and_beta_validation(tmp_path: Path) -> None:
    profile = parse_profile(small_profile())
    devices = parse_devices(small_devices())
    doc = plan_doc([([0, 1], ["a"]), ([2, 3], ["b"])])
    doc.update(schedule="gpipe", microbatches=4, inflight=[3, 1],
               beta={"a": {"cpu": 0.5}, "b": {"cpu": 0.2, "gpu": 0.7}})
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    plan = load_plan(path, profile=profile, devices=devices)
    assert plan.schedule == "gpipe" and plan.inflight == (3, 1)
    assert parse_plan(plan.to_json(), profile=profile, devices=devices) == plan
    for beta, reason in [({"b": {"tpu": 0.5}}, "is not a resource of this device"),
                         ({"a": {"cpu": 1.5}}, "must be between 0 and 1"),
                         ({"z": {"cpu": 0.5}}, "is not a known device")]:
        with pytest.raises(FormatError, match=reason):
            parse_plan(dict(doc, beta=beta), profile=profile, devices=devices)
    with pytest.raises(FormatError, match="has 1 entries for 2 stages"):
        parse_plan(dict(doc, inflight=[1]), profile=profile, devices=devices)
    with pytest.raises(FormatError, match="schedule: must be one of 1f1b, 1f1b-sync, gpipe"):
        parse_plan(dict(doc, schedule="zb"), profile=profile, devices=devices)


def test_plans_with_groups_carry_lags_windows_and_notes() -> None:
    profile = parse_profile(small_profile())
    devices = parse_devices(small_devices())
    doc = plan_doc([([0, 3], ["a", "b"])])
    doc.update(inflight=[1], lag=[4], replica_inflight={"a": 1, "b": 1},
               notes=["beta brings nothing on a"])
    plan = parse_plan(doc, profile=profile, devices=devices)
    assert plan.lag == (4,) and plan.lag_for(0) == 4 and dict(plan.replica_inflight or {}) == {
        "a": 1, "b": 1}
    assert plan.notes == ("beta brings nothing on a",)
    assert parse_plan(plan.to_json(), profile=profile, devices=devices) == plan
    assert parse_plan(plan_doc([([0, 3], ["a"])]), profile=profile, devices=devices).lag_for(0) == 1
    for change, reason in [({"lag": [0]}, r"lag\[0\]: must be at least 1"),
                           ({"inflight": [3], "lag": [2]}, "at least each stage's in-flight"),
                           ({"replica_inflight": {"z": 1}}, "is not a device of a replicated"),
                           ({"notes": [3]}, r"notes\[0\]")]:
        with pytest.raises(FormatError, match=reason):
            parse_plan(dict(doc, **change), profile=profile, devices=devices)


@pytest.mark.parametrize(("field", "value"), [("overhead_s", 0.002), ("message_s", 0.0001)])
def test_fixed_costs_round_trip_and_must_not_be_negative(field: str, value: float) -> None:
    doc = small_devices()
    doc["devices"][0][field] = value
    devices = parse_devices(doc)
    assert getattr(devices.device("a"), field) == value
    assert parse_devices(devices.to_json()) == devices
    doc["devices"][0][field] = -1
    with pytest.raises(FormatError, match=rf"devices\[0\]\.{field}: must not be negative"):
        parse_devices(doc)
