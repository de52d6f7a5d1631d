"""The messages the server and the agents exchange, as typed values both sides import.

Stdlib only (the agent runs with requirements-agent.txt): frozen dataclasses with ``to_json``
and ``from_json``. ``from_json`` is strict: a missing field, an unknown one, a value of the
wrong type or out of range raises :class:`ProtocolError` naming the field, so a malformed
message changes nothing on the side that receives it. docs/architecture.md, "Agent control
protocol", lists them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from orchestrator.formats import SCHEDULES
from orchestrator.schedule import Schedule, build_schedule

T = TypeVar("T")

MAX_STAGES = 64
MAX_REPLICAS = 64
MAX_NAME = 200


class ProtocolError(ValueError):
    """A message that does not follow the protocol; says which field and why."""


# --------------------------------------------------------------------------- field readers


def _fail(name: str, reason: str, value: Any = None) -> ProtocolError:
    shown = "" if value is None else f", got {value!r}"[:120]
    return ProtocolError(f"{name}: {reason}{shown}")


def _int(raw: Any, name: str, *, minimum: int = 0, maximum: int = 2**53) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not minimum <= raw <= maximum:
        raise _fail(name, f"must be an integer from {minimum} to {maximum}", raw)
    return raw


def _number(raw: Any, name: str, *, minimum: float = 0.0, maximum: float = math.inf,
            above: bool = False) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise _fail(name, "must be a finite number", raw)
    value = float(raw)
    if value < minimum or value > maximum or (above and value <= minimum):
        bound = f"above {minimum:g}" if above else f"at least {minimum:g}"
        limit = "" if math.isinf(maximum) else f" and at most {maximum:g}"
        raise _fail(name, f"must be {bound}{limit}", raw)
    return value


def _text(raw: Any, name: str, *, maximum: int = MAX_NAME) -> str:
    if not isinstance(raw, str) or not raw or len(raw) > maximum:
        raise _fail(name, f"must be a non-empty string of at most {maximum} characters",
                    raw if isinstance(raw, str) else None)
    return raw


def _bool(raw: Any, name: str) -> bool:
    if not isinstance(raw, bool):
        raise _fail(name, "must be true or false", raw)
    return raw


def _list(raw: Any, name: str, *, maximum: int, minimum: int = 0) -> list[Any]:
    if not isinstance(raw, list) or not minimum <= len(raw) <= maximum:
        raise _fail(name, f"must be a list of {minimum} to {maximum} items")
    return raw


def _optional(raw: Any, read: Callable[[Any], T]) -> T | None:
    return None if raw is None else read(raw)


def _object(raw: Any, what: str, required: Sequence[str], optional: Sequence[str]
            ) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise ProtocolError(f"{what} must be a JSON object")
    missing = [k for k in required if k not in raw]
    if missing:
        raise _fail(missing[0], f"is missing from {what}")
    unknown = sorted(set(raw) - set(required) - set(optional))
    if unknown:
        raise _fail(unknown[0], f"is not a field of {what}")
    return raw


# --------------------------------------------------------------------------- the stage spec


@dataclass(frozen=True)
class StageSpec:
    """Everything a device needs to run its stage of a run (the ``spec`` of ``deploy``).

    The pipeline: ``stage_devices`` (each stage's group of replicas, in pipeline order) and
    ``stage_times_s`` (each replica's time per micro-batch, by which replicas share
    micro-batches); 1F1B's ``inflight`` depths, ``lag`` (a replicated stage forwards m on the
    updates up to m - lag) and ``replica_inflight`` (each replica's own span in flight);
    ``two_lanes``, the devices that run forward and backward passes at once (Duan-Wu), and
    this device's ``lane_shares`` (the fraction of its full speed each of its passes gets
    while the other runs). Training: ``lr``, ``momentum``, ``seed``, ``vertical_sync`` (1F1B:
    every stage forwards m on the version stage 0 used), ``aggregate_every`` (FTPipeHD's
    weight aggregation, every that many in-flight windows; 0 off). Fault tolerance:
    ``generation``, ``first_microbatch`` (the resume point), ``chain_every`` and
    ``global_every`` (replication points, in micro-batches applied), the backward timer's
    ``suspect_factor`` and ``suspect_min_s``.
    """

    run: int
    device: str
    stage: int
    layers: tuple[int, int]
    model: str
    dataset: str
    batch_size: int
    schedule: str
    stage_devices: tuple[tuple[str, ...], ...]
    stage_times_s: tuple[tuple[float, ...], ...]
    microbatches: int
    flush_every: int | None = None
    inflight: tuple[int, ...] | None = None
    lag: tuple[int, ...] | None = None
    replica_inflight: tuple[tuple[str, int], ...] = ()
    two_lanes: tuple[str, ...] = ()
    lane_shares: tuple[float, float] | None = None
    lr: float = 0.1
    momentum: float = 0.0
    seed: int = 0
    vertical_sync: bool = False
    aggregate_every: int = 0
    receive_timeout_s: float = 60.0
    generation: int = 0
    first_microbatch: int = 0
    chain_every: int = 0
    global_every: int = 0
    suspect_factor: float = 4.0
    suspect_min_s: float = 0.5

    def __post_init__(self) -> None:
        self.check()

    # ---- derived

    @property
    def num_stages(self) -> int:
        return len(self.stage_devices)

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.num_stages - 1

    @property
    def replicas(self) -> tuple[str, ...]:
        """The devices of this stage's group (this one among them)."""
        return self.stage_devices[self.stage]

    @property
    def replicated(self) -> bool:
        return len(self.replicas) > 1

    @property
    def two_lane(self) -> bool:
        return self.device in self.two_lanes

    @property
    def pipeline_lag(self) -> int:
        """Under vertical sync every stage forwards m on the updates up to m - this: the
        largest lag of any stage (none can forward on weights it has not applied)."""
        depths = [self.num_stages - k if self.inflight is None else self.inflight[k]
                  for k in range(self.num_stages)]
        lags = depths if self.lag is None else list(self.lag)
        return max(depths[0], *lags)

    @property
    def tag(self) -> str:
        """The data-plane name of this generation's messages: a late activation of the
        generation before a recovery is never taken for one of this generation."""
        return f"g{self.generation}"

    def build_schedule(self) -> Schedule:
        """The schedule of this generation's micro-batches, numbered from 0 (the executor
        adds ``first_microbatch``)."""
        return build_schedule(name=self.schedule, stage_devices=self.stage_devices,
                              stage_times_s=self.stage_times_s,
                              microbatches=self.microbatches - self.first_microbatch,
                              flush_every=self.flush_every, inflight=self.inflight, lag=self.lag,
                              replica_inflight=dict(self.replica_inflight) or None,
                              two_lanes=self.two_lanes)

    # ---- validation and JSON

    def check(self) -> None:
        """Raise ProtocolError unless the spec is one a device can run."""
        if self.schedule not in SCHEDULES:
            raise _fail("schedule", f"must be one of {', '.join(SCHEDULES)}", self.schedule)
        if not self.stage_devices or len(self.stage_devices) > MAX_STAGES:
            raise _fail("stage_devices", f"must list 1 to {MAX_STAGES} stages")
        if len(self.stage_times_s) != self.num_stages or any(
                len(t) != len(d) for t, d in zip(self.stage_times_s, self.stage_devices,
                                                 strict=True)):
            raise _fail("stage_times_s", "needs one time per replica of each stage")
        every = [d for group in self.stage_devices for d in group]
        if len(set(every)) != len(every):
            raise _fail("stage_devices", "names a device twice")
        if not 0 <= self.stage < self.num_stages:
            raise _fail("stage", f"is not in 0..{self.num_stages - 1}", self.stage)
        if self.device not in self.stage_devices[self.stage]:
            raise _fail("device", f"does not serve stage {self.stage}", self.device)
        a, e = self.layers
        if not 0 <= a <= e:
            raise _fail("layers", "must be [first, last] with first <= last", list(self.layers))
        if self.batch_size < 1 or self.microbatches < 1:
            raise _fail("microbatches", "batch_size and microbatches must be positive")
        if not self.lr > 0:
            raise _fail("lr", "must be above 0", self.lr)
        for name, depths in (("inflight", self.inflight), ("lag", self.lag)):
            if depths is not None and (len(depths) != self.num_stages or min(depths) < 1):
                raise _fail(name, f"needs one positive depth per stage ({self.num_stages})")
        unknown = sorted({d for d, _ in self.replica_inflight} - set(every))
        if unknown:
            raise _fail("replica_inflight", "names a device that serves no stage", unknown[0])
        unknown = sorted(set(self.two_lanes) - set(every))
        if unknown:
            raise _fail("two_lanes", "names a device that serves no stage", unknown[0])
        if self.two_lane != (self.lane_shares is not None):
            raise _fail("lane_shares", "goes with a device on two lanes, and only with one")
        if self.lane_shares is not None and not all(0 < s <= 1 for s in self.lane_shares):
            raise _fail("lane_shares", "must be two fractions in (0, 1]", list(self.lane_shares))
        if not 0 <= self.first_microbatch < self.microbatches:
            raise _fail("first_microbatch", f"is not in 0..{self.microbatches - 1}",
                        self.first_microbatch)
        if self.schedule == "gpipe" and self.first_microbatch % (self.flush_every or 1):
            raise _fail("first_microbatch", "under gpipe a generation resumes at a batch "
                        f"boundary (a multiple of {self.flush_every})", self.first_microbatch)
        if self.aggregate_every and self.schedule != "1f1b":
            raise _fail("aggregate_every", "weight aggregation is for the asynchronous 1f1b")
        if min(self.generation, self.chain_every, self.global_every, self.aggregate_every) < 0:
            raise _fail("generation", "generation, chain_every, global_every and "
                        "aggregate_every must not be negative")
        if not (self.suspect_factor > 0 and self.suspect_min_s > 0
                and self.receive_timeout_s > 0):
            raise _fail("suspect_factor", "suspect_factor, suspect_min_s and "
                        "receive_timeout_s must be positive")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("layers", "inflight", "lag", "two_lanes", "lane_shares"):
                value = None if value is None else list(value)
            elif f.name == "stage_devices" or f.name == "stage_times_s":
                value = [list(group) for group in value]
            elif f.name == "replica_inflight":
                value = dict(value)
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, raw: Any) -> StageSpec:
        names = [f.name for f in fields(cls)]
        required = names[:names.index("microbatches") + 1]
        obj = _object(raw, "the stage spec", required, names[len(required):])
        groups = _list(obj["stage_devices"], "stage_devices", minimum=1, maximum=MAX_STAGES)
        stage_devices = tuple(
            tuple(_text(d, f"stage_devices[{k}][{r}]") for r, d in enumerate(
                _list(g, f"stage_devices[{k}]", minimum=1, maximum=MAX_REPLICAS)))
            for k, g in enumerate(groups))
        times = _list(obj["stage_times_s"], "stage_times_s", maximum=MAX_STAGES)
        stage_times_s = tuple(
            tuple(_number(t, f"stage_times_s[{k}][{r}]") for r, t in enumerate(
                _list(g, f"stage_times_s[{k}]", maximum=MAX_REPLICAS)))
            for k, g in enumerate(times))
        layers = _list(obj["layers"], "layers", minimum=2, maximum=2)

        def depths(key: str) -> tuple[int, ...] | None:
            return _optional(obj.get(key), lambda r: tuple(
                _int(x, f"{key}[{k}]", minimum=1) for k, x in enumerate(
                    _list(r, key, maximum=MAX_STAGES))))

        windows = obj.get("replica_inflight") or {}
        if not isinstance(windows, dict):
            raise _fail("replica_inflight", "must map devices to depths")
        shares = obj.get("lane_shares")
        lane_shares = None if shares is None else tuple(
            _number(s, f"lane_shares[{i}]") for i, s in enumerate(
                _list(shares, "lane_shares", minimum=2, maximum=2)))
        return cls(
            run=_int(obj["run"], "run"), device=_text(obj["device"], "device"),
            stage=_int(obj["stage"], "stage", maximum=MAX_STAGES),
            layers=(_int(layers[0], "layers[0]"), _int(layers[1], "layers[1]")),
            model=_text(obj["model"], "model"),
            dataset=_text(obj["dataset"], "dataset", maximum=4096),
            batch_size=_int(obj["batch_size"], "batch_size", minimum=1, maximum=2**20),
            schedule=_text(obj["schedule"], "schedule"), stage_devices=stage_devices,
            stage_times_s=stage_times_s,
            microbatches=_int(obj["microbatches"], "microbatches", minimum=1),
            flush_every=_optional(obj.get("flush_every"),
                                  lambda r: _int(r, "flush_every", minimum=1)),
            inflight=depths("inflight"), lag=depths("lag"),
            replica_inflight=tuple(sorted(
                (_text(d, "replica_inflight"), _int(x, f"replica_inflight.{d}", minimum=1))
                for d, x in windows.items())),
            two_lanes=tuple(_text(d, f"two_lanes[{i}]") for i, d in enumerate(
                _list(obj.get("two_lanes") or [], "two_lanes", maximum=MAX_REPLICAS))),
            lane_shares=None if lane_shares is None else (lane_shares[0], lane_shares[1]),
            lr=_number(obj.get("lr", 0.1), "lr", above=True),
            momentum=_number(obj.get("momentum", 0.0), "momentum", maximum=0.999999),
            seed=_int(obj.get("seed", 0), "seed"),
            vertical_sync=_bool(obj.get("vertical_sync", False), "vertical_sync"),
            aggregate_every=_int(obj.get("aggregate_every", 0), "aggregate_every",
                                 maximum=10**6),
            receive_timeout_s=_number(obj.get("receive_timeout_s", 60.0), "receive_timeout_s",
                                      above=True),
            generation=_int(obj.get("generation", 0), "generation"),
            first_microbatch=_int(obj.get("first_microbatch", 0), "first_microbatch"),
            chain_every=_int(obj.get("chain_every", 0), "chain_every"),
            global_every=_int(obj.get("global_every", 0), "global_every"),
            suspect_factor=_number(obj.get("suspect_factor", 4.0), "suspect_factor",
                                   above=True),
            suspect_min_s=_number(obj.get("suspect_min_s", 0.5), "suspect_min_s", above=True))
