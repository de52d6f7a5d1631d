"""The stage spec a ``deploy`` carries: everything a device needs to run its stage."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import Any

from orchestrator.formats import SCHEDULES, synchronous
from orchestrator.planformat import u_shaped
from orchestrator.protocol.fields import (
    MAX_PIPELINES,
    MAX_REPLICAS,
    MAX_STAGES,
    fail,
    read_bool,
    read_int,
    read_list,
    read_number,
    read_object,
    read_optional,
    read_text,
)
from orchestrator.schedule import MAX_MICROBATCHES, Schedule, build_schedule

MAX_TURNS = 16 * MAX_PIPELINES  # a device's turns of one micro-batch, preempted parts too
TURN_KINDS = ("forward", "backward")  # the passes a device's turns order
SHARD_SPLITS = ("iid", "label-skew")  # how a run's training set is cut among pipelines


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
    ``group_weight``. Data: ``shard`` (index, count), the part of the training set this
    pipeline trains on (a split-learning client's own), cut ``shard_split`` ("iid", or
    "label-skew": each shard holds few classes); None: all of it. Order: ``turns``, the
    order in which this device runs its stages' passes of one micro-batch, each (pipeline,
    "forward" or "backward", that pipeline's micro-batches, first layer, last layer): a pass
    the schedule preempts is several turns, each over some of its layers (agent.turns: a
    split-learning helper follows its schedule, under a synchronous schedule of one
    micro-batch a batch); empty: as their inputs come. ``batch_sync`` (a first stage in an
    aggregation group): micro-batch m starts once every member finished m - 1, the
    split-learning paper's batch, released to every client at once.
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
    shard: tuple[int, int] | None = None
    shard_split: str = "iid"
    turns: tuple[tuple[int, str, int, int, int], ...] = ()
    batch_sync: bool = False

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
    def u_shaped(self) -> bool:
        """Do the pipeline's first and last stages share one device (split learning's
        client)? Then the labels never leave it: stage 0 sends none, and the last stage reads
        them from its own copy of the data set."""
        return u_shaped(self.stage_devices)

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

    @functools.cached_property
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
            raise fail("schedule", f"must be one of {', '.join(SCHEDULES)}", self.schedule)
        if not self.stage_devices or len(self.stage_devices) > MAX_STAGES:
            raise fail("stage_devices", f"must list 1 to {MAX_STAGES} stages")
        if len(self.stage_times_s) != self.num_stages or any(
                len(t) != len(d) for t, d in zip(self.stage_times_s, self.stage_devices,
                                                 strict=True)):
            raise fail("stage_times_s", "needs one time per replica of each stage")
        every = [d for group in self.stage_devices for d in group]
        if len(set(every)) != len(every) and not self.u_shaped:
            raise fail("stage_devices", "names a device twice (only a U-shaped pipeline's "
                       "first and last stages share theirs)")
        if not 0 <= self.stage < self.num_stages:
            raise fail("stage", f"is not in 0..{self.num_stages - 1}", self.stage)
        if self.device not in self.stage_devices[self.stage]:
            raise fail("device", f"does not serve stage {self.stage}", self.device)
        a, e = self.layers
        if not 0 <= a <= e:
            raise fail("layers", "must be [first, last] with first <= last", list(self.layers))
        if self.batch_size < 1 or self.microbatches < 1:
            raise fail("microbatches", "batch_size and microbatches must be positive")
        if self.microbatches > MAX_MICROBATCHES:
            raise fail("microbatches", f"is over the {MAX_MICROBATCHES:,} micro-batches a run "
                       "may train", self.microbatches)
        if not self.lr > 0:
            raise fail("lr", "must be above 0", self.lr)
        for name, depths in (("inflight", self.inflight), ("lag", self.lag)):
            if depths is not None and (len(depths) != self.num_stages or min(depths) < 1):
                raise fail(name, f"needs one positive depth per stage ({self.num_stages})")
        unknown = sorted({d for d, _ in self.replica_inflight} - set(every))
        if unknown:
            raise fail("replica_inflight", "names a device that serves no stage", unknown[0])
        unknown = sorted(set(self.two_lanes) - set(every))
        if unknown:
            raise fail("two_lanes", "names a device that serves no stage", unknown[0])
        if self.two_lane != (self.lane_shares is not None):
            raise fail("lane_shares", "goes with a device on two lanes, and only with one")
        if self.lane_shares is not None and not all(0 < s <= 1 for s in self.lane_shares):
            raise fail("lane_shares", "must be two fractions in (0, 1]", list(self.lane_shares))
        if not 0 <= self.first_microbatch < self.microbatches:
            raise fail("first_microbatch", f"is not in 0..{self.microbatches - 1}",
                       self.first_microbatch)
        if synchronous(self.schedule) and self.first_microbatch % (self.flush_every or 1):
            raise fail("first_microbatch", f"under {self.schedule} a generation resumes at "
                       f"a batch boundary (a multiple of {self.flush_every})",
                       self.first_microbatch)
        if self.aggregate_every and synchronous(self.schedule):
            raise fail("aggregate_every", "weight aggregation is for the asynchronous 1f1b")
        if min(self.generation, self.chain_every, self.global_every, self.aggregate_every) < 0:
            raise fail("generation", "generation, chain_every, global_every and "
                       "aggregate_every must not be negative")
        if bool(self.round_every) != bool(self.group) or (
                self.group and (self.member not in self.group
                                or len(set(self.group)) != len(self.group)
                                or len(self.group) < 2)):
            raise fail("group", "an aggregation group lists this stage and another, each "
                       "once, and goes with round_every")
        if not (self.group_weight > 0 and math.isfinite(self.group_weight)):
            raise fail("group_weight", "must be a positive number", self.group_weight)
        if self.shard is not None and not 0 <= self.shard[0] < self.shard[1]:
            raise fail("shard", "must be [index, count] with 0 <= index < count",
                       list(self.shard))
        if self.batch_sync and not (self.first and self.group):
            raise fail("batch_sync", "a batch barrier is among the first stages of an "
                       "aggregation group")
        if self.shard_split not in SHARD_SPLITS:
            raise fail("shard_split", f"must be one of {', '.join(SHARD_SPLITS)}",
                       self.shard_split)
        if self.turns:
            check_turns(self)
        if not (self.suspect_factor > 0 and self.suspect_min_s > 0
                and self.receive_timeout_s > 0):
            raise fail("suspect_factor", "suspect_factor, suspect_min_s and "
                       "receive_timeout_s must be positive")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("layers", "inflight", "lag", "two_lanes", "lane_shares", "shard"):
                value = None if value is None else list(value)
            elif f.name in ("group", "turns"):
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
        obj = read_object(raw, "the stage spec", required, names[len(required):])
        groups = read_list(obj["stage_devices"], "stage_devices", minimum=1, maximum=MAX_STAGES)
        stage_devices = tuple(
            tuple(read_text(d, f"stage_devices[{k}][{r}]") for r, d in enumerate(
                read_list(g, f"stage_devices[{k}]", minimum=1, maximum=MAX_REPLICAS)))
            for k, g in enumerate(groups))
        times = read_list(obj["stage_times_s"], "stage_times_s", maximum=MAX_STAGES)
        stage_times_s = tuple(
            tuple(read_number(t, f"stage_times_s[{k}][{r}]") for r, t in enumerate(
                read_list(g, f"stage_times_s[{k}]", maximum=MAX_REPLICAS)))
            for k, g in enumerate(times))
        layers = read_list(obj["layers"], "layers", minimum=2, maximum=2)

        def depths(key: str) -> tuple[int, ...] | None:
            return read_optional(obj.get(key), lambda r: tuple(
                read_int(x, f"{key}[{k}]", minimum=1) for k, x in enumerate(
                    read_list(r, key, maximum=MAX_STAGES))))

        windows = obj.get("replica_inflight") or {}
        if not isinstance(windows, dict):
            raise fail("replica_inflight", "must map devices to depths")
        shares = obj.get("lane_shares")
        lane_shares = None if shares is None else tuple(
            read_number(s, f"lane_shares[{i}]") for i, s in enumerate(
                read_list(shares, "lane_shares", minimum=2, maximum=2)))
        return cls(
            run=read_int(obj["run"], "run"), device=read_text(obj["device"], "device"),
            stage=read_int(obj["stage"], "stage", maximum=MAX_STAGES),
            layers=(read_int(layers[0], "layers[0]"), read_int(layers[1], "layers[1]")),
            model=read_text(obj["model"], "model"),
            dataset=read_text(obj["dataset"], "dataset", maximum=4096),
            batch_size=read_int(obj["batch_size"], "batch_size", minimum=1, maximum=2**20),
            schedule=read_text(obj["schedule"], "schedule"), stage_devices=stage_devices,
            stage_times_s=stage_times_s,
            microbatches=read_int(obj["microbatches"], "microbatches", minimum=1),
            flush_every=read_optional(obj.get("flush_every"),
                                      lambda r: read_int(r, "flush_every", minimum=1)),
            inflight=depths("inflight"), lag=depths("lag"),
            replica_inflight=tuple(sorted(
                (read_text(d, "replica_inflight"), read_int(x, f"replica_inflight.{d}", minimum=1))
                for d, x in windows.items())),
            two_lanes=tuple(read_text(d, f"two_lanes[{i}]") for i, d in enumerate(
                read_list(obj.get("two_lanes") or [], "two_lanes", maximum=MAX_REPLICAS))),
            lane_shares=None if lane_shares is None else (lane_shares[0], lane_shares[1]),
            lr=read_number(obj.get("lr", 0.1), "lr", above=True),
            momentum=read_number(obj.get("momentum", 0.0), "momentum", maximum=0.999999),
            seed=read_int(obj.get("seed", 0), "seed"),
            vertical_sync=read_bool(obj.get("vertical_sync", False), "vertical_sync"),
            aggregate_every=read_int(obj.get("aggregate_every", 0), "aggregate_every",
                                     maximum=10**6),
            receive_timeout_s=read_number(obj.get("receive_timeout_s", 60.0), "receive_timeout_s",
                                          above=True),
            generation=read_int(obj.get("generation", 0), "generation"),
            first_microbatch=read_int(obj.get("first_microbatch", 0), "first_microbatch"),
            chain_every=read_int(obj.get("chain_every", 0), "chain_every"),
            global_every=read_int(obj.get("global_every", 0), "global_every"),
            suspect_factor=read_number(obj.get("suspect_factor", 4.0), "suspect_factor",
                                       above=True),
            suspect_min_s=read_number(obj.get("suspect_min_s", 0.5), "suspect_min_s", above=True),
            pipeline=read_int(obj.get("pipeline", 0), "pipeline", maximum=MAX_PIPELINES),
            round_every=read_int(obj.get("round_every", 0), "round_every"),
            group=tuple(_member(m, f"group[{i}]") for i, m in enumerate(
                read_list(obj.get("group") or [], "group", maximum=MAX_PIPELINES))),
            group_weight=read_number(obj.get("group_weight", 1.0), "group_weight", above=True),
            shard=read_optional(obj.get("shard"), _shard),
            shard_split=read_text(obj.get("shard_split", "iid"), "shard_split"),
            turns=tuple(_turn(t, f"turns[{i}]") for i, t in enumerate(
                read_list(obj.get("turns") or [], "turns", maximum=MAX_TURNS))),
            batch_sync=read_bool(obj.get("batch_sync", False), "batch_sync"))


def _turn(raw: Any, name: str) -> tuple[int, str, int, int, int]:
    pipeline, kind, microbatches, first, last = read_list(raw, name, minimum=5, maximum=5)
    return (read_int(pipeline, f"{name}[0]", maximum=MAX_PIPELINES),
            read_text(kind, f"{name}[1]"),
            read_int(microbatches, f"{name}[2]", minimum=1, maximum=MAX_MICROBATCHES),
            read_int(first, f"{name}[3]"), read_int(last, f"{name}[4]"))


def check_turns(spec: StageSpec) -> None:
    """Raise ProtocolError unless ``spec.turns`` is an order the device can follow: forward
    and backward passes of pipelines, one micro-batch count each; this stage's own forward
    over its layers from the first up and its backward from the last down, each in one turn
    or, on a stage between two others, in several; under a synchronous schedule of one
    micro-batch a batch."""
    counts: dict[tuple[int, str], set[int]] = {}
    for p, kind, n, first, last in spec.turns:
        if kind not in TURN_KINDS or n < 1 or not 0 <= first <= last:
            raise fail("turns", "each is (pipeline, forward or backward, micro-batches, first "
                       "layer, last layer)", [p, kind, n, first, last])
        counts.setdefault((p, kind), set()).add(n)
    if any(len(n) > 1 for n in counts.values()):
        raise fail("turns", "name one micro-batch count for each pipeline's pass")
    for kind in TURN_KINDS:
        parts = [(first, last) for p, k, _, first, last in spec.turns
                 if (p, k) == (spec.pipeline, kind)]
        if kind == "backward":
            parts.reverse()
        if len(parts) > 1 and (spec.first or spec.last):
            raise fail("turns", "only a stage between two others takes its passes in parts")
        covered = [layer for first, last in parts for layer in range(first, last + 1)]
        if covered != list(range(spec.layers[0], spec.layers[1] + 1)):
            raise fail("turns", f"this stage's {kind} must cover its layers "
                       f"{spec.layers[0]}..{spec.layers[1]} once, in the pass's order")
    if counts[(spec.pipeline, "forward")] != {spec.microbatches}:
        raise fail("turns", f"this stage's pipeline trains {spec.microbatches} micro-batches")
    if not synchronous(spec.schedule) or spec.flush_every != 1:
        raise fail("turns", "go with a synchronous schedule of one micro-batch a batch "
                   "(flush_every 1): a device takes each pipeline's micro-batches one at a "
                   "time, forward then backward")


def _shard(raw: Any) -> tuple[int, int]:
    index, count = read_list(raw, "shard", minimum=2, maximum=2)
    return (read_int(index, "shard[0]"), read_int(count, "shard[1]", minimum=1, maximum=2**20))


def _member(raw: Any, name: str) -> tuple[str, int, int]:
    device, pipeline, stage = read_list(raw, name, minimum=3, maximum=3)
    return (read_text(device, f"{name}[0]"),
            read_int(pipeline, f"{name}[1]", maximum=MAX_PIPELINES),
            read_int(stage, f"{name}[2]", maximum=MAX_STAGES))
