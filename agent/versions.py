"""A stage's weight versions: the live weights, the snapshots its forwards run on, and
FTPipeHD's weight aggregation (docs/architecture.md, "Replicated stages and two lanes").

A version counts updates. A forward runs on the version its gate names; it runs on the live
parameters when they are that version and no update comes before its backward, else on a
snapshot (cloned tensors, leaves autograd differentiates; weight stashing). Snapshots are
kept for as long as a micro-batch in flight or a forward to come needs them (under vertical
sync, every version a later stage may still ask for). On two lanes the forward lane reads
while the other lane updates: the live weights and the snapshots are changed under ``lock``.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Iterable, Sequence

import torch


class VersionError(RuntimeError):
    """A forward asked for a version no longer (or not yet) kept."""


class WeightVersions:
    def __init__(self, params: Sequence[torch.Tensor], *, version: int, needed: Iterable[int],
                 snapshots_only: bool, keep_every: bool) -> None:
        """``needed``: the version of each forward to come. ``snapshots_only``: forwards
        always run on snapshots (two lanes). ``keep_every``: keep each version as it is made
        (vertical sync: a later stage may ask for any)."""
        self.params = list(params)
        self.version = version
        self.lock = threading.Lock()
        self.snapshots: dict[int, list[torch.Tensor]] = {}
        self.needed: Counter[int] = Counter(needed)
        # the versions forwards to come need, in order, and the first still needed: updated()
        # asks for the oldest one at each update (once a scan of every version of the run,
        # whose cost grew with the run)
        self._pending = sorted(self.needed)
        self._first_pending = 0
        self.snapshots_only = snapshots_only
        self.keep_every = keep_every
        if snapshots_only or keep_every:
            with self.lock:
                self._keep()

    def _keep(self) -> None:
        """Keep a snapshot of the live weights (under ``lock``)."""
        if self.version not in self.snapshots:
            self.snapshots[self.version] = [p.detach().clone().requires_grad_(True)
                                            for p in self.params]

    def is_live(self, weights: Sequence[torch.Tensor]) -> bool:
        """Whether ``weights`` (what :meth:`weights` returned) are the live parameters
        themselves, not a snapshot of them."""
        return weights is self.params

    def weights(self, version: int, *, stash: bool, gated: int) -> list[torch.Tensor]:
        """The weights of ``version`` for a forward: a kept snapshot, else the live
        parameters when they are that version (a snapshot of them first when ``stash``: an
        update comes before the forward's backward). ``gated``: the version the forward's gate
        named, which it no longer needs kept."""
        with self.lock:
            self.needed[gated] -= 1
            if version in self.snapshots:
                return self.snapshots[version]
            if version != self.version or self.snapshots_only:
                raise VersionError(f"weight version {version} is no longer stashed "
                                   f"(current {self.version})")
            if not stash:
                return self.params
            self._keep()
            return self.snapshots[version]

    def refresh(self) -> None:
        """The live weights changed without a new version (an aggregation group's average):
        a snapshot of the live version is taken again."""
        with self.lock:
            if self.snapshots.pop(self.version, None) is not None:
                self._keep()

    def updated(self, *, in_flight: Iterable[int], floor: int) -> None:
        """The live weights became the next version: keep it if a forward to come runs on
        it, drop the snapshots nothing needs any more: no micro-batch ``in_flight`` ran on
        it, no forward to come runs on it, and under vertical sync it is older than ``floor``
        (the oldest version a later stage may still ask for)."""
        with self.lock:
            self.version += 1
            if self.keep_every or (self.snapshots_only and self.needed[self.version] > 0):
                self._keep()
            flight = set(in_flight)
            low = None
            if self.keep_every:
                oldest = self._oldest_needed()
                low = min([*flight, self.version, floor,
                           *(() if oldest is None else (oldest,))])
            for version in [v for v in self.snapshots
                            if v not in flight and v != self.version
                            and self.needed[v] <= 0 and (low is None or v < low)]:
                del self.snapshots[version]

    def _oldest_needed(self) -> int | None:
        """The oldest version a forward to come still needs (None: none)."""
        while (self._first_pending < len(self._pending)
               and self.needed[self._pending[self._first_pending]] <= 0):
            self._first_pending += 1
        if self._first_pending == len(self._pending):
            return None
        return self._pending[self._first_pending]


class Aggregation:
    """FTPipeHD's weight aggregation: stage i of an n-stage pipeline trains n - i weight
    versions at once (its micro-batches in flight), and every ``every`` x ``window`` updates
    its weights become the average of its last ``window`` versions (FTPipeHD, section III-C;
    ``window`` is the stage's in-flight depth, which is n - i under PipeDream's depths)."""

    def __init__(self, params: Sequence[torch.Tensor], *, version: int, every: int,
                 window: int) -> None:
        self.params = list(params)
        self.every, self.window = every, window
        self.recent: deque[tuple[int, list[torch.Tensor]]] = deque(maxlen=window)
        self.remember(version)

    def remember(self, version: int) -> None:
        self.recent.append((version, [p.detach().clone() for p in self.params]))

    def after_update(self, version: int, lock: threading.Lock) -> tuple[int, ...] | None:
        """Remember the new version; at an aggregation point average the window into the
        live weights (under ``lock``) and return the versions averaged (None otherwise). A
        resumed stage aggregates once it holds a whole window again."""
        self.remember(version)
        if (self.window < 2 or len(self.recent) < self.window
                or version % (self.every * self.window)):
            return None
        versions = tuple(v for v, _ in self.recent)
        with lock, torch.no_grad():
            for i, param in enumerate(self.params):
                param.copy_(torch.stack([w[i] for _, w in self.recent]).mean(dim=0))
        self.recent[-1] = (version, [p.detach().clone() for p in self.params])
        return versions
