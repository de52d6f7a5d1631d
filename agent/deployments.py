"""The stages this agent holds, in one registry that every thread goes through under its lock.

A stage is held under its :class:`StageKey`, (run, pipeline, stage): one device may hold
stages of several pipelines of a run (pipeline is 0 while a run has one), but one stage of a
pipeline once. Commands name a run (and maybe a generation); they apply to every stage of
the run held here. The control connection's thread, the command handlers, a stage's own
thread and the data plane's callbacks all read and change it, so no one holds a deployment
by its key without the lock: they take a snapshot, or change it with one call.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import NamedTuple

from agent.executor import Clock, StageExecutor
from orchestrator.protocol import StageSpec


class StageKey(NamedTuple):
    run: int
    pipeline: int
    stage: int


@dataclass(eq=False)
class Deployment:
    """A run's stage held by this agent: ``stop`` ends it, ``running`` cleared pauses it;
    ``started`` once its start came (then ``thread`` runs it)."""

    spec: StageSpec
    executor: StageExecutor
    clock: Clock
    stop: threading.Event = field(default_factory=threading.Event)
    running: threading.Event = field(default_factory=threading.Event)
    started: bool = False
    thread: threading.Thread | None = None

    @property
    def key(self) -> StageKey:
        return StageKey(self.spec.run, self.spec.pipeline, self.spec.stage)

    def end(self) -> None:
        """Tell the stage to stop (a paused one too); it finishes its current action."""
        self.stop.set()
        self.running.set()


class RegistryError(ValueError):
    """A deployment that the registry cannot take: its stage is held already."""


class Deployments:
    """The stages held here, by (run, pipeline, stage), under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[StageKey, Deployment] = {}

    def add(self, deployment: Deployment) -> None:
        """Hold ``deployment``; RegistryError if its stage is held already, or the run's
        stages here are of another generation."""
        key = deployment.key
        with self._lock:
            if key in self._held:
                raise RegistryError(f"stage {key.stage} of run {key.run} is already deployed "
                                    "here")
            others = {d.spec.generation for k, d in self._held.items() if k.run == key.run}
            if others - {deployment.spec.generation}:
                raise RegistryError(f"run {key.run} is already deployed here (generation "
                                    f"{min(others)}); halt it first")
            self._held[key] = deployment

    def get(self, key: StageKey) -> Deployment | None:
        with self._lock:
            return self._held.get(key)

    def of_run(self, run: int) -> list[Deployment]:
        """The run's stages held here, in key order."""
        with self._lock:
            return [self._held[k] for k in sorted(self._held) if k.run == run]

    def all(self) -> list[Deployment]:
        with self._lock:
            return [self._held[k] for k in sorted(self._held)]

    def remove(self, deployment: Deployment) -> bool:
        """Forget ``deployment`` if it is still the one held under its key (a newer one of
        the same stage stays)."""
        with self._lock:
            if self._held.get(deployment.key) is deployment:
                del self._held[deployment.key]
                return True
            return False

    def take_run(self, run: int) -> list[Deployment]:
        """Forget every stage of ``run`` held here and return them."""
        with self._lock:
            keys = sorted(k for k in self._held if k.run == run)
            return [self._held.pop(k) for k in keys]

    def begin(self, deployment: Deployment) -> bool:
        """Mark ``deployment`` started; False if it was already, or is no longer held (its
        expiry or a stop came first)."""
        with self._lock:
            if deployment.started or self._held.get(deployment.key) is not deployment:
                return False
            deployment.started = True
            return True

    def drop_unstarted(self, key: StageKey) -> Deployment | None:
        """Forget the stage under ``key`` if its start has not come; return it then."""
        with self._lock:
            deployment = self._held.get(key)
            if deployment is None or deployment.started:
                return None
            del self._held[key]
            return deployment

    @property
    def busy(self) -> bool:
        """Whether a stage is training here (the heartbeat's status)."""
        with self._lock:
            return any(d.started for d in self._held.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def __contains__(self, run: object) -> bool:
        """Whether a stage of run ``run`` is held here."""
        with self._lock:
            return any(k.run == run for k in self._held)
