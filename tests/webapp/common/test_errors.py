import pytest

from webapp.common.errors import flatten_errors


@pytest.mark.parametrize(("detail", "expected"), [
    ({"name": ["is required"]}, [("name", "is required")]),
    ({"profile": {"layers": [{}, {"forward_s": ["bad"]}]}},
     [("profile.layers[1].forward_s", "bad")]),
    ({"devices": {2: ["no such device"]}}, [("devices[2]", "no such device")]),
    ({"non_field_errors": ["whole body"]}, [("body", "whole body")]),
    (["not an object"], [("body", "not an object")]),
    ({"metrics": [{}, {"kind": ["bad kind"], "at": ["negative"]}]},
     [("metrics[1].kind", "bad kind"), ("metrics[1].at", "negative")]),
])
def test_flatten_errors_names_each_field_as_a_path(detail, expected):
    assert [(e["field"], e["reason"]) for e in flatten_errors(detail)] == expected
