"""The typed records messages are made of: fields declared with :func:`wire` and read by
their readers, the small value records messages carry, and :class:`Message`, the base of
every control-connection message (``{"type": TYPE, ...fields}``)."""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, ClassVar, TypeVar, cast

from orchestrator.protocol.fields import (
    JSON_SCALARS,
    MAX_PEERS,
    MAX_RESOURCES,
    ProtocolError,
    Reader,
    address,
    curve_key,
    fail,
    integer,
    items,
    kind_name,
    layer_range,
    mapping,
    number,
    one_of,
    read_object,
    slug,
    text,
)

R = TypeVar("R", bound="_Record")


def wire(read: Reader, default: Any = MISSING, *, factory: Any = MISSING) -> Any:
    """A message field read by ``read``; with a default it may be left out (None: absent)."""
    return field(default=default, default_factory=factory, metadata={"read": read})


def _to_json(value: Any) -> Any:
    if hasattr(value, "to_json"):
        return value.to_json()
    if type(value) is list and JSON_SCALARS.issuperset(map(type, value)):
        return value  # a column (orchestrator.eventcolumns): as it is, not walked item by item
    if isinstance(value, (tuple, list)):
        return [_to_json(v) for v in value]
    if isinstance(value, Mapping):
        if type(value) is dict and all(type(v) in JSON_SCALARS for v in value.values()):
            return value  # a flat JSON object (a timeline event): as it is, not copied
        return {k: _to_json(v) for k, v in value.items()}
    return value


# set while _Record._parse builds a record from what its readers just read: its
# __post_init__ need not read it again (the agents' events batches were read twice, and
# their records serialised once more to be read, which took a fifth of the web server's
# Python time)
_reading = threading.local()


def _fields(obj: Any) -> tuple[Field[Any], ...]:
    return fields(obj)


def _required(cls: type) -> list[str]:
    return [f.name for f in _fields(cls)
            if f.default is MISSING and f.default_factory is MISSING]


class _Record:
    """A JSON object whose fields are declared with :func:`wire`: ``to_json`` leaves out the
    optional fields that are None, ``from_json`` reads each field with its reader. Built in
    code or read, a record obeys the same rules (``__post_init__`` reads its own JSON form),
    then ``check`` for the rules that tie fields together."""

    WHAT: ClassVar[str] = "the record"

    def __post_init__(self) -> None:
        if not getattr(_reading, "fields", False):
            self._read_fields(self._json_fields(), "")
        self.check()

    def check(self) -> None:
        """Raise ProtocolError naming the field unless the fields agree with each other."""

    def _json_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in _fields(self):
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            out[f.name] = _to_json(value)
        return out

    def to_json(self) -> dict[str, Any]:
        return self._json_fields()

    @classmethod
    def _read_fields(cls, obj: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for f in _fields(cls):
            raw = obj.get(f.name)
            if f.name not in obj or (raw is None and f.default is None):
                continue  # left out, or null for an optional field: its default
            values[f.name] = f.metadata["read"](raw, prefix + f.name)
        return values

    @classmethod
    def _parse(cls: type[R], raw: Any, prefix: str = "", *, what: str | None = None,
               extra: Sequence[str] = ()) -> R:
        names = [f.name for f in _fields(cls)]
        required = _required(cls)
        obj = read_object(raw, what or cls.WHAT, [*extra, *required],
                          [n for n in names if n not in required], prefix=prefix)
        values = cls._read_fields(obj, prefix)
        before = getattr(_reading, "fields", False)
        _reading.fields = True
        try:
            return cls(**values)
        finally:
            _reading.fields = before

    @classmethod
    def from_json(cls: type[R], raw: Any) -> R:
        return cls._parse(raw)

    @classmethod
    def reader(cls) -> Reader:
        """Read a field holding one of these (its fields named ``name.field``)."""
        return lambda raw, name: cls._parse(raw, f"{name}.", what=name)



# ---- what messages carry


@dataclass(frozen=True, kw_only=True)
class DeviceResource(_Record):
    """One compute resource of a device as its agent reports it (``--resources``): its kind
    and its forward and backward speeds, relative to the device's other resources."""

    WHAT = "a resource"
    kind: str = wire(kind_name)
    speed: float = wire(number(above=True))
    backward_speed: float = wire(number(above=True))


def resources_reader(raw: Any, name: str) -> tuple[DeviceResource, ...]:
    """1 to MAX_RESOURCES resources, each kind once."""
    read = items(DeviceResource.reader(), minimum=1, maximum=MAX_RESOURCES)
    resources: tuple[DeviceResource, ...] = read(raw, name)
    kinds = [r.kind for r in resources]
    for i, kind in enumerate(kinds):
        if kind in kinds[:i]:
            raise fail(f"{name}[{i}].kind", "is repeated: each kind once per device", kind)
    return resources


@dataclass(frozen=True, kw_only=True)
class RestorePart(_Record):
    """A part of a recovering stage's weights and where to load it from (``deploy``'s
    ``restore``): ``source`` is ``self``, a device uid or ``central`` (the server); the
    server also says which device loads it, the kind of copy and its size."""

    WHAT = "a restore part"
    layers: tuple[int, int] = wire(layer_range)
    applied: int = wire(integer())
    source: str = wire(text())
    device: str | None = wire(text(), None)
    kind: str | None = wire(text(), None)
    bytes: int | None = wire(integer(), None)


@dataclass(frozen=True, kw_only=True)
class HeldCopy(_Record):
    """A copy of layers at ``applied`` that an agent holds (``halt``'s ack): its stage's own
    checkpoint or a chain replica of another stage."""

    WHAT = "a holding"
    layers: tuple[int, int] = wire(layer_range)
    applied: int = wire(integer())
    kind: str = wire(one_of("own", "replica"))


@dataclass(frozen=True, kw_only=True)
class MeasuredLink(_Record):
    """The link to a peer as an agent measured it over the data plane (``links``)."""

    WHAT = "a link"
    peer: str = wire(text())
    bandwidth_bps: float = wire(number(above=True))
    latency_s: float = wire(number(maximum=60))


@dataclass(frozen=True, kw_only=True)
class ModelSpecRef(_Record):
    """A model, data set and batch size (what a profile is of)."""

    WHAT = "a model spec"
    model: str = wire(text())
    dataset: str = wire(text(maximum=4096))
    batch_size: int = wire(integer(minimum=1, maximum=2**20))


# A device's system figures, which its agent samples while it trains (agent.system): kind ->
# the range its value must lie in. CPU use is a share of all the device's cores (the agent
# process's too, so that both read on one axis), memory in bytes, the temperature in degrees
# Celsius (the hottest sensor's; only where the device has one).
SYSTEM_METRICS: Mapping[str, tuple[float, float]] = {
    "cpu_pct": (0.0, 100.0), "proc_cpu_pct": (0.0, 100.0),
    "mem_used_bytes": (0.0, 2.0**53), "mem_total_bytes": (0.0, 2.0**53),
    "proc_rss_bytes": (0.0, 2.0**53), "temp_c": (-100.0, 200.0)}


@dataclass(frozen=True, kw_only=True)
class MetricSample(_Record):
    """One metric point (loss, accuracy, throughput_sps, network_bps, or one of the
    :data:`SYSTEM_METRICS`) on the run's clock; ``device`` is empty for a figure of the whole
    run. A system figure names its device and lies in its kind's range."""

    WHAT = "a metric point"
    at: float = wire(number(minimum=-math.inf))
    kind: str = wire(text())
    device: str = wire(text(empty=True), "")
    value: float = wire(number(minimum=-math.inf))

    def check(self) -> None:
        bounds = SYSTEM_METRICS.get(self.kind)
        if bounds is None:
            return
        if not self.device:
            raise fail("device", f"must name the device a {self.kind} point is of")
        low, high = bounds
        if not low <= self.value <= high:
            raise fail("value", f"must be from {low:g} to {high:g} for {self.kind}",
                       self.value)

    @classmethod
    def reader(cls) -> Reader:
        """As _Record's, the fields that ``check`` names included (``metrics[3].value``)."""
        def read(raw: Any, name: str) -> MetricSample:
            try:
                return cls._parse(raw, f"{name}.", what=name)
            except ProtocolError as exc:
                if exc.field in ("device", "value"):
                    raise fail(f"{name}.{exc.field}", exc.reason) from None
                raise
        return read


PEERS = mapping(slug, address, maximum=MAX_PEERS)
KEYS = mapping(slug, curve_key, maximum=MAX_PEERS)  # each peer's data-plane CURVE public key


# ---- messages: a "type", then fields


class Message(_Record):
    """A control-connection message: ``{"type": TYPE, ...fields}``."""

    TYPE: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, **self._json_fields()}

    @classmethod
    def from_json(cls: type[R], raw: Any) -> R:
        kind = cast(Any, cls).TYPE
        message = cls._parse(raw, what=f"the {kind} message", extra=("type",))
        if raw["type"] != kind:
            raise fail("type", f"must be {kind!r}", raw["type"])
        return message
