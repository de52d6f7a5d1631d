"""The shared JSON formats: model profiles and device sets (docs/architecture.md); plans are in
orchestrator.planformat.

Parsing is strict: a missing field, an unknown field (usually a typo that would otherwise be a
silent default), a negative or non-finite number, ``layer_times`` of the wrong length, a plan that
skips or repeats a layer or names an unknown device all raise :class:`FormatError` naming the
file, the field and the value. Every dataclass is frozen and round-trips through ``to_json``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import FormatError
from orchestrator.validation import (
    At,
    expect_integer,
    expect_list,
    expect_number,
    expect_object,
    expect_string,
    read_json,
)

SCHEDULES = ("1f1b", "1f1b-sync", "gpipe")


def synchronous(schedule: str) -> bool:
    """Does ``schedule`` update once per batch, after a flush (``gpipe``, ``1f1b-sync``: every
    micro-batch of a batch on the same weights), rather than after every micro-batch on stashed
    weight versions (``1f1b``, PipeDream/FTPipeHD's asynchronous 1F1B)?"""
    return schedule != "1f1b"


# --------------------------------------------------------------------------- model profile


@dataclass(frozen=True)
class Layer:
    """The smallest cuttable unit of a model, timed on the reference device."""

    name: str
    kind: str
    forward_s: float
    backward_s: float
    output_bytes: int
    param_bytes: int
    activation_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "forward_s": self.forward_s,
                "backward_s": self.backward_s, "output_bytes": self.output_bytes,
                "param_bytes": self.param_bytes, "activation_bytes": self.activation_bytes}


@dataclass(frozen=True)
class ModelProfile:
    """Per-layer times and sizes of one model for micro-batches of ``batch_size`` samples."""

    model: str
    batch_size: int
    reference: str
    layers: tuple[Layer, ...]
    dataset: str | None = None
    source: str | None = None
    file: str = field(default="<input>", compare=False)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "batch_size": self.batch_size,
                               "reference": self.reference}
        if self.dataset is not None:
            out["dataset"] = self.dataset
        if self.source is not None:
            out["source"] = self.source
        out["layers"] = [layer.to_json() for layer in self.layers]
        return out


_LAYER_FIELDS = ("name", "kind", "forward_s", "backward_s", "output_bytes", "param_bytes",
                 "activation_bytes")


def parse_profile(raw: Any, *, file: str = "<input>") -> ModelProfile:
    """Validate a model-profile document and return it as a :class:`ModelProfile`."""
    at = At(file)
    obj = expect_object(raw, at, ("model", "batch_size", "reference", "layers"),
                        ("dataset", "source"))
    layers = []
    for i, raw_layer in enumerate(expect_list(obj["layers"], at.key("layers"))):
        la = at.key("layers").index(i)
        lo = expect_object(raw_layer, la, _LAYER_FIELDS)
        layers.append(Layer(
            name=expect_string(lo["name"], la.key("name")),
            kind=expect_string(lo["kind"], la.key("kind")),
            forward_s=expect_number(lo["forward_s"], la.key("forward_s")),
            backward_s=expect_number(lo["backward_s"], la.key("backward_s")),
            output_bytes=expect_integer(lo["output_bytes"], la.key("output_bytes")),
            param_bytes=expect_integer(lo["param_bytes"], la.key("param_bytes")),
            activation_bytes=expect_integer(lo["activation_bytes"], la.key("activation_bytes")),
        ))
    if sum(layer.forward_s + layer.backward_s for layer in layers) <= 0:
        raise at.key("layers").fail("every layer has zero forward and backward time: "
                                    "the model has no work to plan", show_value=False)
    dataset = obj.get("dataset")
    origin = obj.get("source")
    return ModelProfile(
        model=expect_string(obj["model"], at.key("model")),
        batch_size=expect_integer(obj["batch_size"], at.key("batch_size"), minimum=1),
        reference=expect_string(obj["reference"], at.key("reference")),
        layers=tuple(layers),
        dataset=None if dataset is None else expect_string(dataset, at.key("dataset")),
        source=None if origin is None else expect_string(origin, at.key("source")),
        file=file,
    )


def load_profile(path: str | Path) -> ModelProfile:
    """Read and validate a model-profile JSON file."""
    return parse_profile(read_json(path), file=str(path))


# --------------------------------------------------------------------------- devices


@dataclass(frozen=True)
class Resource:
    """One compute resource of a device (a CPU, a GPU); Duan-Wu split each between forward and
    backward work."""

    kind: str
    speed: float
    backward_speed: float

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "speed": self.speed, "backward_speed": self.backward_speed}


@dataclass(frozen=True)
class LayerTimes:
    """A device's own measured per-layer times; they replace reference time / speed."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return {"forward_s": list(self.forward_s), "backward_s": list(self.backward_s)}


@dataclass(frozen=True)
class Device:
    id: str
    speed: float
    memory_bytes: int
    bandwidth_bps: float
    latency_s: float = 0.0
    uplink_bps: float | None = None
    downlink_bps: float | None = None
    resources: tuple[Resource, ...] = ()
    layer_times: LayerTimes | None = None
    label: str | None = None
    overhead_s: float = 0.0  # fixed time a micro-batch costs a stage on it, beyond its layers
    # time a stage on it spends on each message it sends (encode, hand over, record), beyond
    # the link's transfer
    message_s: float = 0.0

    @property
    def up_bps(self) -> float:
        return self.bandwidth_bps if self.uplink_bps is None else self.uplink_bps

    @property
    def down_bps(self) -> float:
        return self.bandwidth_bps if self.downlink_bps is None else self.downlink_bps

    @property
    def compute_resources(self) -> tuple[Resource, ...]:
        """The device's resources; a device without ``resources`` is one CPU at ``speed``."""
        return self.resources or (Resource("cpu", self.speed, self.speed),)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id}
        if self.label is not None:
            out["label"] = self.label
        out.update(speed=self.speed, memory_bytes=self.memory_bytes,
                   bandwidth_bps=self.bandwidth_bps, latency_s=self.latency_s)
        if self.uplink_bps is not None:
            out["uplink_bps"] = self.uplink_bps
        if self.downlink_bps is not None:
            out["downlink_bps"] = self.downlink_bps
        if self.resources:
            out["resources"] = [r.to_json() for r in self.resources]
        if self.layer_times is not None:
            out["layer_times"] = self.layer_times.to_json()
        if self.overhead_s:
            out["overhead_s"] = self.overhead_s
        if self.message_s:
            out["message_s"] = self.message_s
        return out


@dataclass(frozen=True)
class Link:
    a: str
    b: str
    bandwidth_bps: float

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "bandwidth_bps": self.bandwidth_bps}


@dataclass(frozen=True)
class DeviceSet:
    """The devices of a testbed and the explicit links between some of them."""

    devices: tuple[Device, ...]
    links: tuple[Link, ...] = ()
    file: str = field(default="<input>", compare=False)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(d.id for d in self.devices)

    def device(self, device_id: str) -> Device:
        for d in self.devices:
            if d.id == device_id:
                return d
        raise KeyError(device_id)

    def bandwidth_bps(self, a: str, b: str) -> float:
        """The link entry between ``a`` and ``b`` if any, else the smaller of their bandwidths."""
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link.bandwidth_bps
        return min(self.device(a).bandwidth_bps, self.device(b).bandwidth_bps)

    def latency_s(self, a: str, b: str) -> float:
        return max(self.device(a).latency_s, self.device(b).latency_s)

    def subset(self, ids: Sequence[str]) -> DeviceSet:
        """The named devices (in the given order) and the links among them."""
        wanted = set(ids)
        unknown = wanted - set(self.ids)
        if unknown:
            raise KeyError(sorted(unknown)[0])
        return DeviceSet(devices=tuple(self.device(i) for i in ids),
                         links=tuple(li for li in self.links if {li.a, li.b} <= wanted),
                         file=self.file)

    def to_json(self) -> dict[str, Any]:
        return {"devices": [d.to_json() for d in self.devices],
                "links": [li.to_json() for li in self.links]}


_DEVICE_REQUIRED = ("id", "memory_bytes", "bandwidth_bps")
_DEVICE_OPTIONAL = ("speed", "latency_s", "uplink_bps", "downlink_bps", "resources", "layer_times",
                    "label", "overhead_s", "message_s")


def _parse_resources(raw: Any, at: At) -> tuple[Resource, ...]:
    out = []
    seen: set[str] = set()
    for j, raw_res in enumerate(expect_list(raw, at)):
        ra = at.index(j)
        ro = expect_object(raw_res, ra, ("kind", "speed"), ("backward_speed",))
        kind = expect_string(ro["kind"], ra.key("kind"))
        if kind in seen:
            raise ra.key("kind").fail("is repeated: each resource kind may appear once per device",
                                      kind)
        seen.add(kind)
        speed = expect_number(ro["speed"], ra.key("speed"), positive=True)
        backward = speed
        if "backward_speed" in ro:
            backward = expect_number(ro["backward_speed"], ra.key("backward_speed"),
                                     positive=True)
        out.append(Resource(kind=kind, speed=speed, backward_speed=backward))
    return tuple(out)


def _parse_layer_times(raw: Any, at: At) -> LayerTimes:
    obj = expect_object(raw, at, ("forward_s", "backward_s"))
    columns = []
    for name in ("forward_s", "backward_s"):
        ca = at.key(name)
        values = expect_list(obj[name], ca)
        columns.append(tuple(expect_number(v, ca.index(i)) for i, v in enumerate(values)))
    if len(columns[0]) != len(columns[1]):
        raise at.key("backward_s").fail(
            f"has {len(columns[1])} entries but forward_s has {len(columns[0])}", show_value=False)
    return LayerTimes(forward_s=columns[0], backward_s=columns[1])


def parse_layer_times(raw: Any, *, file: str = "<input>") -> LayerTimes:
    """Validate a device's measured per-layer times (``{forward_s: [...], backward_s:
    [...]}``, as a device's ``layer_times``)."""
    return _parse_layer_times(raw, At(file))


def _parse_device(raw: Any, at: At) -> Device:
    obj = expect_object(raw, at, _DEVICE_REQUIRED, _DEVICE_OPTIONAL)
    resources = (_parse_resources(obj["resources"], at.key("resources"))
                 if "resources" in obj else ())
    if "speed" in obj:
        speed = expect_number(obj["speed"], at.key("speed"), positive=True)
        if resources:
            total = sum(r.speed for r in resources)
            if not math.isclose(speed, total, rel_tol=1e-6):
                raise at.key("speed").fail(
                    f"must equal the sum of the resources' speeds ({total:g})", obj["speed"])
    elif resources:
        speed = sum(r.speed for r in resources)
    else:
        raise at.key("speed").fail("is missing (give speed or resources)", show_value=False)
    optional_bps = {}
    for name in ("uplink_bps", "downlink_bps"):
        if name in obj:
            optional_bps[name] = expect_number(obj[name], at.key(name), positive=True)
    label = obj.get("label")
    return Device(
        id=expect_string(obj["id"], at.key("id")),
        speed=speed,
        memory_bytes=expect_integer(obj["memory_bytes"], at.key("memory_bytes"), minimum=1),
        bandwidth_bps=expect_number(obj["bandwidth_bps"], at.key("bandwidth_bps"), positive=True),
        latency_s=expect_number(obj.get("latency_s", 0.0), at.key("latency_s")),
        uplink_bps=optional_bps.get("uplink_bps"),
        downlink_bps=optional_bps.get("downlink_bps"),
        resources=resources,
        layer_times=(_parse_layer_times(obj["layer_times"], at.key("layer_times"))
                     if "layer_times" in obj else None),
        label=None if label is None else expect_string(label, at.key("label")),
        overhead_s=expect_number(obj.get("overhead_s", 0.0), at.key("overhead_s")),
        message_s=expect_number(obj.get("message_s", 0.0), at.key("message_s")),
    )


def parse_devices(raw: Any, *, file: str = "<input>") -> DeviceSet:
    """Validate a devices document and return it as a :class:`DeviceSet`."""
    at = At(file)
    obj = expect_object(raw, at, ("devices",), ("links",))
    devices = []
    seen: set[str] = set()
    for i, raw_dev in enumerate(expect_list(obj["devices"], at.key("devices"))):
        dev = _parse_device(raw_dev, at.key("devices").index(i))
        if dev.id in seen:
            raise at.key("devices").index(i).key("id").fail("is repeated", dev.id)
        seen.add(dev.id)
        devices.append(dev)
    links = []
    raw_links = expect_list(obj.get("links", []), at.key("links"), nonempty=False)
    for i, raw_link in enumerate(raw_links):
        la = at.key("links").index(i)
        lo = expect_object(raw_link, la, ("a", "b", "bandwidth_bps"))
        ends = []
        for end in ("a", "b"):
            name = expect_string(lo[end], la.key(end))
            if name not in seen:
                raise la.key(end).fail("is not a device of this set", name)
            ends.append(name)
        if ends[0] == ends[1]:
            raise la.key("b").fail("links a device to itself", ends[1])
        links.append(Link(a=ends[0], b=ends[1],
                          bandwidth_bps=expect_number(lo["bandwidth_bps"], la.key("bandwidth_bps"),
                                                positive=True)))
    return DeviceSet(devices=tuple(devices), links=tuple(links), file=file)


def load_devices(path: str | Path) -> DeviceSet:
    """Read and validate a devices JSON file."""
    return parse_devices(read_json(path), file=str(path))


def check_compatible(profile: ModelProfile, devices: DeviceSet) -> None:
    """Raise if a device's measured ``layer_times`` do not have one entry per profiled layer."""
    for i, dev in enumerate(devices.devices):
        if dev.layer_times is None:
            continue
        n = len(dev.layer_times.forward_s)
        if n != profile.num_layers:
            raise FormatError(
                f"has {n} entries but the profile {profile.model!r} ({profile.file}) has "
                f"{profile.num_layers} layers",
                file=devices.file, field=f"devices[{i}].layer_times.forward_s")
