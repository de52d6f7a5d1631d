"""Rows of split-learning studies (factory_boy) and small instance documents."""

from __future__ import annotations

from typing import Any

import factory
from factory.django import DjangoModelFactory

from tests.webapp.factories import UserFactory
from webapp.split.models import SplitSchedule, SplitStudy

MNIST = "data/sl/resnet101_mnist.jsonl"


def instance_document(**changes: Any) -> dict[str, Any]:
    """A valid instance of three clients and two helpers (every client fits either helper,
    two clients fit one helper)."""
    doc: dict[str, Any] = {
        "name": "tiny", "slot_ms": 100.0, "clients": 3, "helpers": 2,
        "r": [[1, 2], [2, 1], [1, 1]], "p": [[2, 3], [3, 2], [2, 2]],
        "l": [[1, 1], [1, 1], [2, 2]], "lp": [[1, 1], [1, 1], [1, 1]],
        "pp": [[3, 4], [4, 3], [3, 3]], "rp": [[1, 1], [1, 2], [1, 1]],
        "demand": [10, 10, 10], "capacity": [20, 20], "memory_unit": "MB"}
    doc.update(changes)
    return doc


class SplitStudyFactory(DjangoModelFactory):
    class Meta:
        model = SplitStudy

    name = factory.Sequence(lambda n: f"study {n}")
    instance = factory.LazyFunction(instance_document)
    source = "uploaded"
    clients = factory.LazyAttribute(lambda o: o.instance["clients"])
    helpers = factory.LazyAttribute(lambda o: o.instance["helpers"])
    time_limit_s = 2.0
    created_by = factory.SubFactory(UserFactory)


class SplitScheduleFactory(DjangoModelFactory):
    """A computed schedule's row (its document left out: pass ``schedule=...``)."""

    class Meta:
        model = SplitSchedule

    study = factory.SubFactory(SplitStudyFactory)
    method = "balanced-greedy"
    status = SplitSchedule.Status.DONE
    makespan = 20
    solver_s = 0.001
