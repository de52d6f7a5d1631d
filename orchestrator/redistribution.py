"""FTPipeHD's weight redistribution (Algorithm 1): after a re-partition or a failure, which
layers each device keeps, which it fetches, and from where.

Where weights live (FTPipeHD's replication): every device holds the live weights of its own
stage; chain replication copies each stage's weights to the devices of the next stage, and the
last stage's to the first, every N batches; global replication copies every stage to the central
store (the server) every M batches. For each layer a device needs under the new plan the
freshest surviving copy wins:

1. the device's own live weights (kept, nothing moves);
2. live weights on a surviving device of the old plan (fetched from it);
3. a chain replica on the device itself (kept) or on a surviving device (fetched);
4. the central store.

A device may drop what it no longer needs only after every device has committed, since a
neighbour may still be fetching from it (the commit barrier).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from itertools import groupby
from types import MappingProxyType

from orchestrator.formats import ModelProfile
from orchestrator.planformat import Plan

CENTRAL = "central"
MOMENTUM_SUFFIX = ":momentum"  # a parameter's SGD momentum buffer travels as "<name>:momentum"

Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Transfer:
    """Layers ``layers`` (inclusive) that ``device`` fetches from ``source``; ``replica`` when the
    copy is a replica (chain or central) rather than live weights."""

    device: str
    layers: tuple[int, int]
    source: str
    replica: bool
    bytes: int

    def to_json(self) -> dict[str, object]:
        return {"device": self.device, "layers": list(self.layers), "source": self.source,
                "replica": self.replica, "bytes": self.bytes}


@dataclass(frozen=True)
class Redistribution:
    keep: Mapping[str, Ranges]
    fetch: tuple[Transfer, ...]
    drop: Mapping[str, Ranges]

    @property
    def bytes_moved(self) -> int:
        return sum(t.bytes for t in self.fetch)

    def to_json(self) -> dict[str, object]:
        return {"keep": {d: [list(r) for r in rs] for d, rs in self.keep.items()},
                "fetch": [t.to_json() for t in self.fetch],
                "drop": {d: [list(r) for r in rs] for d, rs in self.drop.items()},
                "bytes_moved": self.bytes_moved}


def _ranges(layers: list[int]) -> Ranges:
    out = []
    for _, run in groupby(enumerate(sorted(layers)), key=lambda x: x[1] - x[0]):
        values = [v for _, v in run]
        out.append((values[0], values[-1]))
    return tuple(out)


def holdings(plan: Plan) -> tuple[dict[str, set[int]], dict[str, set[int]]]:
    """(live, chain replica) layers each device of ``plan`` holds."""
    live: dict[str, set[int]] = {}
    replica: dict[str, set[int]] = {}
    num_stages = len(plan.stages)
    for k, stage in enumerate(plan.stages):
        layers = set(range(stage.first, stage.last + 1))
        for d in stage.devices:
            live.setdefault(d, set()).update(layers)
        if num_stages > 1:
            for d in plan.stages[(k + 1) % num_stages].devices:
                replica.setdefault(d, set()).update(layers)
    return live, replica


def state_bytes(profile: ModelProfile, first: int, last: int, *, momentum: bool) -> int:
    """Bytes of layers first..last's training state: their parameters, and as much again for
    the optimizer's momentum buffers when the run uses momentum (they move with the weights)."""
    size = sum(profile.layers[i].param_bytes for i in range(first, last + 1))
    return 2 * size if momentum else size


def redistribute_weights(*, old: Plan, new: Plan, failed: Collection[str],
                         profile: ModelProfile, momentum: bool = False) -> Redistribution:
    """Algorithm 1: the keep / fetch / drop lists that take the devices from ``old`` to ``new``
    when the devices in ``failed`` are gone; ``momentum``: the run's optimizer keeps momentum
    buffers, which move with the weights (twice the bytes)."""
    num_layers = profile.num_layers
    for name, plan in (("old", old), ("new", new)):
        if plan.stages[-1].last != num_layers - 1:
            raise ValueError(f"the {name} plan covers {plan.stages[-1].last + 1} layers, the "
                             f"profile has {num_layers}")
    gone = set(failed)
    back = gone & set(new.device_ids)
    if back:
        raise ValueError(f"the new plan uses failed device {sorted(back)[0]!r}")
    live, replica = holdings(old)
    live = {d: s for d, s in live.items() if d not in gone}
    replica = {d: s for d, s in replica.items() if d not in gone}

    def source(device: str, layer: int) -> tuple[str, bool] | None:
        """(where from, is it a replica); None when the device already has it live."""
        if layer in live.get(device, ()):
            return None
        holders = sorted(d for d, s in live.items() if layer in s)
        if holders:
            return holders[0], False
        if layer in replica.get(device, ()):
            return device, True
        holders = sorted(d for d, s in replica.items() if layer in s)
        if holders:
            return holders[0], True
        return CENTRAL, True

    keep: dict[str, Ranges] = {}
    fetch: list[Transfer] = []
    drop: dict[str, Ranges] = {}
    needed: dict[str, set[int]] = {}
    for stage in new.stages:
        layers = list(range(stage.first, stage.last + 1))
        for device in stage.devices:
            needed[device] = set(layers)
            plan_for = [(layer, source(device, layer)) for layer in layers]
            keep[device] = _ranges([layer for layer, src in plan_for
                                    if src is None or src == (device, True)])
            moving = [(layer, src) for layer, src in plan_for
                      if src is not None and src != (device, True)]
            for (src, is_replica), run in groupby(moving, key=lambda x: x[1]):
                run_layers = [layer for layer, _ in run]
                for a, e in _ranges(run_layers):
                    size = state_bytes(profile, a, e, momentum=momentum)
                    fetch.append(Transfer(device=device, layers=(a, e), source=src,
                                          replica=is_replica, bytes=size))
    for device in sorted(set(live) | set(replica)):
        held = live.get(device, set()) | replica.get(device, set())
        extra = sorted(held - needed.get(device, set()))
        if extra:
            drop[device] = _ranges(extra)
    return Redistribution(keep=MappingProxyType(keep), fetch=tuple(fetch),
                          drop=MappingProxyType(drop))


def momentum_name(name: str) -> str:
    """The name the momentum buffer of parameter ``name`` travels under ("3.0.weight" ->
    "3.0.weight:momentum")."""
    return name + MOMENTUM_SUFFIX


def tensor_layer(name: str) -> int | None:
    """The layer a weight tensor belongs to: weights travel named ``<layer index>.<name in the
    layer>`` ("3.0.weight" -> 3), and a parameter's momentum buffer as that name plus
    ``:momentum``, between agents and to the server, so that any stage layout can load them;
    None for a name that does not follow that."""
    index, dot, rest = name.partition(".")
    if not dot or not rest or not index.isascii() or not index.isdigit():
        return None
    return int(index)
