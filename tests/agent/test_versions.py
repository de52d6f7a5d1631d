"""agent.versions.WeightVersions keeps exactly the snapshots its rule says, found without
scanning every version of the run at each update (which grew with the run's length)."""

from __future__ import annotations

from collections import Counter

import torch
from hypothesis import given
from hypothesis import strategies as st

from agent.versions import WeightVersions


def kept_by_the_rule(snapshots: set[int], *, version: int, needed: Counter[int],
                     in_flight: set[int], floor: int, keep_every: bool) -> set[int]:
    """The rule as first written: every version any forward to come needs, scanned."""
    keep = in_flight | {version} | {v for v, count in needed.items() if count > 0}
    if keep_every:
        low = min([*keep, floor])
        keep |= {v for v in snapshots if v >= low}
    return {v for v in snapshots if v in keep}


@given(st.lists(st.integers(0, 6), min_size=1, max_size=30), st.booleans(),
       st.lists(st.tuples(st.booleans(), st.integers(0, 3)), max_size=40))
def test_updates_keep_what_the_rule_keeps(gates: list[int], keep_every: bool,
                                          steps: list[tuple[bool, int]]) -> None:
    needed = sorted(gates)  # forwards to come need versions in order
    versions = WeightVersions([torch.zeros(2, requires_grad=True)], version=0, needed=needed,
                              snapshots_only=False, keep_every=keep_every)
    reference = Counter(needed)
    forwards = 0
    for forward, lag in steps:
        if forward and forwards < len(needed) and needed[forwards] <= versions.version:
            # the next forward runs on the live weights, stashed, and no longer needs its gate
            gate = needed[forwards]
            forwards += 1
            reference[gate] -= 1
            versions.weights(versions.version, stash=True, gated=gate)
            continue
        before = set(versions.snapshots)
        in_flight = {max(0, versions.version - lag)}
        floor = max(0, versions.version - lag)
        versions.updated(in_flight=in_flight, floor=floor)
        if keep_every:
            before.add(versions.version)
        expected = kept_by_the_rule(before, version=versions.version, needed=reference,
                                    in_flight=in_flight, floor=floor, keep_every=keep_every)
        assert set(versions.snapshots) == expected
