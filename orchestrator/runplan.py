"""A run of several pipelines over shared devices, with aggregation groups
(docs/architecture.md, "Runs beyond a chain").

One description covers every kind of run: an FTPipeHD run is one pipeline; split learning is
one pipeline per client and PipeLearn one per device, whose stages share a helper or the
server. Each pipeline is a :class:`~orchestrator.planformat.Plan` (a chain of stages, each served
by a group of devices) that trains its own micro-batches (its own data); a device may serve
stages of several pipelines. An :class:`AggregationGroup` names stages of several pipelines
whose weights are averaged (FedAvg, weighted by samples) at the end of every round: the ``G``
action of their lists. A round is ``every[i]`` micro-batches of member i's pipeline (a client
with a larger shard has longer rounds), and every member's pipeline has the same number of
them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import FormatError
from orchestrator.formats import DeviceSet, ModelProfile
from orchestrator.planformat import Plan, parse_plan
from orchestrator.validation import At, expect_integer, expect_list, expect_number, expect_object


@dataclass(frozen=True)
class AggregationGroup:
    """Stages (pipeline, stage) whose weights are averaged every ``every`` micro-batches of
    each member's pipeline, weighted by ``weights`` (samples; default equal)."""

    members: tuple[tuple[int, int], ...]
    every: tuple[int, ...]
    weights: tuple[float, ...] | None = None

    def weight(self, member: int) -> float:
        return 1.0 if self.weights is None else self.weights[member]

    def every_of(self, pipeline: int, stage: int) -> int:
        return self.every[self.members.index((pipeline, stage))]

    def round_of(self, pipeline: int, stage: int, microbatch: int) -> int:
        """Which round ends with ``microbatch`` in that member's pipeline."""
        return (microbatch + 1) // self.every_of(pipeline, stage) - 1

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"members": [list(m) for m in self.members],
                               "every": list(self.every)}
        if self.weights is not None:
            out["weights"] = list(self.weights)
        return out


@dataclass(frozen=True)
class RunPlan:
    """The run's pipelines, how many micro-batches each trains, and its aggregation groups."""

    pipelines: tuple[Plan, ...]
    microbatches: tuple[int, ...]
    groups: tuple[AggregationGroup, ...] = ()

    def __post_init__(self) -> None:
        check_run_plan(self)

    @property
    def schedule(self) -> str:
        return self.pipelines[0].schedule

    def rounds(self, pipeline: int) -> dict[int, int]:
        """{stage: micro-batches a round} of ``pipeline``'s stages in an aggregation group."""
        return {k: g.every_of(p, k) for g in self.groups for p, k in g.members if p == pipeline}

    def group_of(self, pipeline: int, stage: int) -> AggregationGroup | None:
        return next((g for g in self.groups if (pipeline, stage) in g.members), None)

    @property
    def device_ids(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for plan in self.pipelines:
            for d in plan.device_ids:
                seen.setdefault(d)
        return tuple(seen)

    def to_json(self) -> dict[str, Any]:
        return {"pipelines": [p.to_json() for p in self.pipelines],
                "microbatches": list(self.microbatches),
                "groups": [g.to_json() for g in self.groups]}


def check_run_plan(run: RunPlan) -> None:
    """Raise ValueError naming what is wrong: no pipeline, pipelines under different
    schedules, a count per pipeline missing or not positive, a group member that is no stage,
    on several devices (an aggregation group averages single-device stages), or in two
    groups, a group of fewer than two members, weights that do not match its members."""
    if not run.pipelines:
        raise ValueError("a run plan needs at least one pipeline")
    if len({p.schedule for p in run.pipelines}) > 1:
        raise ValueError("every pipeline of a run trains under one schedule")
    if len(run.microbatches) != len(run.pipelines) or min(run.microbatches) < 1:
        raise ValueError("microbatches needs a positive count for each pipeline")
    seen: set[tuple[int, int]] = set()
    for g, group in enumerate(run.groups):
        if len(group.members) < 2:
            raise ValueError(f"groups[{g}] needs two members or more")
        if len(group.every) != len(group.members) or min(group.every) < 1:
            raise ValueError(f"groups[{g}].every: a positive round length per member")
        if group.weights is not None and (len(group.weights) != len(group.members)
                                          or min(group.weights) <= 0):
            raise ValueError(f"groups[{g}].weights: one positive weight per member")
        for p, k in group.members:
            if not (0 <= p < len(run.pipelines) and 0 <= k < len(run.pipelines[p].stages)):
                raise ValueError(f"groups[{g}]: member ({p}, {k}) is no stage of the run")
            if len(run.pipelines[p].stages[k].devices) > 1:
                raise ValueError(f"groups[{g}]: member ({p}, {k}) is replicated; a group "
                                 "averages stages on one device each")
            if (p, k) in seen:
                raise ValueError(f"groups[{g}]: member ({p}, {k}) is in two groups")
            seen.add((p, k))
        layers = {run.pipelines[p].stages[k].layers for p, k in group.members}
        if len(layers) > 1:
            raise ValueError(f"groups[{g}]: its members hold different layers {sorted(layers)}")
        rounds = {run.microbatches[p] // every for (p, _), every in zip(group.members,
                                                                        group.every,
                                                                        strict=True)}
        if len(rounds) > 1:
            raise ValueError(f"groups[{g}]: its members' pipelines make {sorted(rounds)} "
                             "rounds; every member must make the same number")


def parse_run_plan(raw: Any, *, profile: ModelProfile, devices: DeviceSet,
                   file: str = "<input>") -> RunPlan:
    """Validate a run plan document ({"pipelines": [plan, ...], "microbatches": [n, ...],
    "groups": [{"members": [[p, k], ...], "every": [n, ...], "weights": [...]}]})."""
    at = At(file)
    obj = expect_object(raw, at, ("pipelines", "microbatches"), ("groups",))
    pipelines = tuple(parse_plan(p, profile=profile, devices=devices,
                                 file=f"{file}: pipelines[{i}]")
                      for i, p in enumerate(expect_list(obj["pipelines"], at.key("pipelines"))))
    counts = tuple(expect_integer(n, at.key("microbatches").index(i), minimum=1)
                   for i, n in enumerate(expect_list(obj["microbatches"],
                                                     at.key("microbatches"))))
    groups = []
    for g, raw_group in enumerate(expect_list(obj.get("groups", []), at.key("groups"),
                                              nonempty=False)):
        ga = at.key("groups").index(g)
        go = expect_object(raw_group, ga, ("members", "every"), ("weights",))
        members = []
        for i, member in enumerate(expect_list(go["members"], ga.key("members"))):
            pair = expect_list(member, ga.key("members").index(i))
            if len(pair) != 2:
                raise ga.key("members").index(i).fail("must be [pipeline, stage]", pair)
            members.append((expect_integer(pair[0], ga.key("members").index(i).index(0)),
                            expect_integer(pair[1], ga.key("members").index(i).index(1))))
        weights = None
        if go.get("weights") is not None:
            weights = tuple(expect_number(w, ga.key("weights").index(i))
                            for i, w in enumerate(expect_list(go["weights"], ga.key("weights"))))
        every = tuple(expect_integer(n, ga.key("every").index(i), minimum=1)
                      for i, n in enumerate(expect_list(go["every"], ga.key("every"))))
        groups.append(AggregationGroup(members=tuple(members), every=every, weights=weights))
    try:
        return RunPlan(pipelines=pipelines, microbatches=counts, groups=tuple(groups))
    except ValueError as exc:
        raise FormatError(f"{file}: {exc}") from None


def single(plan: Plan, microbatches: int) -> RunPlan:
    """The run plan of one pipeline."""
    return RunPlan(pipelines=(plan,), microbatches=(microbatches,))


def weights_of(run: RunPlan) -> Mapping[tuple[int, int], float]:
    """Each group member's FedAvg weight, by (pipeline, stage)."""
    return {m: g.weight(i) for g in run.groups for i, m in enumerate(g.members)}


def member_devices(run: RunPlan, group: AggregationGroup) -> Sequence[str]:
    """The devices of a group's members, in member order (a device may repeat)."""
    return [run.pipelines[p].stages[k].devices[0] for p, k in group.members]
