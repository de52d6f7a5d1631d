"""The system metric kinds (orchestrator.protocol.SYSTEM_METRICS) a device's agent reports while
it trains: each a finite number in its kind's range and of a named device, a bad point
refused naming its field (``metrics[3].value``); the other kinds keep their rules."""

from __future__ import annotations

import math
from typing import Any

import pytest

from orchestrator.protocol import SYSTEM_METRICS, MetricSample, ProtocolError


def point(kind: str, value: Any, device: str = "pi-1") -> dict[str, Any]:
    return {"at": 12.5, "kind": kind, "device": device, "value": value}


@pytest.mark.parametrize(("kind", "value"), [
    ("cpu_pct", 0), ("cpu_pct", 100), ("proc_cpu_pct", 37.5),
    ("mem_used_bytes", 3.2e9), ("mem_total_bytes", 2**40), ("proc_rss_bytes", 0),
    ("temp_c", -20.0), ("temp_c", 85.1), ("temp_c", 200),
])
def test_a_system_point_in_its_range_is_taken(kind: str, value: float) -> None:
    read = MetricSample.reader()(point(kind, value), "metrics[0]")
    assert (read.kind, read.value, read.device) == (kind, value, "pi-1")
    assert MetricSample.from_json(read.to_json()) == read


@pytest.mark.parametrize(("raw", "field", "says"), [
    (point("cpu_pct", 100.5), "metrics[3].value", "must be from 0 to 100 for cpu_pct"),
    (point("proc_cpu_pct", -1), "metrics[3].value", "must be from 0 to 100 for proc_cpu_pct"),
    (point("mem_used_bytes", -4096), "metrics[3].value", "must be from 0 to 9.0072e+15"),
    (point("proc_rss_bytes", 1e300), "metrics[3].value", "for proc_rss_bytes"),
    (point("temp_c", 255.0), "metrics[3].value", "must be from -100 to 200 for temp_c"),
    (point("temp_c", math.nan), "metrics[3].value", "must be a finite number"),
    (point("mem_total_bytes", math.inf), "metrics[3].value", "must be a finite number"),
    (point("cpu_pct", "12%"), "metrics[3].value", "must be a finite number"),
    (point("cpu_pct", True), "metrics[3].value", "must be a finite number"),
    (point("cpu_pct", 50, device=""), "metrics[3].device", "must name the device"),
    ({"at": 1.0, "kind": "temp_c", "value": 50}, "metrics[3].device", "must name the device"),
])
def test_a_bad_system_point_is_refused_naming_its_field(raw: dict[str, Any], field: str,
                                                        says: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        MetricSample.reader()(raw, "metrics[3]")
    assert caught.value.field == field
    assert says in caught.value.reason and str(caught.value).startswith(f"{field}: ")


def test_a_point_built_in_code_obeys_the_same_rules() -> None:
    with pytest.raises(ProtocolError, match="value: must be from 0 to 100 for cpu_pct"):
        MetricSample(at=1.0, kind="cpu_pct", device="pi-1", value=140.0)


def test_the_other_kinds_keep_their_rules() -> None:
    # a loss above 100 and a run-wide throughput are not system figures
    assert MetricSample.from_json({"at": 1.0, "kind": "loss", "value": 250.0}).value == 250.0
    assert MetricSample.from_json({"at": 1.0, "kind": "throughput_sps",
                                   "value": 5e9}).device == ""


def test_every_system_kind_has_a_finite_range() -> None:
    assert set(SYSTEM_METRICS) == {"cpu_pct", "proc_cpu_pct", "proc_rss_bytes",
                                   "mem_used_bytes", "mem_total_bytes", "temp_c"}
    for low, high in SYSTEM_METRICS.values():
        assert math.isfinite(low) and math.isfinite(high) and low < high
