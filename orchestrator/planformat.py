"""The shared plan format (docs/architecture.md, "Plan"): a plan's stages, the cost model's
prediction and bound, and parsing a plan against the profile and devices it was made for.

Parsing is strict, as orchestrator.formats' is: a plan that skips or repeats a layer, names an
unknown device or carries an unknown field raises :class:`FormatError` naming the file, the
field and the value. Every dataclass is frozen and round-trips through ``to_json``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from orchestrator.formats import SCHEDULES, DeviceSet, ModelProfile
from orchestrator.validation import (
    At,
    expect_integer,
    expect_list,
    expect_number,
    expect_object,
    expect_string,
    read_json,
)


@dataclass(frozen=True)
class Stage:
    """A contiguous inclusive range of layers served by one device or by several replicas."""

    layers: tuple[int, int]
    devices: tuple[str, ...]

    @property
    def first(self) -> int:
        return self.layers[0]

    @property
    def last(self) -> int:
        return self.layers[1]

    def to_json(self) -> dict[str, Any]:
        return {"layers": list(self.layers), "devices": list(self.devices)}


@dataclass(frozen=True)
class Prediction:
    """What the cost model says of a plan (docs/architecture.md, "Cost model")."""

    period_s: float
    bottleneck: str
    throughput_sps: float
    memory_ok: bool
    stage_s: tuple[float, ...] = ()
    boundary_s: tuple[float, ...] = ()
    memory_need_bytes: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def to_json(self) -> dict[str, Any]:
        return {"period_s": self.period_s, "bottleneck": self.bottleneck,
                "throughput_sps": self.throughput_sps, "memory_ok": self.memory_ok,
                "stage_s": list(self.stage_s), "boundary_s": list(self.boundary_s),
                "memory_need_bytes": dict(self.memory_need_bytes)}


@dataclass(frozen=True)
class Bound:
    """How good a plan is known to be: a proven lower bound on the best achievable period."""

    lower_bound_s: float
    exact: bool

    def to_json(self) -> dict[str, Any]:
        return {"lower_bound_s": self.lower_bound_s, "exact": self.exact}


@dataclass(frozen=True)
class Plan:
    algorithm: str
    schedule: str
    microbatches: int
    stages: tuple[Stage, ...]
    beta: Mapping[str, Mapping[str, float]] | None = None
    predicted: Prediction | None = None
    planner_s: float = 0.0
    bound: Bound | None = None
    inflight: tuple[int, ...] | None = None
    notes: tuple[str, ...] = ()
    lag: tuple[int, ...] | None = None
    replica_inflight: Mapping[str, int] | None = None

    @property
    def two_lanes(self) -> frozenset[str]:
        """The devices that run forward and backward passes at once on two lanes: those with
        a beta split (a planner leaves out a device whose split brings nothing)."""
        return frozenset() if self.beta is None else frozenset(self.beta)

    def inflight_for(self, k: int) -> int:
        """Micro-batches stage k keeps in flight under 1F1B (default S - k)."""
        return len(self.stages) - k if self.inflight is None else self.inflight[k]

    def lag_for(self, k: int) -> int:
        """How far behind stage k's forwards' weights are under 1F1B (default its in-flight
        depth; more on a replicated stage, :func:`orchestrator.cost.choose_lag`)."""
        return self.inflight_for(k) if self.lag is None else self.lag[k]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"algorithm": self.algorithm, "schedule": self.schedule,
                               "microbatches": self.microbatches,
                               "stages": [s.to_json() for s in self.stages]}
        if self.inflight is not None:
            out["inflight"] = list(self.inflight)
        if self.lag is not None:
            out["lag"] = list(self.lag)
        if self.replica_inflight is not None:
            out["replica_inflight"] = dict(self.replica_inflight)
        if self.beta is not None:
            out["beta"] = {d: dict(r) for d, r in self.beta.items()}
        if self.predicted is not None:
            out["predicted"] = self.predicted.to_json()
        out["planner_s"] = self.planner_s
        if self.bound is not None:
            out["bound"] = self.bound.to_json()
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    @property
    def device_ids(self) -> tuple[str, ...]:
        return tuple(d for s in self.stages for d in s.devices)


def freeze_beta(beta: Mapping[str, Mapping[str, float]]) -> Mapping[str, Mapping[str, float]]:
    return MappingProxyType({d: MappingProxyType(dict(r)) for d, r in beta.items()})


def u_shaped(stage_devices: Sequence[Sequence[str]]) -> bool:
    """Is a pipeline of stages served by these devices U-shaped: three stages or more, the
    first and the last on one device (neither replicated), every other stage on devices of
    its own? That device holds both ends: the inputs and the labels stay on it (split
    learning's client holds part-1 and part-3)."""
    if len(stage_devices) < 3:
        return False
    first, last = tuple(stage_devices[0]), tuple(stage_devices[-1])
    if len(first) != 1 or first != last:
        return False
    middle = [d for devices in stage_devices[1:-1] for d in devices]
    return first[0] not in middle and len(set(middle)) == len(middle)


def check_stages(stages: Sequence[Stage], *, num_layers: int, device_ids: Sequence[str],
                 at: At | None = None) -> None:
    """Raise unless the stages cover layers 0..num_layers-1 once, in order, on known devices
    that each serve a single stage, except a U-shaped pipeline's: its first and last stages
    may share their one device (split learning: a client holds part-1 and part-3, and its
    labels never leave it)."""
    at = at or At("<plan>", "stages")
    if not stages:
        raise at.fail("must not be empty", show_value=False)
    known = set(device_ids)
    where_used: dict[str, int] = {}
    expected = 0
    for k, stage in enumerate(stages):
        sa = at.index(k)
        a, e = stage.layers
        if a != expected:
            if a > expected:
                raise sa.key("layers").fail(
                    f"skips layers {expected}..{a - 1} (the previous stage ends at {expected - 1})",
                    list(stage.layers))
            raise sa.key("layers").fail(
                f"repeats layers {a}..{expected - 1} (already in an earlier stage)",
                list(stage.layers))
        if e < a:
            raise sa.key("layers").fail("ends before it starts", list(stage.layers))
        if e >= num_layers:
            raise sa.key("layers").fail(f"goes past the last layer ({num_layers - 1})",
                                        list(stage.layers))
        if not stage.devices:
            raise sa.key("devices").fail("must name at least one device", show_value=False)
        for j, dev in enumerate(stage.devices):
            if dev not in known:
                raise sa.key("devices").index(j).fail("is not a known device", dev)
            if dev in where_used and not u_shaped([st.devices for st in stages]):
                raise sa.key("devices").index(j).fail(
                    f"already serves stage {where_used[dev]}; a device serves one stage (or "
                    "the first and the last of a U-shaped pipeline)", dev)
            where_used[dev] = k
        expected = e + 1
    if expected != num_layers:
        raise at.fail(f"leave layers {expected}..{num_layers - 1} unassigned", show_value=False)


def parse_plan_stages(raw: Any, at: At) -> list[Stage]:
    """A plan document's ``stages`` as Stages, each ``{layers: [first, last], devices}``
    read as it is (checked against a model and devices by :func:`check_stages`)."""
    stages = []
    for k, raw_stage in enumerate(expect_list(raw, at)):
        sa = at.index(k)
        so = expect_object(raw_stage, sa, ("layers", "devices"))
        bounds = expect_list(so["layers"], sa.key("layers"))
        if len(bounds) != 2:
            raise sa.key("layers").fail("must be [first, last]", bounds)
        first = expect_integer(bounds[0], sa.key("layers").index(0))
        last = expect_integer(bounds[1], sa.key("layers").index(1))
        names = tuple(expect_string(d, sa.key("devices").index(j))
                      for j, d in enumerate(expect_list(so["devices"], sa.key("devices"))))
        stages.append(Stage(layers=(first, last), devices=names))
    return stages


def parse_plan(raw: Any, *, profile: ModelProfile, devices: DeviceSet,
               file: str = "<input>") -> Plan:
    """Validate a plan document against the profile and devices it is meant for.

    ``predicted`` and ``planner_s`` are read back as given; call
    :func:`orchestrator.cost.evaluate` to recompute the prediction.
    """
    at = At(file)
    obj = expect_object(raw, at, ("algorithm", "stages"),
                  ("schedule", "microbatches", "beta", "predicted", "planner_s", "bound",
                   "inflight", "notes", "lag", "replica_inflight"))
    schedule = obj.get("schedule", "1f1b")
    if schedule not in SCHEDULES:
        raise at.key("schedule").fail(f"must be one of {', '.join(SCHEDULES)}", schedule)
    stages = parse_plan_stages(obj["stages"], at.key("stages"))
    check_stages(stages, num_layers=profile.num_layers, device_ids=devices.ids,
                 at=at.key("stages"))
    beta = None
    if obj.get("beta") is not None:
        beta = _parse_beta(obj["beta"], at.key("beta"), devices)
    predicted = None
    if obj.get("predicted") is not None:
        po = expect_object(obj["predicted"], at.key("predicted"),
                     ("period_s", "bottleneck", "throughput_sps", "memory_ok"),
                     ("stage_s", "boundary_s", "memory_need_bytes"))
        pa = at.key("predicted")
        predicted = Prediction(
            period_s=expect_number(po["period_s"], pa.key("period_s")),
            bottleneck=str(po["bottleneck"]),
            throughput_sps=expect_number(po["throughput_sps"], pa.key("throughput_sps")),
            memory_ok=bool(po["memory_ok"]),
            stage_s=tuple(float(x) for x in po.get("stage_s", [])),
            boundary_s=tuple(float(x) for x in po.get("boundary_s", [])),
            memory_need_bytes=MappingProxyType(
                {str(k): int(v) for k, v in po.get("memory_need_bytes", {}).items()}),
        )
    inflight = _depths(obj.get("inflight"), at.key("inflight"), len(stages))
    lag = _depths(obj.get("lag"), at.key("lag"), len(stages))
    if lag is not None and any(
            g < (len(stages) - k if inflight is None else inflight[k]) for k, g in enumerate(lag)):
        raise at.key("lag").fail("must be at least each stage's in-flight depth", list(lag))
    replica_inflight = None
    if obj.get("replica_inflight") is not None:
        ra = at.key("replica_inflight")
        raw_windows = obj["replica_inflight"]
        if not isinstance(raw_windows, dict):
            raise ra.fail("must map devices to depths", show_value=False)
        replicated = {d for stage in stages if len(stage.devices) > 1 for d in stage.devices}
        for dev in raw_windows:
            if dev not in replicated:
                raise ra.key(dev).fail("is not a device of a replicated stage", dev)
        replica_inflight = MappingProxyType({
            dev: expect_integer(x, ra.key(dev), minimum=1) for dev, x in raw_windows.items()})
    bound = None
    if obj.get("bound") is not None:
        bo = expect_object(obj["bound"], at.key("bound"), ("lower_bound_s", "exact"))
        bound = Bound(
            lower_bound_s=expect_number(bo["lower_bound_s"], at.key("bound.lower_bound_s")),
            exact=bool(bo["exact"]))
    notes = tuple(expect_string(n, at.key("notes").index(i))
                  for i, n in enumerate(expect_list(obj.get("notes", []), at.key("notes"),
                                                    nonempty=False)))
    return Plan(
        algorithm=expect_string(obj["algorithm"], at.key("algorithm")),
        schedule=schedule,
        microbatches=expect_integer(obj.get("microbatches", 1), at.key("microbatches"), minimum=1),
        stages=tuple(stages),
        beta=beta,
        predicted=predicted,
        planner_s=expect_number(obj.get("planner_s", 0.0), at.key("planner_s")),
        bound=bound,
        inflight=inflight,
        notes=notes,
        lag=lag,
        replica_inflight=replica_inflight,
    )


def _depths(raw: Any, at: At, num_stages: int) -> tuple[int, ...] | None:
    if raw is None:
        return None
    depths = expect_list(raw, at)
    if len(depths) != num_stages:
        raise at.fail(f"has {len(depths)} entries for {num_stages} stages", depths)
    return tuple(expect_integer(x, at.index(k), minimum=1) for k, x in enumerate(depths))


def _parse_beta(raw: Any, at: At, devices: DeviceSet) -> Mapping[str, Mapping[str, float]]:
    if not isinstance(raw, dict):
        raise at.fail("must be a JSON object", show_value=False)
    out: dict[str, dict[str, float]] = {}
    for dev_id, per_resource in raw.items():
        da = at.key(dev_id)
        if dev_id not in devices.ids:
            raise da.fail("is not a known device", dev_id)
        if not isinstance(per_resource, dict):
            raise da.fail("must map resource kinds to fractions", show_value=False)
        kinds = {r.kind for r in devices.device(dev_id).compute_resources}
        out[dev_id] = {}
        for kind, value in per_resource.items():
            if kind not in kinds:
                known = ", ".join(sorted(kinds))
                raise da.key(kind).fail(f"is not a resource of this device ({known})", kind)
            fraction = expect_number(value, da.key(kind))
            if fraction > 1:
                raise da.key(kind).fail("must be between 0 and 1", value)
            out[dev_id][kind] = fraction
    return freeze_beta(out)


def load_plan(path: str | Path, *, profile: ModelProfile, devices: DeviceSet) -> Plan:
    """Read a plan JSON file and validate it against a profile and a device set."""
    return parse_plan(read_json(path), profile=profile, devices=devices, file=str(path))
