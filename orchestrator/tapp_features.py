"""TAPP's layer features, without torch (Mao et al., "TAPP: DNN Training for Task Allocation
through Pipeline Parallelism Based on Distributed Deep Reinforcement Learning", Applied
Sciences 11(11):4785, 2021, section "task partition": each operation of the model is described
by the encoding of its operation name, its parameter, FLOPs and activation metrics and its links
to the next operations; the feed-forward partition network reads one such row per layer).

A profile carries no FLOP counts, so the reference device's forward + backward time stands for
them (the quantity FLOPs are a proxy of). Columns, in order (``FeatureTable.columns``):

- ``kind=<k>``: one-hot operation-name encoding over the profile's distinct ``kind`` values,
  sorted (``conv``, ``linear``, ...); layer names are unique per layer and carry no type;
- ``params``, ``flops``, ``activations``, ``output``: the layer's ``param_bytes``, reference
  forward + backward time, ``activation_bytes`` and ``output_bytes``, each divided by its largest
  value over the layers (0 where every layer has 0);
- ``cum_flops``, ``cum_memory``: the share of the model's compute (resp. parameter + activation
  bytes) in layers 0..l, which places a layer in the model the way a cut sees it;
- ``prev``, ``prev_dir``, ``next``, ``next_dir``: the links of the layer graph as in the
  hierarchical planner TAPP builds on (Mirhoseini et al., ICLR 2018): each neighbour's position
  (index / (L - 1)) and direction (-1 for the input link from the previous layer, +1 for the output
  link to the next one); (0, 0) where there is no neighbour. A profile is a chain, so a layer
  links to the next layer only; the size of that link is ``output``.

A group of layers (a candidate stage) is described by the mean of its layers' rows (the paper's
averaged group features) followed by its share of the model's compute and of its memory, which
the mean alone hides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from orchestrator.formats import ModelProfile

FloatArray = npt.NDArray[np.float64]

METRIC_COLUMNS = ("params", "flops", "activations", "output", "cum_flops", "cum_memory")
LINK_COLUMNS = ("prev", "prev_dir", "next", "next_dir")
GROUP_EXTRA_COLUMNS = ("group_flops_share", "group_memory_share")


@dataclass(frozen=True, eq=False)
class FeatureTable:
    """One row of features per layer, with the column names."""

    columns: tuple[str, ...]
    values: FloatArray  # [L, F]
    shares: FloatArray  # [L, 2] share of the model's compute and memory; a group sums them

    @property
    def width(self) -> int:
        return len(self.columns)

    def column(self, name: str) -> FloatArray:
        if name not in self.columns:
            raise ValueError(f"unknown feature column {name!r}; known: {', '.join(self.columns)}")
        out: FloatArray = self.values[:, self.columns.index(name)]
        return out


def _scaled(values: Sequence[float]) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64)
    top = float(arr.max()) if arr.size else 0.0
    return arr / top if top > 0 else np.zeros_like(arr)


def _share(values: Sequence[float]) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64)
    total = float(arr.sum())
    return arr / total if total > 0 else np.zeros_like(arr)


def layer_features(profile: ModelProfile) -> FeatureTable:
    """The feature rows of every layer of ``profile`` (see the module docstring)."""
    layers = profile.layers
    num_layers = len(layers)
    kinds = sorted({layer.kind for layer in layers})
    onehot = np.zeros((num_layers, len(kinds)))
    for i, layer in enumerate(layers):
        onehot[i, kinds.index(layer.kind)] = 1.0
    work = [layer.forward_s + layer.backward_s for layer in layers]
    memory = [float(layer.param_bytes + layer.activation_bytes) for layer in layers]
    metrics = np.stack([
        _scaled([layer.param_bytes for layer in layers]),
        _scaled(work),
        _scaled([layer.activation_bytes for layer in layers]),
        _scaled([layer.output_bytes for layer in layers]),
        np.cumsum(_share(work)),
        np.cumsum(_share(memory)),
    ], axis=1)
    links = np.zeros((num_layers, len(LINK_COLUMNS)))
    span = max(num_layers - 1, 1)
    for i in range(num_layers):
        if i > 0:
            links[i, 0:2] = ((i - 1) / span, -1.0)
        if i + 1 < num_layers:
            links[i, 2:4] = ((i + 1) / span, 1.0)
    columns = (*(f"kind={k}" for k in kinds), *METRIC_COLUMNS, *LINK_COLUMNS)
    shares = np.stack([_share(work), _share(memory)], axis=1)
    return FeatureTable(columns=columns, values=np.concatenate([onehot, metrics, links], axis=1),
                        shares=shares)
