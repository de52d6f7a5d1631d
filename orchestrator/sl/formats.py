"""Split-learning instances and schedules (docs/architecture.md, "Split-learning instance").

The problem is the one of Tirana, Tsigkari, Iosifidis and Chatzopoulos, "Workflow Optimization
for Parallel Split Learning" (IEEE INFOCOM 2024), Section III: K clients, H helpers, time in
slots. Every matrix is indexed ``[client j][helper i]``:

- ``r``  release of j's forward task at helper i (client part-1 forward + upload),
- ``p``  helper forward,  ``l`` helper -> client transfer + client part-3 forward and loss,
- ``lp`` client part-3 backward + gradient upload, ``pp`` helper backward,
- ``rp`` gradient download + client part-1 backward.

Parsing is strict like :mod:`orchestrator.formats`: a missing or unknown field, a negative or
fractional slot count, a zero processing time or a matrix of the wrong shape raises
:class:`~orchestrator.errors.FormatError` naming the file, the JSON path (``p[3][1]``) and the
value. Instance files are ``.json`` (one instance) or ``.jsonl`` (one instance a line).

Schedule documents extend the architecture's example with optional fields, all written only
when known:

- ``instance``: the name of the instance the schedule is for;
- ``lower_bound``: a proven lower bound on the optimal makespan, in slots (``exact``, ``auto``);
- ``gap``: ``(makespan - lower_bound) / lower_bound``; ``0.0`` means proven optimal;
- ``switch_slots``: the preemption cost per helper, in slots, the schedule was built for
  (every segment of a task after its first starts with that many reload slots, so a task cut
  into n segments occupies its processing time plus (n - 1) * switch_slots[helper]);
- ``seed``: the seed of a randomised method (``random-fcfs``, ``auto``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import FormatError
from orchestrator.validation import (
    At,
    expect_integer,
    expect_list,
    expect_number,
    expect_object,
    expect_string,
    read_json,
)

MATRICES = ("r", "p", "l", "lp", "pp", "rp")
_POSITIVE = frozenset({"p", "pp"})
_INSTANCE_FIELDS = ("name", "slot_ms", "clients", "helpers", *MATRICES, "demand", "capacity",
                    "memory_unit")
_SCHEDULE_FIELDS = ("method", "assignment", "forward", "backward", "completion", "makespan")
_SCHEDULE_OPTIONAL = ("solver_s", "instance", "lower_bound", "gap", "switch_slots", "seed")

Matrix = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Instance:
    """One batch of parallel split learning: who may serve whom, how long everything takes."""

    name: str
    slot_ms: float
    clients: int
    helpers: int
    r: Matrix
    p: Matrix
    l: Matrix  # noqa: E741 (the paper's name)
    lp: Matrix
    pp: Matrix
    rp: Matrix
    demand: tuple[float, ...]
    capacity: tuple[float, ...]
    memory_unit: str
    source: str | None = None
    file: str = field(default="<input>", compare=False)

    def chain_slots(self, client: int, helper: int) -> int:
        """The makespan of ``client`` alone on ``helper``: every step back to back."""
        j, i = client, helper
        return (self.r[j][i] + self.p[j][i] + self.l[j][i] + self.lp[j][i] + self.pp[j][i]
                + self.rp[j][i])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.source is not None:
            out["source"] = self.source
        out.update(slot_ms=self.slot_ms, clients=self.clients, helpers=self.helpers)
        for key in MATRICES:
            out[key] = [list(row) for row in getattr(self, key)]
        out.update(demand=[_plain(v) for v in self.demand],
                   capacity=[_plain(v) for v in self.capacity], memory_unit=self.memory_unit)
        return out


@dataclass(frozen=True)
class Segment:
    """A half-open slot range [start, end) during which ``helper`` works for ``client``."""

    helper: int
    client: int
    start: int
    end: int

    @property
    def slots(self) -> int:
        return self.end - self.start

    def to_json(self) -> dict[str, int]:
        return {"helper": self.helper, "client": self.client, "start": self.start,
                "end": self.end}


@dataclass(frozen=True)
class Schedule:
    """An assignment of clients to helpers with the forward and backward segments of each."""

    method: str
    assignment: tuple[int, ...]
    forward: tuple[Segment, ...]
    backward: tuple[Segment, ...]
    completion: tuple[int, ...]
    makespan: int
    solver_s: float = 0.0
    instance: str | None = None
    lower_bound: int | None = None
    gap: float | None = None
    switch_slots: tuple[int, ...] | None = None
    seed: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method}
        if self.instance is not None:
            out["instance"] = self.instance
        out.update(assignment=list(self.assignment),
                   forward=[s.to_json() for s in self.forward],
                   backward=[s.to_json() for s in self.backward],
                   completion=list(self.completion), makespan=self.makespan,
                   solver_s=self.solver_s)
        if self.lower_bound is not None:
            out["lower_bound"] = self.lower_bound
        if self.gap is not None:
            out["gap"] = self.gap
        if self.switch_slots is not None:
            out["switch_slots"] = list(self.switch_slots)
        if self.seed is not None:
            out["seed"] = self.seed
        return out


def _plain(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def _matrix(raw: Any, at: At, *, rows: int, cols: int, minimum: int) -> Matrix:
    items = expect_list(raw, at)
    if len(items) != rows:
        raise at.fail(f"has {len(items)} rows but there are {rows} clients", len(items))
    out = []
    for j, raw_row in enumerate(items):
        row_at = at.index(j)
        row = expect_list(raw_row, row_at)
        if len(row) != cols:
            raise row_at.fail(f"has {len(row)} entries but there are {cols} helpers", len(row))
        out.append(tuple(expect_integer(v, row_at.index(i), minimum=minimum)
                         for i, v in enumerate(row)))
    return tuple(out)


def _vector(raw: Any, at: At, *, length: int, what: str) -> tuple[float, ...]:
    items = expect_list(raw, at)
    if len(items) != length:
        raise at.fail(f"has {len(items)} entries but there are {length} {what}", len(items))
    return tuple(expect_number(v, at.index(k)) for k, v in enumerate(items))


def parse_instance(raw: Any, *, file: str = "<input>") -> Instance:
    """Validate a split-learning instance document and return it as an :class:`Instance`."""
    at = At(file)
    obj = expect_object(raw, at, _INSTANCE_FIELDS, ("source",))
    clients = expect_integer(obj["clients"], at.key("clients"), minimum=1)
    helpers = expect_integer(obj["helpers"], at.key("helpers"), minimum=1)
    matrices = {key: _matrix(obj[key], at.key(key), rows=clients, cols=helpers,
                             minimum=1 if key in _POSITIVE else 0) for key in MATRICES}
    source = obj.get("source")
    return Instance(
        name=expect_string(obj["name"], at.key("name")),
        slot_ms=expect_number(obj["slot_ms"], at.key("slot_ms"), positive=True),
        clients=clients,
        helpers=helpers,
        **matrices,
        demand=_vector(obj["demand"], at.key("demand"), length=clients, what="clients"),
        capacity=_vector(obj["capacity"], at.key("capacity"), length=helpers, what="helpers"),
        memory_unit=expect_string(obj["memory_unit"], at.key("memory_unit")),
        source=None if source is None else expect_string(source, at.key("source")),
        file=file,
    )


def read_instances(path: str | Path) -> tuple[Instance, ...]:
    """Every instance of a ``.json`` file (one) or a ``.jsonl`` file (one a non-blank line)."""
    p = Path(path)
    if p.suffix != ".jsonl":
        return (parse_instance(read_json(p), file=str(p)),)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise FormatError("no such file", file=str(p)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FormatError(f"cannot be read: {exc}", file=str(p)) from None
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{p}:{number}"
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise FormatError(f"is not valid JSON: {exc.msg} at column {exc.colno}",
                              file=where) from None
        out.append(parse_instance(raw, file=where))
    if not out:
        raise FormatError("holds no instance (every line is blank)", file=str(p))
    return tuple(out)


def load_instance(path: str | Path, *, index: int | None = None,
                  name: str | None = None) -> Instance:
    """Read one instance; in a file of several, pick it by ``index`` (from 0) or ``name``."""
    instances = read_instances(path)
    if index is not None and name is not None:
        raise FormatError("give --index or --name, not both", file=str(path))
    if index is not None:
        if not 0 <= index < len(instances):
            raise FormatError(f"has {len(instances)} instances, so the index must be between 0 "
                              f"and {len(instances) - 1}", file=str(path), field="index",
                              value=index)
        return instances[index]
    if name is not None:
        found = [inst for inst in instances if inst.name == name]
        if not found:
            raise FormatError("no instance has this name", file=str(path), field="name",
                              value=name)
        if len(found) > 1:
            raise FormatError(f"{len(found)} instances have this name; pick one with --index",
                              file=str(path), field="name", value=name)
        return found[0]
    if len(instances) > 1:
        raise FormatError(f"holds {len(instances)} instances; pick one with --index N "
                          f"(0..{len(instances) - 1}) or --name NAME", file=str(path))
    return instances[0]


def _segments(raw: Any, at: At) -> tuple[Segment, ...]:
    out = []
    for k, raw_seg in enumerate(expect_list(raw, at, nonempty=False)):
        sa = at.index(k)
        so = expect_object(raw_seg, sa, ("helper", "client", "start", "end"))
        start = expect_integer(so["start"], sa.key("start"))
        end = expect_integer(so["end"], sa.key("end"))
        if end <= start:
            raise sa.key("end").fail(f"must be after start ({start}): segments are [start, end)",
                                     end)
        out.append(Segment(helper=expect_integer(so["helper"], sa.key("helper")),
                           client=expect_integer(so["client"], sa.key("client")),
                           start=start, end=end))
    return tuple(out)


def parse_schedule(raw: Any, *, file: str = "<input>") -> Schedule:
    """Validate the shape of a schedule document; :func:`orchestrator.sl.check.first_violation`
    then says whether it is feasible for a given instance."""
    at = At(file)
    obj = expect_object(raw, at, _SCHEDULE_FIELDS, _SCHEDULE_OPTIONAL)
    switch = obj.get("switch_slots")
    lower = obj.get("lower_bound")
    gap = obj.get("gap")
    seed = obj.get("seed")
    instance = obj.get("instance")
    return Schedule(
        method=expect_string(obj["method"], at.key("method")),
        assignment=tuple(expect_integer(v, at.key("assignment").index(j)) for j, v in
                         enumerate(expect_list(obj["assignment"], at.key("assignment")))),
        forward=_segments(obj["forward"], at.key("forward")),
        backward=_segments(obj["backward"], at.key("backward")),
        completion=tuple(expect_integer(v, at.key("completion").index(j)) for j, v in
                         enumerate(expect_list(obj["completion"], at.key("completion")))),
        makespan=expect_integer(obj["makespan"], at.key("makespan")),
        solver_s=expect_number(obj.get("solver_s", 0.0), at.key("solver_s")),
        instance=None if instance is None else expect_string(instance, at.key("instance")),
        lower_bound=None if lower is None else expect_integer(lower, at.key("lower_bound")),
        gap=None if gap is None else expect_number(gap, at.key("gap")),
        switch_slots=None if switch is None else tuple(
            expect_integer(v, at.key("switch_slots").index(i))
            for i, v in enumerate(expect_list(switch, at.key("switch_slots")))),
        seed=None if seed is None else expect_integer(seed, at.key("seed")),
    )


def load_schedule(path: str | Path) -> Schedule:
    """Read and shape-check a schedule JSON file."""
    return parse_schedule(read_json(path), file=str(path))
