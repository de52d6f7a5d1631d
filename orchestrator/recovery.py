"""Exactly-once recovery: where each device of a new plan gets its weights, and whether a dynamic
re-partition is worth its cost (docs/architecture.md, "Fault tolerance and dynamic
re-partition").

Versioned holdings. FTPipeHD's Algorithm 1 (:mod:`orchestrator.redistribution`) knows only
*where* copies live (live weights, chain replicas, the central store) and prefers live weights
because a replica may be stale. A replica that is stale by a few batches silently loses (or
repeats) those batches' updates, so the resumed run is no longer the run a single device would
have trained. Here every copy carries ``applied``: the number of micro-batches whose updates it
holds (weights at applied v hold the updates of micro-batches 0..v-1 and no others). Since every
stage applies updates in micro-batch order, copies of different layers at the *same* applied
belong together, and a model stitched from them is a consistent model at v. A halted
survivor reports its holdings (:class:`Holding`): its own checkpoints (replication points and
the rollback window) and the chain replicas it keeps; the server adds its global replicas
(kind ``central``).

Recovery then has two steps:

1. :func:`resume_point` picks V, the largest applied at which every layer has a copy somewhere;
   training resumes at micro-batch V on every stage, so each update ends up applied once.
2. :func:`restore_plan` is Algorithm 1 restricted to copies at exactly V. Because all of them
   hold the same weights, freshness no longer ranks them; cost does: the device's own memory
   first (its checkpoint, then a replica it holds: nothing moves), then a survivor's checkpoint,
   then a survivor's replica, then the server. With every holding at one applied and a complete
   central copy, this is :func:`~orchestrator.redistribution.redistribute_weights` except that a
   device's own replica beats a peer's live weights (equal at V, and it costs no transfer).

:func:`repartition_decision` is the break-even test of a dynamic re-partition: move only when
the time saved over the remaining micro-batches exceeds the time the move costs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.cost import CostModel
from orchestrator.errors import FormatError, PlanningError
from orchestrator.formats import ModelProfile
from orchestrator.partition.common import finish_plan
from orchestrator.planformat import Plan, Stage, check_stages
from orchestrator.redistribution import CENTRAL, state_bytes
from orchestrator.validation import At, expect_integer, expect_list, expect_object

__all__ = [
    "CENTRAL",
    "KINDS",
    "SELF",
    "Decision",
    "Holding",
    "Part",
    "RecoveryError",
    "RestorePlan",
    "group_shrinks",
    "repartition_decision",
    "restore_plan",
    "resume_point",
    "successor_takes_over",
]

SELF = "self"
"""The source of a part the device loads from its own memory."""

KINDS = ("own", "replica", "central")
"""Kinds of copy: a device's own checkpoint, a chain replica of another stage, the server's."""


class RecoveryError(PlanningError):
    """Holdings from which no consistent model can be restored (a layer without any copy at a
    common applied), a malformed holding, or a new plan that does not fit the model. A
    :class:`PlanningError` because, like one, it means the run cannot go on as asked."""


# --------------------------------------------------------------------------- holdings


def _check_holding(device: str, layers: tuple[int, int], applied: int, kind: str) -> None:
    """Raise :class:`RecoveryError` naming the bad field; shared by the constructor and
    :meth:`Holding.from_json` so a holding built either way obeys the same rules."""
    where = f"holding of {device!r}"
    if not isinstance(device, str) or not device.strip():
        raise RecoveryError(f"holding: device: must be a non-empty string (got {device!r})")
    if kind not in KINDS:
        raise RecoveryError(f"{where}: kind: must be one of {', '.join(KINDS)} (got {kind!r})")
    if kind == "central" and device != CENTRAL:
        raise RecoveryError(f"{where}: kind: 'central' is the kind of the server's store "
                            f"({CENTRAL!r}) only")
    if kind != "central" and device == CENTRAL:
        raise RecoveryError(f"{where}: kind: the server's store holds kind 'central' only "
                            f"(got {kind!r})")
    if (len(layers) != 2
            or any(isinstance(x, bool) or not isinstance(x, int) for x in layers)
            or not 0 <= layers[0] <= layers[1]):
        raise RecoveryError(f"{where}: layers: must be [first, last] with "
                            f"0 <= first <= last (got {list(layers)!r})")
    if isinstance(applied, bool) or not isinstance(applied, int) or applied < 0:
        raise RecoveryError(f"{where}: applied: must be an integer >= 0 (got {applied!r})")


@dataclass(frozen=True)
class Holding:
    """A copy of layers first..last at ``applied`` (weights holding the updates of micro-batches
    0..applied-1) held by ``device`` (a device uid, or CENTRAL for the server's store); kind is
    "own" (the device's own checkpoint/live weights), "replica" (a chain replica of another
    stage) or "central"."""

    device: str
    layers: tuple[int, int]
    applied: int
    kind: str

    def __post_init__(self) -> None:
        _check_holding(self.device, self.layers, self.applied, self.kind)

    @property
    def first(self) -> int:
        return self.layers[0]

    @property
    def last(self) -> int:
        return self.layers[1]

    def has(self, layer: int, applied: int) -> bool:
        """Whether this copy can serve ``layer`` at ``applied``; only an exact match can, since
        weights at another applied would lose or repeat updates."""
        return self.applied == applied and self.first <= layer <= self.last

    @classmethod
    def from_json(cls, raw: Any, *, device: str) -> Holding:
        """One entry of a ``halt`` ack's ``holdings`` ({"layers": [a, e], "applied": v, "kind":
        "own"|"replica"}), held by ``device``. Strict, like the shared formats: a missing or
        unknown field, a bad layer range or a negative applied raise :class:`RecoveryError`
        naming the field."""
        at = At(f"holding of {device!r}")
        try:
            obj = expect_object(raw, at, ("layers", "applied", "kind"))
            bounds = expect_list(obj["layers"], at.key("layers"))
            if len(bounds) != 2:
                raise at.key("layers").fail("must be [first, last]", bounds)
            first = expect_integer(bounds[0], at.key("layers").index(0))
            last = expect_integer(bounds[1], at.key("layers").index(1))
            if last < first:
                raise at.key("layers").fail("ends before it starts", bounds)
            applied = expect_integer(obj["applied"], at.key("applied"))
            kind = obj["kind"]
            if not isinstance(kind, str) or kind not in KINDS:
                raise at.key("kind").fail(f"must be one of {', '.join(KINDS)}", kind)
        except FormatError as exc:
            raise RecoveryError(str(exc)) from None
        return cls(device=device, layers=(first, last), applied=applied, kind=kind)

    def to_json(self) -> dict[str, Any]:
        """The wire form :meth:`from_json` reads; the device is implied by who sends it."""
        return {"layers": list(self.layers), "applied": self.applied, "kind": self.kind}


# --------------------------------------------------------------------------- resume point


def _versions(holdings: Iterable[Holding], num_layers: int,
              at_most: int | None) -> dict[int, list[Holding]]:
    """Holdings grouped by applied (only those <= at_most); raise on a holding past the
    model's last layer, which can only come from another model or a corrupted report."""
    by_applied: dict[int, list[Holding]] = {}
    for h in holdings:
        if h.last >= num_layers:
            raise RecoveryError(f"holding of {h.device!r}: layers: {list(h.layers)} go past the "
                                f"last layer of the model ({num_layers - 1})")
        if at_most is None or h.applied <= at_most:
            by_applied.setdefault(h.applied, []).append(h)
    return by_applied


def _first_uncovered(holdings: Iterable[Holding], num_layers: int) -> int | None:
    """The first layer of 0..num_layers-1 that no holding covers, None if all are covered."""
    covered = 0  # layers 0..covered-1 are covered
    for h in sorted(holdings, key=lambda h: h.first):
        if h.first > covered:
            break
        covered = max(covered, h.last + 1)
    return covered if covered < num_layers else None


def resume_point(holdings: Iterable[Holding], *, num_layers: int,
                 at_most: int | None = None) -> int | None:
    """The largest applied v (<= at_most when given) such that every layer 0..num_layers-1 has
    a copy at exactly v in some holding; None if there is none.

    The largest, because every micro-batch before it need not be redone; exactly v, because
    mixing layers at different applied would give a model no single run ever had."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be at least 1, got {num_layers}")
    by_applied = _versions(holdings, num_layers, at_most)
    for v in sorted(by_applied, reverse=True):
        if _first_uncovered(by_applied[v], num_layers) is None:
            return v
    return None


def _no_resume_point(holdings: Sequence[Holding], num_layers: int, at_most: int | None) -> str:
    """Why there is no resume point, naming a layer: the first layer without any copy at all,
    else the first layer the newest applied lacks."""
    bound = "" if at_most is None else f" at applied <= {at_most}"
    usable = [h for h in holdings if at_most is None or h.applied <= at_most]
    missing = _first_uncovered(usable, num_layers)
    if missing is not None:
        return f"layer {missing} has no copy anywhere{bound}"
    newest = max(h.applied for h in usable)
    missing = _first_uncovered([h for h in usable if h.applied == newest], num_layers)
    return (f"no applied{bound} at which every layer has a copy (at the newest, {newest}, "
            f"layer {missing} has none)")


# --------------------------------------------------------------------------- restore plan


@dataclass(frozen=True)
class Part:
    """Layers ``layers`` at ``applied`` that ``device`` loads from ``source``: "self" (its own
    memory: own checkpoint or a replica it holds), another device's uid, or CENTRAL."""

    device: str
    layers: tuple[int, int]
    applied: int
    source: str
    kind: str
    bytes: int

    @property
    def moves(self) -> bool:
        """Whether loading this part crosses the network (the cost recovery pays)."""
        return self.source != SELF

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "layers": list(self.layers), "applied": self.applied,
                "source": self.source, "kind": self.kind, "bytes": self.bytes}


@dataclass(frozen=True)
class RestorePlan:
    """What every device of the new plan loads to resume at micro-batch ``resume``."""

    resume: int
    parts: tuple[Part, ...]
    # why training starts again from the run's seed (no applied at which every layer has a
    # copy); "" when it resumes from copies
    from_seed: str = ""

    @property
    def bytes_moved(self) -> int:
        return sum(p.bytes for p in self.parts if p.moves)

    @property
    def transfers(self) -> int:
        return sum(1 for p in self.parts if p.moves)

    def parts_of(self, device: str) -> tuple[Part, ...]:
        return tuple(p for p in self.parts if p.device == device)

    def to_json(self) -> dict[str, Any]:
        out = {"resume": self.resume, "parts": [p.to_json() for p in self.parts],
               "bytes_moved": self.bytes_moved, "transfers": self.transfers}
        if self.from_seed:
            out["from_seed"] = self.from_seed
        return out


def _source(device: str, layer: int, at_v: Sequence[Holding]) -> tuple[str, str]:
    """(source, kind) of ``layer`` for ``device`` among the copies at V, cheapest first: its
    own memory moves nothing; a peer's checkpoint before a peer's replica (as Algorithm 1, and
    a checkpoint is what its holder keeps longest); the server last (REST, shared by all)."""
    holders = [h for h in at_v if h.first <= layer <= h.last]
    for kind in ("own", "replica"):
        if any(h.device == device and h.kind == kind for h in holders):
            return SELF, kind
    for kind in ("own", "replica"):
        peers = sorted({h.device for h in holders if h.kind == kind})
        if peers:
            return peers[0], kind
    if any(h.kind == "central" for h in holders):
        return CENTRAL, "central"
    raise AssertionError(f"layer {layer} has no copy at the resume point")  # resume_point's job


def restore_plan(new: Plan, holdings: Sequence[Holding], profile: ModelProfile, *,
                 at_most: int | None = None, momentum: bool = False,
                 seed: bool = False) -> RestorePlan:
    """At V = resume_point(...): for each device of each stage of ``new`` and each layer of its
    stage, the source, by preference:

    1. the device's own holding of kind own at V -> source "self";
    2. the device's own replica at V -> "self";
    3. another device's own holding at V -> that device (ties: the first of the sorted device
       ids, as redistribution.py does);
    4. another device's replica at V -> that device (same tie rule);
    5. CENTRAL at V.

    Consecutive layers with the same (source, kind) become one Part; bytes = sum of the layers'
    ``param_bytes``, twice that with ``momentum`` (the optimizer's buffers move with the
    weights, :func:`~orchestrator.redistribution.state_bytes`). Raises :class:`RecoveryError`
    naming the first layer without any copy (when there is no resume point), and if ``new`` does
    not cover the profile's layers once each.

    ``seed``: the run's seed is a copy of every layer at applied 0 (every stage builds its
    layers from it): with no resume point, training starts again from micro-batch 0, every
    device building its layers from the seed (no parts), and ``from_seed`` says why. A device
    lost before its layers' first replica (or soon after a re-partition moved them) left a
    layer with no copy, and the run failed."""
    num_layers = profile.num_layers
    try:
        check_stages(new.stages, num_layers=num_layers, device_ids=new.device_ids,
                     at=At("<new plan>", "stages"))
    except FormatError as exc:
        raise RecoveryError(str(exc)) from None
    if CENTRAL in new.device_ids:
        raise RecoveryError(f"the new plan names device {CENTRAL!r}, the name of the "
                            "server's store")
    resume = resume_point(holdings, num_layers=num_layers, at_most=at_most)
    if resume is None:
        if seed:
            return RestorePlan(resume=0, parts=(),
                               from_seed=_no_resume_point(holdings, num_layers, at_most))
        raise RecoveryError(_no_resume_point(holdings, num_layers, at_most))
    at_v = [h for h in holdings if h.applied == resume]
    parts: list[Part] = []
    for stage in new.stages:
        for device in stage.devices:
            start = stage.first
            src = _source(device, start, at_v)
            for layer in range(stage.first + 1, stage.last + 2):
                nxt = _source(device, layer, at_v) if layer <= stage.last else None
                if nxt != src:
                    size = state_bytes(profile, start, layer - 1, momentum=momentum)
                    parts.append(Part(device=device, layers=(start, layer - 1), applied=resume,
                                      source=src[0], kind=src[1], bytes=size))
                    if nxt is not None:
                        start, src = layer, nxt
    return RestorePlan(resume=resume, parts=tuple(parts))


# --------------------------------------------------------------------------- re-partition


@dataclass(frozen=True)
class Decision:
    """A dynamic re-partition's verdict, kept with its two sides so the run page can show why."""

    saved_s: float
    cost_s: float

    @property
    def move(self) -> bool:
        return self.saved_s > self.cost_s

    def to_json(self) -> dict[str, Any]:
        return {"saved_s": self.saved_s, "cost_s": self.cost_s, "move": self.move}


def _seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and not negative, got {value!r}")
    return float(value)


def _count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def repartition_decision(*, measured_period_s: float, new_period_s: float,
                         remaining_microbatches: int, bytes_to_move: int, bandwidth_bps: float,
                         restart_s: float, redo_microbatches: int) -> Decision:
    """Dynamic re-partition's break-even: saved = (measured_period_s - new_period_s) x
    remaining_microbatches (negative when the new plan is slower); cost = bytes_to_move /
    bandwidth_bps + restart_s + redo_microbatches x new_period_s (the weights over the slowest
    link, the restart, and the micro-batches redone on the new plan). Raises ValueError naming
    a non-finite, negative or (for the bandwidth) zero argument."""
    measured = _seconds("measured_period_s", measured_period_s)
    period = _seconds("new_period_s", new_period_s)
    remaining = _count("remaining_microbatches", remaining_microbatches)
    moving = _count("bytes_to_move", bytes_to_move)
    bandwidth = _seconds("bandwidth_bps", bandwidth_bps)
    if bandwidth == 0:
        raise ValueError(f"bandwidth_bps must be greater than zero, got {bandwidth_bps!r}")
    restart = _seconds("restart_s", restart_s)
    redo = _count("redo_microbatches", redo_microbatches)
    return Decision(saved_s=(measured - period) * remaining,
                    cost_s=moving / bandwidth + restart + redo * period)


def group_shrinks(old: Plan, failed: Collection[str]) -> bool:
    """Did the failure take replicas only: every stage keeps a device, and some stage lost
    one? Then the plan goes on with its groups shrunk (:func:`successor_takes_over` moves
    no layer)."""
    gone = set(failed)
    return (all(set(s.devices) - gone for s in old.stages)
            and any(gone & set(s.devices) for s in old.stages))


def successor_takes_over(cm: CostModel, old: Plan, failed: Collection[str], *,
                         schedule: str | None = None, microbatches: int | None = None) -> Plan:
    """ResPipe-style recovery, the baseline FTPipeHD improves on: no re-plan; each stage whose
    devices all failed hands its layers to the next surviving stage (the last surviving stage's
    predecessor when no stage after it survives). Failed devices leave replicated stages.
    ``cm`` covers the survivors."""
    started = time.perf_counter()
    gone = set(failed)
    kept = [(stage.first, stage.last, tuple(d for d in stage.devices if d not in gone))
            for stage in old.stages]
    if not any(devices for _, _, devices in kept):
        raise RecoveryError("every device of the plan failed")
    merged: list[list[Any]] = []
    orphan: int | None = None  # first layer of a run of failed stages waiting for a successor
    for first, last, devices in kept:
        if not devices:
            orphan = first if orphan is None else orphan
            continue
        merged.append([first if orphan is None else orphan, last, devices])
        orphan = None
    if orphan is not None:  # the tail failed: the last survivor takes it
        merged[-1][1] = old.stages[-1].last
    index = {d: i for i, d in enumerate(cm.devices.ids)}
    raw = [(a, e, tuple(index[d] for d in devices)) for a, e, devices in merged]
    return finish_plan(cm, raw, algorithm="respipe", schedule=schedule or old.schedule,
                       microbatches=microbatches or old.microbatches, started=started)


def unprotected_stages(stages: Sequence[Stage], *, chain_every: int,
                       global_every: int) -> list[dict[str, Any]]:
    """The stages whose layers would have no copy anywhere if their device were lost, as a
    run replicates (docs/architecture.md, "Fault tolerance"): a stage is covered by the
    server's global replicas (``global_every``), by the other devices of its group (they hold
    the same layers), or by the chain replica its device sends to another device of the
    pipeline (``chain_every``). The others restart from the run's seed when their device is
    lost; the run says so when it starts and at each re-partition, before it is needed.
    Returns ``[{"layers": [first, last], "only_on": [uids]}]`` in pipeline order."""
    if global_every > 0:
        return []
    out = []
    for k, stage in enumerate(stages):
        if len(set(stage.devices)) > 1:
            continue  # the group's devices hold the same layers
        # a stage's chain replica goes to the first device of the next stage (the last
        # stage's to stage 0's): a copy only if that is another device
        successor = stages[(k + 1) % len(stages)].devices[0]
        if chain_every > 0 and successor not in stage.devices:
            continue
        out.append({"layers": [stage.first, stage.last], "only_on": list(stage.devices)})
    return out
