"""The messages the server and the agents exchange, as typed values both sides import.

Stdlib only (the agent runs with requirements-agent.txt): frozen dataclasses with ``to_json``
and ``from_json``. ``from_json`` is strict: a missing field, an unknown one, a value of the
wrong type or out of range raises :class:`ProtocolError` naming the field, so a malformed
message changes nothing on the side that receives it; a message built in code is checked by
the same rules. docs/architecture.md, "Agent control protocol", lists them:

- the stage spec a ``deploy`` carries (:class:`StageSpec`);
- the server's commands, one class each, named in one registry, :data:`COMMANDS`, that the
  server builds from and the agent dispatches on (:func:`parse_command`);
- the agent's messages to the server (:data:`AGENT_MESSAGES`, :func:`parse_agent_message`)
  and the server's replies (:data:`SERVER_MESSAGES`, :func:`parse_server_message`);
- the names of the weight messages agents send each other on the data plane (a chain
  replica, a fetch and its answer: :func:`parse_weight_name`).
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, ClassVar, TypeVar, cast

from orchestrator.formats import SCHEDULES
from orchestrator.schedule import Schedule, build_schedule

T = TypeVar("T")
R = TypeVar("R", bound="_Record")

MAX_STAGES = 64
MAX_REPLICAS = 64
MAX_PIPELINES = 1024
MAX_NAME = 200
MAX_TEXT = 4000  # an error or a refusal's reason
MAX_EVENTS = 100_000  # timeline events, faults or metric points in one batch
MAX_PEERS = 1024
MAX_RESOURCES = 8
MAX_LAYER = 10**6


class ProtocolError(ValueError):
    """A message that does not follow the protocol; says which field (``field``, a path such
    as ``links[0].latency_s``, or None for the message as a whole) and why (``reason``)."""

    def __init__(self, message: str, *, field: str | None = None,
                 reason: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.reason = message if reason is None else reason


# --------------------------------------------------------------------------- field readers


def _fail(name: str, reason: str, value: Any = None) -> ProtocolError:
    shown = "" if value is None else f", got {value!r}"[:120]
    return ProtocolError(f"{name}: {reason}{shown}", field=name, reason=f"{reason}{shown}")


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


def _object(raw: Any, what: str, required: Sequence[str], optional: Sequence[str], *,
            prefix: str = "") -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise ProtocolError(f"{prefix.rstrip('.') or what} must be a JSON object",
                            field=prefix.rstrip(".") or None, reason="must be a JSON object")
    missing = [k for k in required if k not in raw]
    if missing:
        raise _fail(prefix + missing[0], f"is missing from {what}")
    unknown = sorted(set(raw) - set(required) - set(optional), key=str)
    if unknown:
        raise _fail(prefix + str(unknown[0]), f"is not a field of {what}")
    return raw


# Readers for the fields of a message: each takes the raw JSON value and the field's name (its
# path in the message) and returns the typed value or raises ProtocolError naming it.
Reader = Callable[[Any, str], Any]


def integer(*, minimum: int = 0, maximum: int = 2**53) -> Reader:
    return lambda raw, name: _int(raw, name, minimum=minimum, maximum=maximum)


def number(*, minimum: float = 0.0, maximum: float = math.inf, above: bool = False) -> Reader:
    return lambda raw, name: _number(raw, name, minimum=minimum, maximum=maximum, above=above)


def seconds(maximum: float) -> Reader:
    """A duration a device measured, from 0 to ``maximum`` seconds."""
    def read(raw: Any, name: str) -> float:
        if (isinstance(raw, bool) or not isinstance(raw, (int, float))
                or not (math.isfinite(raw) and 0 <= raw <= maximum)):
            raise _fail(name, f"must be between 0 and {maximum:g} seconds", raw)
        return float(raw)
    return read


def text(*, maximum: int = MAX_NAME, empty: bool = False) -> Reader:
    def read(raw: Any, name: str) -> str:
        if empty and raw == "":
            return ""
        return _text(raw, name, maximum=maximum)
    return read


def flag() -> Reader:
    return _bool


def one_of(*choices: str) -> Reader:
    def read(raw: Any, name: str) -> str:
        if raw not in choices:
            raise _fail(name, f"must be {' or '.join(choices)}", raw)
        return cast(str, raw)
    return read


_ADDRESS = re.compile(r"tcp://([^\s/:]+|\[[0-9a-fA-F:.]+\]):([0-9]{1,5})")


def address(raw: Any, name: str) -> str:
    """A data plane's address, ``tcp://host:port`` with a numeric port."""
    match = _ADDRESS.fullmatch(raw) if isinstance(raw, str) and len(raw) <= MAX_NAME else None
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise _fail(name, f"must be tcp://host:port (at most {MAX_NAME} characters)",
                    raw if isinstance(raw, str) else None)
    return cast(str, raw)


_SLUG = re.compile(r"[A-Za-z0-9_-]{1,64}")
_KIND = re.compile(r"[a-z][a-z0-9_]{0,15}")


def slug(raw: Any, name: str) -> str:
    """A device uid: 1 to 64 letters, digits, '_' or '-'."""
    if not isinstance(raw, str) or not _SLUG.fullmatch(raw):
        raise _fail(name, "must be 1 to 64 letters, digits, '_' or '-'",
                    raw if isinstance(raw, str) else None)
    return raw


def kind_name(raw: Any, name: str) -> str:
    """A short identifier (a resource's kind): a lower-case letter, then up to 15 lower-case
    letters, digits or '_'."""
    if not isinstance(raw, str) or not _KIND.fullmatch(raw):
        raise _fail(name, "must be a short identifier (a-z, then up to 15 of a-z, 0-9, _)",
                    raw if isinstance(raw, str) else None)
    return raw


def items(read: Reader, *, maximum: int, minimum: int = 0) -> Reader:
    """A list whose items ``read`` reads, as a tuple; items are named ``name[i]``."""
    return lambda raw, name: tuple(read(x, f"{name}[{i}]") for i, x in enumerate(
        _list(raw, name, minimum=minimum, maximum=maximum)))


def layer_range(raw: Any, name: str) -> tuple[int, int]:
    """``[first, last]`` with 0 <= first <= last."""
    first, last = (_int(x, f"{name}[{i}]", maximum=MAX_LAYER)
                   for i, x in enumerate(_list(raw, name, minimum=2, maximum=2)))
    if last < first:
        raise _fail(name, "must be [first, last] with first <= last", raw)
    return first, last


def mapping(read_key: Reader, read_value: Reader, *, maximum: int) -> Reader:
    """A JSON object read key by key (each value named ``name.key``)."""
    def read(raw: Any, name: str) -> dict[str, Any]:
        if not isinstance(raw, dict) or len(raw) > maximum:
            raise _fail(name, f"must be a JSON object of at most {maximum} entries")
        return {read_key(k, name): read_value(v, f"{name}.{k}") for k, v in raw.items()}
    return read


def json_object(*, maximum: int = 256) -> Reader:
    """A JSON object whose contents another format checks (a profile, a timeline event)."""
    def read(raw: Any, name: str) -> dict[str, Any]:
        if not isinstance(raw, dict) or len(raw) > maximum:
            raise _fail(name, f"must be a JSON object of at most {maximum} entries")
        return raw
    return read


def _wire(read: Reader, default: Any = MISSING, *, factory: Any = MISSING) -> Any:
    """A message field read by ``read``; with a default it may be left out (None: absent)."""
    return field(default=default, default_factory=factory, metadata={"read": read})


def _to_json(value: Any) -> Any:
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [_to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _to_json(v) for k, v in value.items()}
    return value


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
    ``suspect_factor`` and ``suspect_min_s``. Runs of several pipelines
    (orchestrator.runplan): the stage's ``pipeline``, and, for a stage in an aggregation
    group, ``round_every`` (micro-batches of its pipeline a round), the ``group``'s members
    (device, pipeline, stage) in ring order, this one among them, and its FedAvg
    ``group_weight``.
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
    pipeline: int = 0
    round_every: int = 0
    group: tuple[tuple[str, int, int], ...] = ()
    group_weight: float = 1.0

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
        """The data-plane name of this generation's messages of this pipeline: a late
        activation of the generation before a recovery is never taken for one of this
        generation, nor one of another pipeline's stage on the same device."""
        return f"g{self.generation}" + (f"p{self.pipeline}" if self.pipeline else "")

    @property
    def member(self) -> tuple[str, int, int]:
        """This stage as a member of an aggregation group."""
        return (self.device, self.pipeline, self.stage)

    def build_schedule(self) -> Schedule:
        """The schedule of this generation's micro-batches, numbered from 0 (the executor
        adds ``first_microbatch``)."""
        return build_schedule(name=self.schedule, stage_devices=self.stage_devices,
                              stage_times_s=self.stage_times_s,
                              microbatches=self.microbatches - self.first_microbatch,
                              flush_every=self.flush_every, inflight=self.inflight, lag=self.lag,
                              replica_inflight=dict(self.replica_inflight) or None,
                              two_lanes=self.two_lanes, pipeline=self.pipeline,
                              rounds={self.stage: self.round_every} if self.round_every
                              else None)

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
        if bool(self.round_every) != bool(self.group) or (
                self.group and (self.member not in self.group
                                or len(set(self.group)) != len(self.group)
                                or len(self.group) < 2)):
            raise _fail("group", "an aggregation group lists this stage and another, each "
                        "once, and goes with round_every")
        if not (self.group_weight > 0 and math.isfinite(self.group_weight)):
            raise _fail("group_weight", "must be a positive number", self.group_weight)
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
            elif f.name == "group":
                value = [list(member) for member in value]
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
            suspect_min_s=_number(obj.get("suspect_min_s", 0.5), "suspect_min_s", above=True),
            pipeline=_int(obj.get("pipeline", 0), "pipeline", maximum=MAX_PIPELINES),
            round_every=_int(obj.get("round_every", 0), "round_every"),
            group=tuple(_member(m, f"group[{i}]") for i, m in enumerate(
                _list(obj.get("group") or [], "group", maximum=MAX_PIPELINES))),
            group_weight=_number(obj.get("group_weight", 1.0), "group_weight", above=True))


def _member(raw: Any, name: str) -> tuple[str, int, int]:
    device, pipeline, stage = _list(raw, name, minimum=3, maximum=3)
    return (_text(device, f"{name}[0]"), _int(pipeline, f"{name}[1]", maximum=MAX_PIPELINES),
            _int(stage, f"{name}[2]", maximum=MAX_STAGES))


# --------------------------------------------------------------------------- typed messages


def _fields(obj: Any) -> tuple[Field[Any], ...]:
    return fields(obj)


def _required(cls: type) -> list[str]:
    return [f.name for f in _fields(cls)
            if f.default is MISSING and f.default_factory is MISSING]


class _Record:
    """A JSON object whose fields are declared with :func:`_wire`: ``to_json`` leaves out the
    optional fields that are None, ``from_json`` reads each field with its reader. Built in
    code or read, a record obeys the same rules (``__post_init__`` reads its own JSON form),
    then ``check`` for the rules that tie fields together."""

    WHAT: ClassVar[str] = "the record"

    def __post_init__(self) -> None:
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
        obj = _object(raw, what or cls.WHAT, [*extra, *required],
                      [n for n in names if n not in required], prefix=prefix)
        return cls(**cls._read_fields(obj, prefix))

    @classmethod
    def from_json(cls: type[R], raw: Any) -> R:
        return cls._parse(raw)

    @classmethod
    def reader(cls) -> Reader:
        """Read a field holding one of these (its fields named ``name.field``)."""
        return lambda raw, name: cls._parse(raw, f"{name}.", what=name)


def _stage_spec(raw: Any, name: str) -> StageSpec:
    try:
        return StageSpec.from_json(raw)
    except ProtocolError as exc:
        where = name if exc.field is None else f"{name}.{exc.field}"
        raise ProtocolError(f"{name}.{exc}", field=where, reason=exc.reason) from None


# ---- what messages carry


@dataclass(frozen=True, kw_only=True)
class DeviceResource(_Record):
    """One compute resource of a device as its agent reports it (``--resources``): its kind
    and its forward and backward speeds, relative to the device's other resources."""

    WHAT = "a resource"
    kind: str = _wire(kind_name)
    speed: float = _wire(number(above=True))
    backward_speed: float = _wire(number(above=True))


def resources_reader(raw: Any, name: str) -> tuple[DeviceResource, ...]:
    """1 to MAX_RESOURCES resources, each kind once."""
    read = items(DeviceResource.reader(), minimum=1, maximum=MAX_RESOURCES)
    resources: tuple[DeviceResource, ...] = read(raw, name)
    kinds = [r.kind for r in resources]
    for i, kind in enumerate(kinds):
        if kind in kinds[:i]:
            raise _fail(f"{name}[{i}].kind", "is repeated: each kind once per device", kind)
    return resources


@dataclass(frozen=True, kw_only=True)
class RestorePart(_Record):
    """A part of a recovering stage's weights and where to load it from (``deploy``'s
    ``restore``): ``source`` is ``self``, a device uid or ``central`` (the server); the
    server also says which device loads it, the kind of copy and its size."""

    WHAT = "a restore part"
    layers: tuple[int, int] = _wire(layer_range)
    applied: int = _wire(integer())
    source: str = _wire(text())
    device: str | None = _wire(text(), None)
    kind: str | None = _wire(text(), None)
    bytes: int | None = _wire(integer(), None)


@dataclass(frozen=True, kw_only=True)
class HeldCopy(_Record):
    """A copy of layers at ``applied`` that an agent holds (``halt``'s ack): its stage's own
    checkpoint or a chain replica of another stage."""

    WHAT = "a holding"
    layers: tuple[int, int] = _wire(layer_range)
    applied: int = _wire(integer())
    kind: str = _wire(one_of("own", "replica"))


@dataclass(frozen=True, kw_only=True)
class MeasuredLink(_Record):
    """The link to a peer as an agent measured it over the data plane (``links``)."""

    WHAT = "a link"
    peer: str = _wire(text())
    bandwidth_bps: float = _wire(number(above=True))
    latency_s: float = _wire(number(maximum=60))


@dataclass(frozen=True, kw_only=True)
class ModelSpecRef(_Record):
    """A model, data set and batch size (what a profile is of)."""

    WHAT = "a model spec"
    model: str = _wire(text())
    dataset: str = _wire(text(maximum=4096))
    batch_size: int = _wire(integer(minimum=1, maximum=2**20))


@dataclass(frozen=True, kw_only=True)
class MetricSample(_Record):
    """One metric point (loss, accuracy, throughput_sps, network_bps) on the run's clock;
    ``device`` is empty for a figure of the whole run."""

    WHAT = "a metric point"
    at: float = _wire(number(minimum=-math.inf))
    kind: str = _wire(text())
    device: str = _wire(text(empty=True), "")
    value: float = _wire(number(minimum=-math.inf))


PEERS = mapping(slug, address, maximum=MAX_PEERS)


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
            raise _fail("type", f"must be {kind!r}", raw["type"])
        return message


# ---- the server's commands


def new_command_id() -> str:
    return secrets.token_hex(6)


@dataclass(frozen=True, kw_only=True)
class Command(Message):
    """``{"type": "command", "id", "command": NAME, ...}``; the agent answers each with an
    :class:`Ack` naming its id."""

    TYPE = "command"
    NAME: ClassVar[str]
    id: str = _wire(text(maximum=64), factory=new_command_id)

    def to_json(self) -> dict[str, Any]:
        rest = self._json_fields()
        return {"type": self.TYPE, "id": rest.pop("id"), "command": self.NAME, **rest}

    @classmethod
    def from_json(cls: type[R], raw: Any) -> R:
        name = cast(Any, cls).NAME
        command = cls._parse(raw, what=f"the {name} command", extra=("type", "command", "id"))
        if raw["type"] != "command":
            raise _fail("type", "must be 'command'", raw["type"])
        if raw["command"] != name:
            raise _fail("command", f"must be {name!r}", raw["command"])
        return command


@dataclass(frozen=True, kw_only=True)
class ProfileCommand(Command):
    """Profile a zoo model layer by layer (progress messages, then the profile)."""

    NAME = "profile"
    model: str = _wire(text())
    dataset: str = _wire(text(maximum=4096), "digits")
    batch_size: int = _wire(integer(minimum=1, maximum=2**20), 32)


@dataclass(frozen=True, kw_only=True)
class DeployCommand(Command):
    """Build this device's stage of a run and connect to its neighbours; after a recovery,
    load the weights ``restore`` lists."""

    NAME = "deploy"
    run: int = _wire(integer())
    spec: StageSpec = _wire(_stage_spec)  # noqa: RUF009 (a dataclasses.field)
    peers: Mapping[str, str] = _wire(PEERS, factory=dict)
    started_at: float | None = _wire(number(), None)
    restore: tuple[RestorePart, ...] | None = _wire(
        items(RestorePart.reader(), maximum=MAX_LAYER), None)

    def check(self) -> None:
        if self.spec.run != self.run:
            raise _fail("spec.run", f"is not the command's run {self.run}", self.spec.run)


@dataclass(frozen=True, kw_only=True)
class StartCommand(Command):
    """Run the deployed stage from the common start time (``begin_at`` after a recovery;
    ``paused``: wait for ``resume``)."""

    NAME = "start"
    run: int = _wire(integer())
    started_at: float = _wire(number())
    generation: int | None = _wire(integer(), None)
    begin_at: float | None = _wire(number(), None)
    paused: bool | None = _wire(flag(), None)


@dataclass(frozen=True, kw_only=True)
class RunCommand(Command):
    """A command about the run's stage held here (of ``generation``, when given)."""

    run: int = _wire(integer())
    generation: int | None = _wire(integer(), None)


@dataclass(frozen=True, kw_only=True)
class PauseCommand(RunCommand):
    NAME = "pause"


@dataclass(frozen=True, kw_only=True)
class ResumeCommand(RunCommand):
    NAME = "resume"


@dataclass(frozen=True, kw_only=True)
class StopCommand(RunCommand):
    NAME = "stop"


@dataclass(frozen=True, kw_only=True)
class ProbeCommand(RunCommand):
    """Does this agent still hold the run's stage (dead, restarted or healthy)?"""

    NAME = "probe"


@dataclass(frozen=True, kw_only=True)
class HaltCommand(Command):
    """Stop the run's stage for a recovery, keeping its weights; the ack lists them."""

    NAME = "halt"
    run: int = _wire(integer())
    generation: int = _wire(integer())


@dataclass(frozen=True, kw_only=True)
class MeasureCommand(Command):
    """Measure the links to these peers over the data plane; the answer is ``links``."""

    NAME = "measure"
    peers: Mapping[str, str] = _wire(PEERS)


@dataclass(frozen=True, kw_only=True)
class EmulateCommand(Command):
    """Compute ``slowdown`` times slower from now on (a device heating up)."""

    NAME = "emulate"
    slowdown: float = _wire(number(minimum=1, maximum=1000))


@dataclass(frozen=True, kw_only=True)
class ExitCommand(Command):
    """Fault injection: exit at once, as a crash would."""

    NAME = "exit"


COMMANDS: Mapping[str, type[Command]] = {c.NAME: c for c in (
    ProfileCommand, DeployCommand, StartCommand, PauseCommand, ResumeCommand, StopCommand,
    MeasureCommand, HaltCommand, ProbeCommand, EmulateCommand, ExitCommand)}
"""Every command, by name: the server builds them, the agent dispatches on them."""


def command_name(raw: Any) -> str:
    """The name of the command ``raw`` is (ProtocolError naming ``command`` if none)."""
    name = raw.get("command") if isinstance(raw, dict) else None
    if name not in COMMANDS:
        raise _fail("command", f"unknown command {name!r}; known: {', '.join(COMMANDS)}")
    return cast(str, name)


def parse_command(raw: Any) -> Command:
    return COMMANDS[command_name(raw)].from_json(raw)


# ---- the agent's messages


@dataclass(frozen=True, kw_only=True)
class Hello(Message):
    """The first message of a connection: the agent's data plane, its hardware, its measured
    fixed costs and, when it emulates several, its compute resources."""

    TYPE = "hello"
    data_address: str = _wire(address)
    hardware: Mapping[str, Any] | None = _wire(json_object(), None)
    overhead_s: float | None = _wire(seconds(10), None)
    message_s: float | None = _wire(seconds(10), None)
    resources: tuple[DeviceResource, ...] | None = _wire(resources_reader, None)


@dataclass(frozen=True, kw_only=True)
class Ping(Message):
    """A clock-offset probe; answered by :class:`Pong` at once."""

    TYPE = "ping"
    id: int = _wire(integer())


@dataclass(frozen=True, kw_only=True)
class Heartbeat(Message):
    TYPE = "heartbeat"
    status: str = _wire(one_of("online", "busy"), "online")
    load: Mapping[str, float] | None = _wire(
        mapping(text(), number(minimum=-math.inf), maximum=16), None)


@dataclass(frozen=True, kw_only=True)
class Events(Message):
    """What a run's stages here produced since the last batch. Timeline and fault events are
    JSON objects the shared event schemas check (orchestrator.events), naming the field."""

    TYPE = "events"
    run: int = _wire(integer())
    timeline: tuple[Mapping[str, Any], ...] = _wire(
        items(json_object(maximum=16), maximum=MAX_EVENTS), ())
    faults: tuple[Mapping[str, Any], ...] = _wire(
        items(json_object(maximum=16), maximum=MAX_EVENTS), ())
    metrics: tuple[MetricSample, ...] = _wire(
        items(MetricSample.reader(), maximum=MAX_EVENTS), ())


@dataclass(frozen=True, kw_only=True)
class Ack(Message):
    """The answer to a command: ``ok``, or the ``error`` that refused it (and changed
    nothing); with what the command asked for (a halt's ``holdings``, a probe's ``holds``)."""

    TYPE = "ack"
    id: str | None = _wire(text(maximum=64), None)
    command: str = _wire(text(maximum=64))
    ok: bool = _wire(flag())
    error: str | None = _wire(text(maximum=MAX_TEXT, empty=True), None)
    run: int | None = _wire(integer(), None)
    model: str | None = _wire(text(), None)
    generation: int | None = _wire(integer(), None)
    holdings: tuple[HeldCopy, ...] | None = _wire(
        items(HeldCopy.reader(), maximum=MAX_EVENTS), None)
    applied: int | None = _wire(integer(), None)
    holds: bool | None = _wire(flag(), None)
    slowdown: float | None = _wire(number(minimum=1, maximum=1000), None)

    @classmethod
    def to(cls, command: Command, **fields: Any) -> Ack:
        """The ack of ``command`` (its id, name, and run or model when it has one)."""
        return cls(id=command.id, command=command.NAME, run=getattr(command, "run", None),
                   model=getattr(command, "model", None), **{"ok": True, **fields})


@dataclass(frozen=True, kw_only=True)
class StageDone(Message):
    """A stage finished its micro-batches: its counts and the fixed costs it measured."""

    TYPE = "stage_done"
    run: int = _wire(integer())
    generation: int | None = _wire(integer(), None)
    forwards: int | None = _wire(integer(), None)
    backwards: int | None = _wire(integer(), None)
    updates: int | None = _wire(integer(), None)
    applied_from: int | None = _wire(integer(), None)
    updated: tuple[int, ...] | None = _wire(items(integer(), maximum=10**7), None)
    overhead_s: float | None = _wire(seconds(10), None)
    message_s: float | None = _wire(seconds(10), None)
    pass_overhead_s: float | None = _wire(seconds(10), None)

    def check(self) -> None:
        if self.pass_overhead_s is not None and (
                self.overhead_s is None or self.pass_overhead_s > self.overhead_s):
            raise _fail("pass_overhead_s", "must come with overhead_s and be at most it",
                        self.pass_overhead_s)


@dataclass(frozen=True, kw_only=True)
class StageFailed(Message):
    TYPE = "stage_failed"
    run: int = _wire(integer())
    error: str = _wire(text(maximum=MAX_TEXT))
    generation: int | None = _wire(integer(), None)


@dataclass(frozen=True, kw_only=True)
class Suspect(Message):
    """Stage 0's backward timer fired: a gradient is late by ``waited_s``."""

    TYPE = "suspect"
    run: int = _wire(integer())
    generation: int = _wire(integer())
    microbatch: int | None = _wire(integer(), None)
    waited_s: float | None = _wire(number(), None)


@dataclass(frozen=True, kw_only=True)
class ProfileProgress(Message):
    TYPE = "profile_progress"
    model: str = _wire(text())
    done: int = _wire(integer())
    total: int = _wire(integer(minimum=1))

    def check(self) -> None:
        if self.done > self.total:
            raise _fail("done", f"is more than total ({self.total})", self.done)


@dataclass(frozen=True, kw_only=True)
class ProfileResult(Message):
    """A layer profile (the shared format, which the server checks) of ``model_spec``."""

    TYPE = "profile_result"
    model_spec: ModelSpecRef = _wire(ModelSpecRef.reader())  # noqa: RUF009 (a field)
    profile: Mapping[str, Any] = _wire(json_object())


@dataclass(frozen=True, kw_only=True)
class ProfileFailed(Message):
    TYPE = "profile_failed"
    model: str = _wire(text())
    error: str = _wire(text(maximum=MAX_TEXT))


@dataclass(frozen=True, kw_only=True)
class LinkReport(Message):
    """The agent's own link, measured or emulated."""

    TYPE = "link"
    latency_s: float = _wire(number(maximum=60))
    bandwidth_bps: float | None = _wire(number(above=True), None)


@dataclass(frozen=True, kw_only=True)
class LinksReport(Message):
    """The links to its peers the agent measured on ``measure``."""

    TYPE = "links"
    links: tuple[MeasuredLink, ...] = _wire(items(MeasuredLink.reader(), maximum=MAX_PEERS))


AGENT_MESSAGES: Mapping[str, type[Message]] = {m.TYPE: m for m in (
    Hello, Ping, Heartbeat, Events, Ack, StageDone, StageFailed, Suspect, ProfileProgress,
    ProfileResult, ProfileFailed, LinkReport, LinksReport)}
"""Every message an agent sends, by type."""


def _parse_typed(raw: Any, registry: Mapping[str, type[Message]]) -> Message:
    if not isinstance(raw, dict):
        raise ProtocolError("a message must be a JSON object", field="body",
                            reason="a message must be a JSON object")
    kind = raw.get("type")
    if not isinstance(kind, str) or kind not in registry:
        raise _fail("type", f"must be one of {', '.join(sorted(registry))}", kind)
    return registry[kind].from_json(raw)


def parse_agent_message(raw: Any) -> Message:
    """Read a message from an agent (ProtocolError naming the field)."""
    return _parse_typed(raw, AGENT_MESSAGES)


# ---- the server's replies


@dataclass(frozen=True, kw_only=True)
class Welcome(Message):
    TYPE = "welcome"
    device: str = _wire(text())
    name: str = _wire(text(maximum=MAX_NAME, empty=True))


@dataclass(frozen=True, kw_only=True)
class Pong(Message):
    TYPE = "pong"
    id: int = _wire(integer())
    server_time: float = _wire(number())


@dataclass(frozen=True, kw_only=True)
class ErrorReply(Message):
    """A message the server did not accept (it changed nothing); ``field`` names what was
    wrong, ``in_reply_to`` the type of the message. Both always present, null when unknown."""

    TYPE = "error"
    detail: str = _wire(text(maximum=MAX_TEXT))
    field: str | None = _wire(text(maximum=MAX_NAME), None)
    in_reply_to: str | None = _wire(text(maximum=MAX_NAME), None)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, "detail": self.detail, "field": self.field,
                "in_reply_to": self.in_reply_to}


@dataclass(frozen=True, kw_only=True)
class Stored(Message):
    """How many of an events batch's timeline events, faults and metric points were kept."""

    TYPE = "stored"
    run: int = _wire(integer())
    timeline: int = _wire(integer())
    faults: int = _wire(integer())
    metrics: int = _wire(integer())


@dataclass(frozen=True, kw_only=True)
class ProfileStored(Message):
    TYPE = "profile_stored"
    model_spec: int = _wire(integer())


@dataclass(frozen=True, kw_only=True)
class LinksStored(Message):
    TYPE = "links_stored"
    count: int = _wire(integer())


SERVER_MESSAGES: Mapping[str, type[Message]] = {m.TYPE: m for m in (
    Welcome, Pong, ErrorReply, Stored, ProfileStored, LinksStored)}
"""Every reply the server sends an agent, by type (commands aside: :data:`COMMANDS`)."""


def parse_server_message(raw: Any) -> Message:
    """Read a message from the server: a command or a reply."""
    if isinstance(raw, dict) and raw.get("type") == Command.TYPE:
        return parse_command(raw)
    return _parse_typed(raw, SERVER_MESSAGES)


# --------------------------------------------------------------------------- data-plane names
# Weights between agents travel as data-plane ``weights`` messages (agent.transport) whose
# ``name`` says what they are; ``microbatch`` is the weights' applied, ``version`` the
# generation. These are the names, typed.


def _layers_text(text_: str, name: str) -> tuple[int, int]:
    first, sep, last = text_.partition("-")
    if not (sep and first.isdigit() and last.isdigit()):
        raise _fail(name, "must be <first>-<last>", text_)
    return layer_range([int(first), int(last)], name)


@dataclass(frozen=True)
class ChainReplica:
    """``replica:<first>-<last>``: a stage's checkpoint, for the next stage's device to keep."""

    layers: tuple[int, int]

    def __post_init__(self) -> None:
        layer_range(list(self.layers), "layers")

    def to_name(self) -> str:
        return f"replica:{self.layers[0]}-{self.layers[1]}"


@dataclass(frozen=True)
class WeightFetch:
    """``fetch:<token>:<first>-<last>:<requester>=<its data address>``: a recovering stage
    asks for layers at the header's applied; the address, because the holder (a survivor the
    new plan leaves out) may not know the requester."""

    token: int
    layers: tuple[int, int]
    requester: str
    reply_to: str

    def __post_init__(self) -> None:
        _int(self.token, "token", minimum=1)
        layer_range(list(self.layers), "layers")
        slug(self.requester, "requester")
        address(self.reply_to, "reply_to")

    def to_name(self) -> str:
        first, last = self.layers
        return f"fetch:{self.token}:{first}-{last}:{self.requester}={self.reply_to}"

    def reply(self) -> FetchReply:
        return FetchReply(self.token)


@dataclass(frozen=True)
class FetchReply:
    """``fetched:<token>``: the answer to a fetch, the weights' safetensors bytes (empty when
    the holder has no such copy)."""

    token: int

    def __post_init__(self) -> None:
        _int(self.token, "token", minimum=1)

    def to_name(self) -> str:
        return f"fetched:{self.token}"


WeightName = ChainReplica | WeightFetch | FetchReply


def parse_weight_name(name: str | None) -> WeightName:
    """Read a weights message's name (ProtocolError naming the part that is wrong)."""
    kind, _, rest = (name or "").partition(":")
    if kind == "replica":
        return ChainReplica(_layers_text(rest, "layers"))
    if kind == "fetched":
        if not rest.isdigit():
            raise _fail("token", "must be a positive integer", rest)
        return FetchReply(int(rest))
    if kind == "fetch":
        token, _, rest = rest.partition(":")
        layers, _, reply = rest.partition(":")
        requester, _, reply_to = reply.partition("=")
        if not token.isdigit():
            raise _fail("token", "must be a positive integer", token)
        return WeightFetch(int(token), _layers_text(layers, "layers"), requester, reply_to)
    raise _fail("name", "must be replica:, fetch: or fetched:", name)
