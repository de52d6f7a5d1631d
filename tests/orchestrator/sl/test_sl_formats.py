"""The split-learning instance and schedule formats: round trips and named errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import FormatError
from orchestrator.sl.formats import (
    Instance,
    Schedule,
    load_instance,
    load_schedule,
    parse_instance,
    parse_schedule,
    read_instances,
)
from orchestrator.sl.solve import solve


def test_every_shared_instance_round_trips(shared: tuple[Instance, ...]) -> None:
    for inst in shared:
        assert parse_instance(inst.to_json()) == inst


def test_shared_json_is_reproduced_exactly(data_dir: Path) -> None:
    line = (data_dir / "resnet101_cifar10.jsonl").read_text().splitlines()[0]
    raw = json.loads(line)
    assert parse_instance(raw).to_json() == raw


def test_schedule_round_trips_with_the_optional_fields(tiny: Instance) -> None:
    schedule = solve(instance=tiny, method="exact", time_limit_s=5, switch_slots=1)
    assert schedule.lower_bound is not None and schedule.gap == 0.0
    assert schedule.switch_slots == (1, 1)
    document = json.loads(json.dumps(schedule.to_json()))
    assert set(document) >= {"method", "instance", "assignment", "forward", "backward",
                             "completion", "makespan", "solver_s", "lower_bound", "gap",
                             "switch_slots"}
    assert parse_schedule(document) == schedule


def test_schedule_file_round_trip(tmp_path: Path, tiny_schedule: Schedule) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(tiny_schedule.to_json()))
    assert load_schedule(path) == tiny_schedule


def _broken(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    target = raw
    keys = path.split("/")
    for key in keys[:-1]:
        target = target[int(key) if key.isdigit() else key]
    last = keys[-1]
    if value is _DELETE:
        del target[last]
    else:
        target[int(last) if last.isdigit() else last] = value
    return raw


_DELETE = object()


@pytest.mark.parametrize(("path", "value", "field", "reason"), [
    ("p/1/1", 0, "p[1][1]", "must be at least 1"),
    ("r/0/1", -2, "r[0][1]", "must be at least 0"),
    ("lp/1/0", 1.5, "lp[1][0]", "must be an integer"),
    ("rp/1", [1], "rp[1]", "has 1 entries but there are 2 helpers"),
    ("l", [[1, 1]], "l", "has 1 rows but there are 2 clients"),
    ("demand", [1], "demand", "has 1 entries but there are 2 clients"),
    ("capacity/0", -1, "capacity[0]", "must not be negative"),
    ("slot_ms", 0, "slot_ms", "must be greater than zero"),
    ("clients", 0, "clients", "must be at least 1"),
    ("pp", _DELETE, "pp", "is missing"),
    ("colour", "red", "colour", "is not a known field"),
])
def test_bad_instances_name_file_field_and_value(tiny_json: dict[str, Any], path: str,
                                                 value: Any, field: str, reason: str) -> None:
    with pytest.raises(FormatError) as caught:
        parse_instance(_broken(tiny_json, path, value), file="bad.json")
    err = caught.value
    assert (err.file, err.field) == ("bad.json", field)
    assert reason in err.reason
    assert str(err).startswith(f"bad.json: {field}: ")


def test_a_bad_value_is_shown(tiny_json: dict[str, Any]) -> None:
    with pytest.raises(FormatError, match=r"bad.json: p\[1\]\[1\]: must be at least 1 \(got 0\)"):
        parse_instance(_broken(tiny_json, "p/1/1", 0), file="bad.json")


@pytest.mark.parametrize(("change", "field", "reason"), [
    ({"makespan": -1}, "makespan", "must be at least 0"),
    ({"forward": [{"helper": 0, "client": 0, "start": 4, "end": 4}]}, "forward[0].end",
     "must be after start"),
    ({"backward": [{"helper": 0, "client": 0, "start": 1}]}, "backward[0].end", "is missing"),
    ({"gap": "small"}, "gap", "must be a number"),
])
def test_bad_schedules_name_the_field(tiny_schedule: Schedule, change: dict[str, Any],
                                      field: str, reason: str) -> None:
    raw = {**tiny_schedule.to_json(), **change}
    with pytest.raises(FormatError) as caught:
        parse_schedule(raw, file="s.json")
    assert (caught.value.file, caught.value.field) == ("s.json", field)
    assert reason in caught.value.reason


def _jsonl(tmp_path: Path, raw: dict[str, Any], names: list[str]) -> Path:
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join(json.dumps({**raw, "name": n}) for n in names) + "\n\n")
    return path


def test_jsonl_lines_are_picked_by_index_or_name(tmp_path: Path,
                                                 tiny_json: dict[str, Any]) -> None:
    path = _jsonl(tmp_path, tiny_json, ["a", "b", "c"])
    assert [i.name for i in read_instances(path)] == ["a", "b", "c"]
    assert load_instance(path, index=2).name == "c"
    assert load_instance(path, name="b").file == f"{path}:2"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "holds 3 instances; pick one with --index N (0..2) or --name NAME"),
    ({"index": 3}, "index: has 3 instances, so the index must be between 0 and 2 (got 3)"),
    ({"name": "zz"}, "name: no instance has this name (got 'zz')"),
    ({"name": "a"}, "name: 2 instances have this name; pick one with --index (got 'a')"),
])
def test_jsonl_picking_errors(tmp_path: Path, tiny_json: dict[str, Any], kwargs: dict[str, Any],
                              message: str) -> None:
    path = _jsonl(tmp_path, tiny_json, ["a", "b", "a"])
    with pytest.raises(FormatError) as caught:
        load_instance(path, **kwargs)
    assert str(caught.value) == f"{path}: {message}"


def test_a_bad_jsonl_line_names_its_line(tmp_path: Path, tiny_json: dict[str, Any]) -> None:
    path = tmp_path / "x.jsonl"
    good = json.dumps(tiny_json)
    path.write_text(good + "\n" + json.dumps(_broken(tiny_json, "pp/0/0", 0)) + "\n")
    with pytest.raises(FormatError) as caught:
        read_instances(path)
    assert (caught.value.file, caught.value.field) == (f"{path}:2", "pp[0][0]")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="no such file"):
        read_instances(tmp_path / "nothing.jsonl")
