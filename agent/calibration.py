"""This device's fixed costs, as the agent says them at hello: the per-micro-batch overhead
and the per-message cost (agent.profiler's ``measure_overhead`` and ``measure_message_cost``).

The probe takes seconds of a processor, so ``python -m agent run`` starts it on a thread of its
own at once (importing torch there too) while the main thread enrols and waits for the server,
and keeps its result in the agent's state directory, beside the enrolment. A later start reuses
it only when the file names the same key, everything the figures depend on: the probe's
version, torch's version, the torch threads, the emulated slowdown, and the host (its name,
machine, processors and Python). Anything else (unreadable, not this layout, another key) is
logged and measured again. The file is JSON, never unpickled. The stages measure the same
costs again as they train (agent.launch, ``stage_done``), in the conditions they train in.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("edgepipe.agent")

# what the probe measures: a new version makes every kept result another key (bump it when
# measure_overhead or measure_message_cost change)
PROBE_VERSION = 1
MAX_COST_S = 10.0  # a kept figure above this is no figure of a device (hello caps them there)


@dataclass(frozen=True)
class FixedCosts:
    overhead_s: float
    message_s: float


def probe_key(*, slowdown: float, threads: int) -> dict[str, Any]:
    """What the probe's figures depend on; ``threads``: torch's threads where it runs."""
    import torch

    return {"probe": PROBE_VERSION, "torch": torch.__version__, "threads": threads,
            "slowdown": slowdown, "host": socket.gethostname(), "machine": platform.machine(),
            "cpus": os.cpu_count() or 1, "python": platform.python_version()}


def load_kept(path: Path, key: dict[str, Any]) -> FixedCosts | None:
    """The figures kept at ``path`` for ``key``; None, saying why, when there are none."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s: not a kept fixed-cost probe (%s); measuring again", path, exc)
        return None
    try:
        if not isinstance(raw, dict) or not isinstance(raw.get("key"), dict):
            raise ValueError("no key")
        if raw["key"] != key:
            changed = sorted(k for k in {*key, *raw["key"]} if raw["key"].get(k) != key.get(k))
            log.info("%s was measured with another %s; measuring again", path,
                     ", ".join(changed))
            return None
        costs = FixedCosts(overhead_s=_cost(raw, "overhead_s"),
                           message_s=_cost(raw, "message_s"))
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("%s: not a kept fixed-cost probe (%s); measuring again", path, exc)
        return None
    return costs


def _cost(raw: dict[str, Any], name: str) -> float:
    value = raw[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} is not a number")
    if not 0 <= value <= MAX_COST_S:
        raise ValueError(f"{name} {value!r} is not from 0 to {MAX_COST_S:g} s")
    return float(value)


def keep(path: Path, key: dict[str, Any], costs: FixedCosts) -> None:
    """Keep ``costs`` at ``path`` under ``key`` (written whole, then renamed into place)."""
    document = {"key": key, "overhead_s": costs.overhead_s, "message_s": costs.message_s}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(json.dumps(document, indent=1), encoding="utf-8")
        partial.replace(path)
    except OSError as exc:
        log.warning("could not keep the fixed-cost probe in %s: %s", path, exc)


def fixed_costs(*, path: Path | None, slowdown: float, threads: int | None) -> FixedCosts:
    """This device's fixed costs: kept at ``path`` for the same key, else measured now (and
    kept there). Runs on the calling thread, with ``threads`` torch threads (None: torch's)."""
    import torch

    from agent.profiler import measure_message_cost, measure_overhead

    if threads:
        torch.set_num_threads(threads)
    key = probe_key(slowdown=slowdown, threads=torch.get_num_threads())
    kept = None if path is None else load_kept(path, key)
    if kept is not None:
        log.info("fixed costs kept from an earlier start (%s)", path)
        return kept
    costs = FixedCosts(overhead_s=measure_overhead(slowdown=slowdown),
                       message_s=measure_message_cost())
    if path is not None:
        keep(path, key, costs)
    return costs


class Calibration:
    """:func:`fixed_costs` on a thread of its own, started at once; ``result`` waits for it
    (and raises what it raised)."""

    def __init__(self, *, path: Path | None, slowdown: float, threads: int | None) -> None:
        self._costs: FixedCosts | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, kwargs={"path": path, "slowdown": slowdown, "threads": threads},
            name="calibrate", daemon=True)
        self._thread.start()

    def _run(self, **kwargs: Any) -> None:
        try:
            self._costs = fixed_costs(**kwargs)
        except BaseException as exc:  # handed to the thread that asks for the result
            self._error = exc

    def result(self) -> FixedCosts:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._costs is not None
        return self._costs
