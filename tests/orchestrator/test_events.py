"""Timeline events as agents send them: the fast path of parse_event accepts exactly what the
field-by-field validation accepts, with the same result."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import FormatError
from orchestrator.events import EVENT_KINDS, _parse_event_strict, parse_event
from orchestrator.validation import At

GOOD = {"run": 3, "device": "dev-a", "stage": 1, "kind": "forward", "microbatch": 7,
        "version": 2, "start": 0.5, "end": 0.75, "bytes": 4096}

values = st.one_of(st.integers(-3, 10), st.floats(allow_nan=True, allow_infinity=True),
                   st.booleans(), st.none(), st.text(max_size=3), st.sampled_from(EVENT_KINDS),
                   st.just("  "), st.just(2.0))


def outcome(parse: Any, raw: Any) -> Any:
    try:
        return parse(raw)
    except FormatError as exc:
        return ("error", exc.field, str(exc))


@settings(max_examples=400, deadline=None)
@given(changes=st.dictionaries(st.sampled_from([*GOOD, "extra"]), values, max_size=3),
       removed=st.sets(st.sampled_from(list(GOOD)), max_size=2))
def test_fast_path_agrees_with_the_field_by_field_validation(changes: dict[str, Any],
                                                             removed: set[str]) -> None:
    raw = {k: v for k, v in {**GOOD, **changes}.items() if k not in removed}
    assert outcome(parse_event, raw) == outcome(
        lambda r: _parse_event_strict(r, At("<input>", "")), raw)


@pytest.mark.parametrize(("change", "field"), [
    ({"kind": "teleport"}, "kind"), ({"device": " "}, "device"), ({"stage": True}, "stage"),
    ({"start": float("inf")}, "start"), ({"end": 0.1}, "end"), ({"bytes": -1}, "bytes"),
    ({"colour": 1}, "colour")])
def test_a_bad_event_names_its_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(FormatError) as caught:
        parse_event({**GOOD, **change}, path="timeline[4]")
    assert caught.value.field == f"timeline[4].{field}"


def test_a_good_event_is_read_whole() -> None:
    event = parse_event(GOOD)
    assert (event.run, event.device, event.stage, event.kind, event.microbatch, event.version,
            event.start, event.end, event.bytes) == (3, "dev-a", 1, "forward", 7, 2, 0.5, 0.75,
                                                      4096)
    assert isinstance(parse_event({**GOOD, "start": 0, "end": 1}).start, float)
