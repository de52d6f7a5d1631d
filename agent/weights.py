"""Weights that outlive a stage: checkpoints, replicas, and moving them as safetensors.

A stage's weights are named ``<layer index>.<name in the layer>`` (parameters and buffers), so a
part of the model saved by one stage layout loads into any other. Under SGD with momentum the
optimizer's buffer of each parameter travels with the weights as ``<name>:momentum``: a stage
resumed on another device takes up the same momentum, and trains as if nothing had happened. On
the wire and on the server they are safetensors (a JSON header and raw bytes: nothing is
unpickled); the metadata says ``run``, ``first``, ``last`` and ``applied`` (how many
micro-batches' updates the weights hold, docs/architecture.md, "Fault tolerance").

:class:`WeightStore` keeps, per run and across generations, what this agent can restore from
or serve to a recovering neighbour: its own checkpoints (at replication points and in the
rollback window) and the chain replicas its predecessor sent. The data plane's receiver thread
serves fetches from it while the stage thread adds checkpoints, hence the lock.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from orchestrator.redistribution import MOMENTUM_SUFFIX, momentum_name, tensor_layer

Tensors = dict[str, torch.Tensor]
KEEP_REPLICATION_POINTS = 2  # of each kind (own, replica): the newest two


class WeightError(ValueError):
    """Weights that do not fit (a malformed blob, a missing or foreign tensor)."""


def _model_wide(local_name: str, first: int) -> str:
    """A stage's name of a tensor ("0.weight") as the model's ("<first>.weight")."""
    local, _, rest = local_name.partition(".")
    return f"{first + int(local)}.{rest}"


def parameter_slots(module: nn.Module, first: int) -> list[tuple[str, nn.Module, str]]:
    """(model-wide name, owning module, attribute) of each of the stage's parameters, in the
    order ``module.modules()`` visits their owners: where a stashed weight version goes for one
    forward, and what names the optimizer's buffers travel under."""
    out = []
    for prefix, owner in module.named_modules():
        for name, _ in owner.named_parameters(recurse=False):
            qualified = f"{prefix}.{name}" if prefix else name
            out.append((_model_wide(qualified, first), owner, name))
    return out


def momentum_state(tensors: Mapping[str, torch.Tensor]) -> Tensors:
    """The momentum buffers among restored tensors, by the name of their parameter."""
    return {k[:-len(MOMENTUM_SUFFIX)]: v for k, v in tensors.items()
            if k.endswith(MOMENTUM_SUFFIX)}


def momentum_refs(names: list[str], buffers: list[torch.Tensor]
                  ) -> list[tuple[str, torch.Tensor]]:
    """The optimizer's momentum buffers under their travelling names, as views (they follow the
    optimizer's in-place updates, as :func:`state_refs` does)."""
    return [(momentum_name(n), b.detach()) for n, b in zip(names, buffers, strict=True)]


def state_refs(module: nn.Module, first: int) -> list[tuple[str, torch.Tensor]]:
    """``module``'s parameters and buffers (a stage: an nn.Sequential of layers ``first``..)
    under their model-wide names, as views of the live tensors: they follow in-place updates
    (the optimizer's, a load), so a stage can :func:`snapshot` them after every update without
    walking the module again (``state_dict`` took two thirds of a checkpoint of the MLP)."""
    return [(_model_wide(name, first), tensor.detach())
            for name, tensor in module.state_dict().items()]


def snapshot(refs: list[tuple[str, torch.Tensor]]) -> Tensors:
    """Copies of the tensors ``refs`` name (:func:`state_refs`)."""
    return {name: tensor.clone() for name, tensor in refs}


def load_layer_state(module: nn.Module, first: int, tensors: Mapping[str, torch.Tensor]) -> None:
    """Load model-wide named tensors into the stage; every tensor of the stage must be there
    (momentum buffers among them are the optimizer's: :func:`momentum_state`)."""
    wanted = module.state_dict()
    renamed: Tensors = {}
    for name in wanted:
        key = _model_wide(name, first)
        if key not in tensors:
            raise WeightError(f"no weights for {key}")
        if tensors[key].shape != wanted[name].shape:
            raise WeightError(f"{key} has shape {list(tensors[key].shape)}, the stage needs "
                              f"{list(wanted[name].shape)}")
        renamed[name] = tensors[key]
    module.load_state_dict(renamed, strict=True)


def layer_of(name: str) -> int:
    layer = tensor_layer(name)
    if layer is None:
        raise WeightError(f"tensor {name!r} is not named <layer>.<name>")
    return layer


def select(tensors: Mapping[str, torch.Tensor], first: int, last: int) -> Tensors:
    return {k: v for k, v in tensors.items() if first <= layer_of(k) <= last}


def to_bytes(tensors: Mapping[str, torch.Tensor], *, run: int, first: int, last: int,
             applied: int) -> bytes:
    metadata = {"run": str(run), "first": str(first), "last": str(last), "applied": str(applied)}
    return bytes(st_save({k: v.contiguous() for k, v in tensors.items()}, metadata=metadata))


def blob_tensor(data: bytes) -> torch.Tensor:
    """Bytes (a safetensors blob, or none) as the uint8 tensor a data-plane message carries."""
    if not data:
        return torch.zeros(0, dtype=torch.uint8)  # frombuffer refuses an empty buffer
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def from_bytes(data: bytes, *, first: int, last: int) -> Tensors:
    """Parse a safetensors blob and check every tensor belongs to layers first..last."""
    if len(data) < 8:
        raise WeightError("weights: not a safetensors blob (too short)")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise WeightError("weights: the safetensors header runs past the end")
    try:
        json.loads(data[8:8 + size])
        tensors = st_load(data)
    except Exception as exc:  # safetensors raises its own error types
        raise WeightError(f"weights: not a safetensors blob ({exc})") from None
    for name in tensors:
        if not first <= layer_of(name) <= last:
            raise WeightError(f"weights: tensor {name!r} is outside layers {first}..{last}")
    return tensors


@dataclass(frozen=True)
class Entry:
    layers: tuple[int, int]
    applied: int
    kind: str  # own | replica
    tensors: Tensors
    pinned: bool  # a replication point (kept until two newer ones), not only the window
    generation: int = 0  # of the deployment whose lineage the weights belong to


class WeightStore:
    """One run's checkpoints and replicas on this agent."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.lock = threading.Lock()

    def add(self, entry: Entry) -> None:
        with self.lock:
            self.entries = [e for e in self.entries if not (
                e.layers == entry.layers and e.applied == entry.applied and e.kind == entry.kind)]
            self.entries.append(entry)
            if entry.pinned:
                self._retain(entry.kind, entry.layers)

    def _retain(self, kind: str, layers: tuple[int, int]) -> None:
        points = sorted({e.applied for e in self.entries
                         if e.kind == kind and e.layers == layers and e.pinned}, reverse=True)
        old = set(points[KEEP_REPLICATION_POINTS:])
        self.entries = [e for e in self.entries if not (
            e.kind == kind and e.layers == layers and e.pinned and e.applied in old)]

    def trim_window(self, layers: tuple[int, int], floor: int, current: int) -> None:
        """Drop own rollback-window checkpoints older than ``floor`` (nothing before it can
        still be asked for) except ``current``."""
        with self.lock:
            self.entries = [e for e in self.entries if not (
                e.kind == "own" and not e.pinned and e.layers == layers
                and e.applied < floor and e.applied != current)]

    def holdings(self) -> list[dict[str, object]]:
        with self.lock:
            seen = sorted({(e.layers, e.applied, e.kind) for e in self.entries})
        return [{"layers": list(layers), "applied": applied, "kind": kind}
                for layers, applied, kind in seen]

    def part(self, first: int, last: int, applied: int) -> Tensors | None:
        """Layers first..last at ``applied``, merged from whatever entries cover them; None when
        some layer is not covered."""
        with self.lock:
            covering = [e for e in self.entries if e.applied == applied
                        and e.layers[0] <= last and e.layers[1] >= first]
        covered = {i for e in covering for i in range(e.layers[0], e.layers[1] + 1)}
        if not set(range(first, last + 1)) <= covered:
            return None
        out: Tensors = {}
        for entry in covering:
            out.update(select(entry.tensors, first, last))
        return out

    def commit(self, generation: int) -> None:
        """A new generation starts: drop what older ones held (their copies past the resume
        point belong to a lineage the recovery abandoned), keep what this one already sent."""
        with self.lock:
            self.entries = [e for e in self.entries if e.generation == generation]
