"""The protocol's bounds on what an agent may send at once: a hello's hardware description
(at most 64 entries, 16 KiB as JSON, 8 levels deep; a 900 KB one was taken), and a message's
text (JSON, at most 64 levels of arrays and objects, measured without recursion)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.protocol import Hello, ProtocolError, parse_agent_message
from orchestrator.protocol.fields import MAX_DEPTH, json_deeper_than, read_json_text

KEY = 'Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID'  # a CURVE public key (Z85)


def hello(hardware: Any) -> dict[str, Any]:
    return {"type": "hello", "data_address": "tcp://127.0.0.1:5601", "data_key": KEY,
            "hardware": hardware}


def nest(levels: int, inner: Any = 1) -> Any:
    value = inner
    for _ in range(levels):
        value = {"x": value}
    return value


AGENT_HARDWARE = {"hostname": "jetson-1", "os": "Linux-5.10-aarch64", "machine": "aarch64",
                  "cpus": 6, "memory_bytes": 8 * 2**30, "python": "3.11.7", "torch": "2.3.0",
                  "gpus": [{"name": "Orin", "memory_bytes": 8 * 2**30, "cuda": [8, 7]}]}


@pytest.mark.parametrize("hardware", [
    AGENT_HARDWARE,
    {},
    {f"k{i}": i for i in range(64)},
    {"notes": "x" * (16 * 1024 - 12)},  # {"notes":"..."} is exactly 16 KiB
    {"a": nest(7)},  # 8 levels with itself
    {"name": "é" * 100},
])
def test_a_reasonable_hardware_description_is_taken(hardware: dict[str, Any]) -> None:
    message = parse_agent_message(hello(hardware))
    assert isinstance(message, Hello) and message.hardware == hardware
    assert parse_agent_message(json.loads(json.dumps(message.to_json()))) == message


@pytest.mark.parametrize(("hardware", "says"), [
    ({"blob": "x" * 900_000}, "must be at most 16384 bytes as JSON, not 900011"),
    ({"notes": "x" * (16 * 1024 - 11)}, "must be at most 16384 bytes as JSON, not 16385"),
    ({"name": "é" * 9000}, "must be at most 16384 bytes as JSON"),  # bytes, not characters
    ({f"k{i}": i for i in range(65)}, "must have at most 64 entries, not 65"),
    ({f"k{i}": i for i in range(100_000)}, "must have at most 64 entries, not 100000"),
    ({"a": nest(8)}, "must not nest arrays and objects more than 8 levels deep"),
    ({"a": [[[[[[[[[]]]]]]]]]}, "must not nest arrays and objects more than 8 levels deep"),
    ({"a": nest(10_000)}, "must not nest arrays and objects more than 8 levels deep"),
    ([], "must be a JSON object"),
    ("cpus=4", "must be a JSON object"),
])
def test_an_oversized_hardware_description_is_refused_naming_hardware(hardware: Any,
                                                                       says: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        parse_agent_message(hello(hardware))
    assert refused.value.field == "hardware"
    assert says in str(refused.value) and says in refused.value.reason
    assert len(str(refused.value)) < 200  # the value is not echoed back


def test_a_hello_built_in_code_obeys_the_same_bounds() -> None:
    with pytest.raises(ProtocolError, match="hardware: must have at most 64 entries"):
        Hello(data_address="tcp://a:1", data_key=KEY, hardware={str(i): i for i in range(65)})


@pytest.mark.parametrize(("text", "value"), [
    ('{"type": "ping", "id": 1}', {"type": "ping", "id": 1}),
    ("[" * MAX_DEPTH + "]" * MAX_DEPTH, json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH)),
    ("3", 3),
])
def test_a_messages_text_within_the_bounds_is_read(text: str, value: Any) -> None:
    assert read_json_text(text) == value


@pytest.mark.parametrize(("text", "says"), [
    ("hello?", "the message is not JSON: Expecting value: line 1 column 1"),
    ("", "the message is not JSON"),
    ('{"type": "ping"', "the message is not JSON"),
    ("[" * 65 + "]" * 65, "nests arrays and objects more than 64 levels deep"),
    ('{"a": ' * 65 + "1" + "}" * 65, "nests arrays and objects more than 64 levels deep"),
    ("[" * 10_000 + "]" * 10_000, "nests arrays and objects more than 64 levels deep"),
    ("[" * 1_000_000, "nests arrays and objects more than 64 levels deep"),
])
def test_a_messages_text_out_of_the_bounds_is_refused(text: str, says: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        read_json_text(text)
    assert refused.value.field is None and says in str(refused.value)


def test_depth_is_measured_without_recursion() -> None:
    deep: list[Any] = []
    for _ in range(100_000):  # far past the recursion limit
        deep = [deep]
    assert json_deeper_than(deep, 64)
    assert not json_deeper_than(nest(64), 64) and json_deeper_than(nest(65), 64)
    assert not json_deeper_than("scalar", 0) and json_deeper_than([], 0)
