"""This machine's warm per-layer times by model spec (model, data set, batch size): kept from
each profile, in memory and in a file that outlives the agent process, and measured at a
deployment when missing. An emulated ``--slowdown`` paces a stage by them, so a restarted
agent must find the ones its profile was taken with, not measure new ones that disagree
with the profile the server plans by."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from agent.data import Dataset
from agent.profiler import profile_model, warm_times
from agent.zoo import build_model
from orchestrator.formats import LayerTimes, parse_layer_times

log = logging.getLogger("edgepipe.agent")

Key = tuple[str, str, int]


class WarmTimes:
    def __init__(self, *, path: Path | None, uid: str, threads: int | None,
                 dataset: Callable[[str], Dataset]) -> None:
        """``path``: where they are kept between runs of the agent (None: in memory only)."""
        self.path = path
        self.uid = uid
        self.threads = threads
        self.dataset = dataset
        self._lock = threading.Lock()
        self.times: dict[Key, LayerTimes] = self._load()

    def _load(self) -> dict[Key, LayerTimes]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            return {(str(e["model"]), str(e["dataset"]), int(e["batch_size"])):
                    parse_layer_times(e["layer_times"], file=str(self.path)) for e in raw}
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("%s: not warm layer times (%s); measuring them again", self.path, exc)
            return {}

    def keep(self, key: Key, times: LayerTimes) -> None:
        """Keep a model spec's warm times (a profile's thread and a deployment may both)."""
        with self._lock:
            self.times[key] = times
            if self.path is None:
                return
            document = [{"model": m, "dataset": d, "batch_size": b, "layer_times": t.to_json()}
                        for (m, d, b), t in self.times.items()]
            try:
                partial = self.path.with_suffix(".partial")
                partial.write_text(json.dumps(document), encoding="utf-8")
                partial.replace(self.path)
            except OSError as exc:
                log.warning("could not keep the warm layer times in %s: %s", self.path, exc)

    def get(self, model: str, dataset: str, batch_size: int) -> LayerTimes:
        """The warm times of a model spec: kept from its profile, or measured now, on a copy
        of the model (an agent started since it was profiled)."""
        key = (model, dataset, batch_size)
        with self._lock:
            kept = self.times.get(key)
        if kept is not None:
            return kept
        data = self.dataset(dataset)
        probe = build_model(model, input_shape=data.input_shape, num_classes=data.num_classes)
        if self.threads:  # this is a pool thread (see agent.workers.spawn)
            torch.set_num_threads(self.threads)
        log.info("measuring %s's warm layer times for its emulated slowdown", model)
        times = warm_times(profile_model(probe, batch_size=batch_size, reference=self.uid,
                                         dataset=dataset, progress=False), slowdown=1.0)
        self.keep(key, times)
        return times
