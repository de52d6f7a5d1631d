"""A split run's settings: who is a client and who a helper, the cuts, and how its study is
solved (docs/architecture.md, "Split learning trained")."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.protocol.stagespec import SHARD_SPLITS
from orchestrator.sl.runtime import SplitCuts, check_roles

MAX_TIME_LIMIT_S = 600.0  # a method's time limit, seconds
MAX_SLOT_MS = 60_000.0


@dataclass(frozen=True)
class SplitSettings:
    """``clients`` and ``helpers`` (device ids; pipeline j is client j's), the ``cuts`` of
    every client, the study's slot length ``slot_ms``, how the training set is cut among the
    clients (``shard_split``), and the solver's ``time_limit_s``, ``switch_slots`` and
    ``seed``. Constructing checks each field and raises ValueError naming it."""

    clients: tuple[str, ...]
    helpers: tuple[str, ...]
    cuts: SplitCuts
    slot_ms: float = 10.0
    shard_split: str = "iid"
    time_limit_s: float = 5.0
    switch_slots: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        check_roles(clients=self.clients, helpers=self.helpers)
        for name in ("slot_ms", "time_limit_s"):
            value = getattr(self, name)
            most = MAX_SLOT_MS if name == "slot_ms" else MAX_TIME_LIMIT_S
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not math.isfinite(value) or not 0 < value <= most:
                raise ValueError(f"{name}: must be a number above 0 and at most {most:g}, got "
                                 f"{value!r}")
        if self.shard_split not in SHARD_SPLITS:
            raise ValueError(f"shard_split: must be {' or '.join(SHARD_SPLITS)}, got "
                             f"{self.shard_split!r}")
        for name in ("switch_slots", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: must be an integer of at least 0, got {value!r}")

    def check_layers(self, num_layers: int) -> None:
        """ValueError naming the cut unless part-3 (sigma2+1..) of a ``num_layers``-layer
        model is not empty."""
        if self.cuts.sigma2 > num_layers - 2:
            raise ValueError(f"cuts.sigma2: must be at most {num_layers - 2} so that part-3 "
                             f"(layers sigma2+1..{num_layers - 1}) is not empty, got "
                             f"{self.cuts.sigma2}")

    def to_json(self) -> dict[str, Any]:
        return {"clients": list(self.clients), "helpers": list(self.helpers),
                "cuts": self.cuts.to_json(), "slot_ms": self.slot_ms,
                "shard_split": self.shard_split, "time_limit_s": self.time_limit_s,
                "switch_slots": self.switch_slots, "seed": self.seed}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SplitSettings:
        """The settings a run stored (ValueError naming the field when they are not)."""
        if not isinstance(raw, Mapping):
            raise ValueError("split: must be an object")
        cuts = raw.get("cuts")
        if not isinstance(cuts, Mapping) or set(cuts) != {"sigma1", "sigma2"}:
            raise ValueError("cuts: must be {sigma1, sigma2}")
        try:
            split_cuts = SplitCuts(sigma1=cuts["sigma1"], sigma2=cuts["sigma2"])
        except ValueError as exc:
            raise ValueError(f"cuts.{exc}") from None
        return cls(clients=tuple(raw.get("clients") or ()), helpers=tuple(raw.get("helpers") or ()),
                   cuts=split_cuts, slot_ms=raw.get("slot_ms", 10.0),
                   shard_split=raw.get("shard_split", "iid"),
                   time_limit_s=raw.get("time_limit_s", 5.0),
                   switch_slots=raw.get("switch_slots", 0), seed=raw.get("seed", 0))
