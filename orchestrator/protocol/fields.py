"""The protocol's limits, :class:`ProtocolError`, and the readers of a message's fields.

A reader takes the raw JSON value and the field's name (its path in the message) and returns
the typed value or raises ProtocolError naming it: ``read_*`` read a value at once,
:data:`Reader` factories (``integer``, ``text``, ``items``, ...) make one for a message field.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

T = TypeVar("T")

MAX_STAGES = 64
MAX_REPLICAS = 64
MAX_PIPELINES = 1024
MAX_NAME = 200
MAX_TEXT = 4000  # an error or a refusal's reason
MAX_EVENTS = 100_000  # timeline events, faults or metric points in one batch
MAX_PEERS = 1024
MAX_RESOURCES = 8
MAX_LAYER = 10**6
MAX_DEPTH = 64  # levels of arrays and objects in one message
# the types of JSON's scalars as Python's parser reads them
JSON_SCALARS = frozenset((str, int, float, bool, type(None)))


class ProtocolError(ValueError):
    """A message that does not follow the protocol; says which field (``field``, a path such
    as ``links[0].latency_s``, or None for the message as a whole) and why (``reason``)."""

    def __init__(self, message: str, *, field: str | None = None,
                 reason: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.reason = message if reason is None else reason


# --------------------------------------------------------------------------- field readers


def fail(name: str, reason: str, value: Any = None) -> ProtocolError:
    """The error for field ``name`` (its path in the message): ``reason``, and the value
    when given."""
    shown = "" if value is None else f", got {value!r}"[:120]
    return ProtocolError(f"{name}: {reason}{shown}", field=name, reason=f"{reason}{shown}")


def read_int(raw: Any, name: str, *, minimum: int = 0, maximum: int = 2**53) -> int:
    """``raw`` as an integer from ``minimum`` to ``maximum``."""
    if isinstance(raw, bool) or not isinstance(raw, int) or not minimum <= raw <= maximum:
        raise fail(name, f"must be an integer from {minimum} to {maximum}", raw)
    return raw


def read_number(raw: Any, name: str, *, minimum: float = 0.0, maximum: float = math.inf,
                above: bool = False) -> float:
    """``raw`` as a finite float from ``minimum`` (``above``: excluded) to ``maximum``."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise fail(name, "must be a finite number", raw)
    value = float(raw)
    if value < minimum or value > maximum or (above and value <= minimum):
        bound = f"above {minimum:g}" if above else f"at least {minimum:g}"
        limit = "" if math.isinf(maximum) else f" and at most {maximum:g}"
        raise fail(name, f"must be {bound}{limit}", raw)
    return value


def read_text(raw: Any, name: str, *, maximum: int = MAX_NAME) -> str:
    """``raw`` as a non-empty string of at most ``maximum`` characters."""
    if not isinstance(raw, str) or not raw or len(raw) > maximum:
        raise fail(name, f"must be a non-empty string of at most {maximum} characters",
                   raw if isinstance(raw, str) else None)
    return raw


def read_bool(raw: Any, name: str) -> bool:
    """``raw`` as true or false."""
    if not isinstance(raw, bool):
        raise fail(name, "must be true or false", raw)
    return raw


def read_list(raw: Any, name: str, *, maximum: int, minimum: int = 0) -> list[Any]:
    """``raw`` as a list of ``minimum`` to ``maximum`` items."""
    if not isinstance(raw, list) or not minimum <= len(raw) <= maximum:
        raise fail(name, f"must be a list of {minimum} to {maximum} items")
    return raw


def read_optional(raw: Any, read: Callable[[Any], T]) -> T | None:
    """None for None, else ``read(raw)``."""
    return None if raw is None else read(raw)


def read_object(raw: Any, what: str, required: Sequence[str], optional: Sequence[str], *,
                prefix: str = "") -> Mapping[str, Any]:
    """``raw`` as a JSON object (``what``, its fields named ``prefix`` + key) with every
    ``required`` key and no key but those and the ``optional`` ones."""
    if not isinstance(raw, dict):
        raise ProtocolError(f"{prefix.rstrip('.') or what} must be a JSON object",
                            field=prefix.rstrip(".") or None, reason="must be a JSON object")
    missing = [k for k in required if k not in raw]
    if missing:
        raise fail(prefix + missing[0], f"is missing from {what}")
    unknown = sorted(set(raw) - set(required) - set(optional), key=str)
    if unknown:
        raise fail(prefix + str(unknown[0]), f"is not a field of {what}")
    return raw


# Readers for the fields of a message: each takes the raw JSON value and the field's name (its
# path in the message) and returns the typed value or raises ProtocolError naming it.
Reader = Callable[[Any, str], Any]


def integer(*, minimum: int = 0, maximum: int = 2**53) -> Reader:
    return lambda raw, name: read_int(raw, name, minimum=minimum, maximum=maximum)


def number(*, minimum: float = 0.0, maximum: float = math.inf, above: bool = False) -> Reader:
    return lambda raw, name: read_number(raw, name, minimum=minimum, maximum=maximum, above=above)


def seconds(maximum: float) -> Reader:
    """A duration a device measured, from 0 to ``maximum`` seconds."""
    def read(raw: Any, name: str) -> float:
        if (isinstance(raw, bool) or not isinstance(raw, (int, float))
                or not (math.isfinite(raw) and 0 <= raw <= maximum)):
            raise fail(name, f"must be between 0 and {maximum:g} seconds", raw)
        return float(raw)
    return read


def text(*, maximum: int = MAX_NAME, empty: bool = False) -> Reader:
    def read(raw: Any, name: str) -> str:
        if empty and raw == "":
            return ""
        return read_text(raw, name, maximum=maximum)
    return read


def flag() -> Reader:
    return read_bool


def one_of(*choices: str) -> Reader:
    def read(raw: Any, name: str) -> str:
        if raw not in choices:
            raise fail(name, f"must be {' or '.join(choices)}", raw)
        return cast(str, raw)
    return read


_ADDRESS = re.compile(r"tcp://([^\s/:]+|\[[0-9a-fA-F:.]+\]):([0-9]{1,5})")


def address(raw: Any, name: str) -> str:
    """A data plane's address, ``tcp://host:port`` with a numeric port."""
    match = _ADDRESS.fullmatch(raw) if isinstance(raw, str) and len(raw) <= MAX_NAME else None
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise fail(name, f"must be tcp://host:port (at most {MAX_NAME} characters)",
                   raw if isinstance(raw, str) else None)
    return cast(str, raw)


_CURVE_KEY = re.compile(r"[0-9a-zA-Z.:+=^!/*?&<>()\[\]{}@%$#-]{40}")


def curve_key(raw: Any, name: str) -> str:
    """A ZeroMQ CURVE public key in Z85: 40 characters of its alphabet (32 bytes)."""
    if not isinstance(raw, str) or not _CURVE_KEY.fullmatch(raw):
        raise fail(name, "must be a CURVE public key: 40 characters of Z85",
                   raw if isinstance(raw, str) and len(raw) <= MAX_NAME else None)
    return raw


_SLUG = re.compile(r"[A-Za-z0-9_-]{1,64}")
_KIND = re.compile(r"[a-z][a-z0-9_]{0,15}")


def slug(raw: Any, name: str) -> str:
    """A device uid: 1 to 64 letters, digits, '_' or '-'."""
    if not isinstance(raw, str) or not _SLUG.fullmatch(raw):
        raise fail(name, "must be 1 to 64 letters, digits, '_' or '-'",
                   raw if isinstance(raw, str) else None)
    return raw


def kind_name(raw: Any, name: str) -> str:
    """A short identifier (a resource's kind): a lower-case letter, then up to 15 lower-case
    letters, digits or '_'."""
    if not isinstance(raw, str) or not _KIND.fullmatch(raw):
        raise fail(name, "must be a short identifier (a-z, then up to 15 of a-z, 0-9, _)",
                   raw if isinstance(raw, str) else None)
    return raw


def items(read: Reader, *, maximum: int, minimum: int = 0) -> Reader:
    """A list whose items ``read`` reads, as a tuple; items are named ``name[i]``. A reader
    with an ``accepts`` test (:func:`json_object`'s) takes a list every item of which passes
    it at once, without naming each item (thousands of timeline events a second)."""
    accepts = getattr(read, "accepts", None)

    def read_items(raw: Any, name: str) -> tuple[Any, ...]:
        listed = read_list(raw, name, minimum=minimum, maximum=maximum)
        if accepts is not None and all(map(accepts, listed)):
            return tuple(listed)
        return tuple(read(x, f"{name}[{i}]") for i, x in enumerate(listed))
    return read_items


def layer_range(raw: Any, name: str) -> tuple[int, int]:
    """``[first, last]`` with 0 <= first <= last."""
    first, last = (read_int(x, f"{name}[{i}]", maximum=MAX_LAYER)
                   for i, x in enumerate(read_list(raw, name, minimum=2, maximum=2)))
    if last < first:
        raise fail(name, "must be [first, last] with first <= last", raw)
    return first, last


def mapping(read_key: Reader, read_value: Reader, *, maximum: int) -> Reader:
    """A JSON object read key by key (each value named ``name.key``)."""
    def read(raw: Any, name: str) -> dict[str, Any]:
        if not isinstance(raw, dict) or len(raw) > maximum:
            raise fail(name, f"must be a JSON object of at most {maximum} entries")
        return {read_key(k, name): read_value(v, f"{name}.{k}") for k, v in raw.items()}
    return read


def json_object(*, maximum: int = 256) -> Reader:
    """A JSON object whose contents another format checks (a profile, a timeline event)."""
    def accepts(raw: Any) -> bool:
        return isinstance(raw, dict) and len(raw) <= maximum

    def read(raw: Any, name: str) -> dict[str, Any]:
        if not accepts(raw):
            raise fail(name, f"must be a JSON object of at most {maximum} entries")
        obj: dict[str, Any] = raw
        return obj
    read.accepts = accepts  # type: ignore[attr-defined]
    return read


def json_columns(*, maximum: int, length: int) -> Reader:
    """A JSON object of at most ``maximum`` arrays of at most ``length`` items each, whose
    contents another format checks (timeline events in columns: orchestrator.eventcolumns)."""
    def read(raw: Any, name: str) -> dict[str, list[Any]]:
        if not isinstance(raw, dict) or len(raw) > maximum:
            raise fail(name, f"must be a JSON object of at most {maximum} columns")
        for key, column in raw.items():
            if not isinstance(column, list) or len(column) > length:
                raise fail(f"{name}.{key}", f"must be a JSON array of at most {length} items")
        columns: dict[str, list[Any]] = raw
        return columns
    return read


def json_deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``limit`` levels deep (a scalar is
    0 levels, ``[]`` or ``{}`` one). Walked without recursion, so any value can be measured."""
    stack: list[tuple[Any, int]] = [(value, 0)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        depth += 1
        if depth > limit:
            return True
        if JSON_SCALARS.issuperset(map(type, children)):
            continue  # a column of numbers, say: no item by item walk in Python
        stack.extend((c, depth) for c in children if isinstance(c, (dict, list)))
    return False


def read_json_text(raw: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """A message's text as its JSON value; ProtocolError (for the message as a whole, no
    field) when it is not JSON or nests arrays and objects more than ``max_depth`` levels
    deep. Python's parser would fail with RecursionError at about a thousand levels: that is
    refused as too deep too, and anything shallower is measured once parsed."""
    too_deep = f"nests arrays and objects more than {max_depth} levels deep"
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ProtocolError(f"the message {too_deep}", reason=too_deep) from None
    except ValueError as exc:
        reason = f"is not JSON: {exc}"[:MAX_TEXT - 20]
        raise ProtocolError(f"the message {reason}", reason=reason) from None
    if json_deeper_than(value, max_depth):
        raise ProtocolError(f"the message {too_deep}", reason=too_deep)
    return value


def json_document(*, entries: int, size: int, depth: int) -> Reader:
    """A JSON object given as it is (a device's hardware description): at most ``entries``
    entries, ``size`` bytes as compact UTF-8 JSON and ``depth`` levels of arrays and objects
    (itself one)."""
    def read(raw: Any, name: str) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise fail(name, "must be a JSON object")
        if len(raw) > entries:
            raise fail(name, f"must have at most {entries} entries, not {len(raw)}")
        if json_deeper_than(raw, depth):
            raise fail(name, f"must not nest arrays and objects more than {depth} levels deep")
        try:
            encoded = len(json.dumps(raw, ensure_ascii=False, separators=(",", ":"))
                          .encode("utf-8", "surrogatepass"))
        except (TypeError, ValueError):
            raise fail(name, "must hold JSON values only") from None
        if encoded > size:
            raise fail(name, f"must be at most {size} bytes as JSON, not {encoded}")
        obj: dict[str, Any] = raw
        return obj
    return read
