"""The browser tests share one server for the session, and a generated model is enrolled
once: two test modules that generate a model of the same number of layers (its name,
``synthetic-<layers>``) collide, the second failing at setup (it happened twice in one
session, in CI). Each module's model must be its own."""

from __future__ import annotations

import re
from collections import defaultdict

from tests.conftest import ROOT

GENERATED = re.compile(r"(?:generated_testbed|renamed_lab)\([^)]*?layers=(\d+)")


def test_each_browser_test_module_generates_a_model_of_its_own() -> None:
    users: dict[int, list[str]] = defaultdict(list)
    for path in sorted((ROOT / "tests" / "browser").glob("test_*.py")):
        for layers in set(GENERATED.findall(path.read_text())):
            users[int(layers)].append(path.name)
    assert users, "no generated model found: the pattern no longer matches the tests"
    shared = {layers: names for layers, names in users.items() if len(names) > 1}
    assert not shared, f"modules generating the same model (layers: modules): {shared}"
