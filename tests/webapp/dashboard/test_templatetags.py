"""The dashboard's template filters that write counts in words."""

from __future__ import annotations

import pytest

from webapp.dashboard.templatetags.dashboard import plural


@pytest.mark.parametrize(("count", "words", "expected"), [
    (0, "stage", "0 stages"),
    (1, "stage", "1 stage"),
    (2, "stage", "2 stages"),
    (1, "batch,batches", "1 batch"),
    (3, "batch,batches", "3 batches"),
    (1, "micro-batch,micro-batches", "1 micro-batch"),
    (4, "micro-batch,micro-batches", "4 micro-batches"),
])
def test_plural(count, words, expected):
    assert plural(count, words) == expected
