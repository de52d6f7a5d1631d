"""Shared fixtures of the split-learning tests: the 72 reference instances and a tiny one."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from orchestrator.sl.formats import Instance, Schedule, Segment, parse_instance, read_instances

DATA = Path(__file__).resolve().parents[3] / "data" / "sl"
SHARED = tuple(inst for path in sorted(DATA.glob("*.jsonl")) for inst in read_instances(path))


@pytest.fixture(scope="session")
def shared() -> tuple[Instance, ...]:
    assert len(SHARED) == 72
    return SHARED


TINY_JSON = {
    "name": "tiny", "slot_ms": 100.0, "clients": 2, "helpers": 2,
    "r": [[0, 1], [1, 0]], "p": [[2, 3], [2, 2]], "l": [[1, 1], [1, 1]],
    "lp": [[1, 1], [1, 1]], "pp": [[2, 2], [1, 1]], "rp": [[1, 1], [2, 2]],
    "demand": [1, 1], "capacity": [2, 1], "memory_unit": "MB",
}


@pytest.fixture
def tiny_json() -> dict[str, Any]:
    """A 2-client, 2-helper instance document (a fresh copy)."""
    return copy.deepcopy(TINY_JSON)


@pytest.fixture
def data_dir() -> Path:
    return DATA


@pytest.fixture
def tiny() -> Instance:
    return parse_instance(TINY_JSON, file="tiny.json")


@pytest.fixture
def tiny_schedule() -> Schedule:
    """Both clients on helper 0: forwards [0,2) and [2,4), backwards [4,6) and [6,7)."""
    return Schedule(
        method="hand", assignment=(0, 0),
        forward=(Segment(0, 0, 0, 2), Segment(0, 1, 2, 4)),
        backward=(Segment(0, 0, 4, 6), Segment(0, 1, 6, 7)),
        completion=(7, 9), makespan=9)
