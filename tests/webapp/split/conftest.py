"""Fixtures of the split-learning tests: a study whose schedules the real methods computed."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.webapp.split.factories import instance_document
from webapp.split import services
from webapp.split.models import SplitStudy

Solved = Callable[..., SplitStudy]


@pytest.fixture
def solved(db: None, django_capture_on_commit_callbacks) -> Solved:
    """``solved(methods, **create_kwargs)``: a study created by the service, its schedules
    computed by the Celery task (eagerly, as the commit queues them)."""

    def make(methods: list[str], **kwargs: object) -> SplitStudy:
        kwargs.setdefault("instance", instance_document())
        with django_capture_on_commit_callbacks(execute=True):
            study = services.split_study_create(name="s", methods=methods, time_limit_s=2.0,
                                                **kwargs)
        return SplitStudy.objects.get(pk=study.pk)

    return make
