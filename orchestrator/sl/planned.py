"""A split-learning schedule as the timeline agents record, and a trained run's batches read
back from theirs: what the run page draws as ghost bars and sets against the plan.

:func:`batch_events` is one batch of the schedule as timeline events (seconds from the batch's
start): on client j (pipeline j), part-1's forward over its release time ``r`` (the cut-1
upload included), part-3's forward and loss over ``l`` once the helper's forward of j ends,
part-3's backward over ``l'``, part-1's backward over ``r'`` once the helper's backward ends;
on the helper, each segment of its forward and backward tasks. :func:`measured_makespans`
is each trained batch's makespan, from its first part-1 forward start to its last part-1
backward end over the clients (the paper's completion time of the batch's last client).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.events import TimelineEvent
from orchestrator.sl.formats import Instance, Schedule


def batch_events(*, instance: Instance, schedule: Schedule, clients: Sequence[str],
                 helpers: Sequence[str], run: int = 0, microbatch: int = 0
                 ) -> tuple[TimelineEvent, ...]:
    """One batch of ``schedule`` as timeline events, in seconds from the batch's start."""
    if len(clients) != instance.clients or len(helpers) != instance.helpers:
        raise ValueError(f"clients and helpers: the instance has {instance.clients} clients "
                         f"and {instance.helpers} helpers, got {len(clients)} and "
                         f"{len(helpers)}")
    slot = instance.slot_ms / 1000.0
    events = []

    def add(device: str, stage: int, kind: str, j: int, a: float, b: float) -> None:
        if b > a:
            events.append(TimelineEvent(run, device, stage, kind, microbatch, 0, a * slot,
                                        b * slot, pipeline=j))

    for kind, segments in (("forward", schedule.forward), ("backward", schedule.backward)):
        for s in segments:
            add(helpers[s.helper], 1, kind, s.client, s.start, s.end)
    for j, client in enumerate(clients):
        i = schedule.assignment[j]
        forward_end = max(s.end for s in schedule.forward if s.client == j)
        backward_end = max(s.end for s in schedule.backward if s.client == j)
        loss_end = forward_end + instance.l[j][i]
        add(client, 0, "forward", j, 0, instance.r[j][i])
        add(client, 2, "forward", j, forward_end, loss_end)
        add(client, 2, "backward", j, loss_end, loss_end + instance.lp[j][i])
        add(client, 0, "backward", j, backward_end, backward_end + instance.rp[j][i])
    return tuple(sorted(events, key=lambda e: (e.start, e.end, e.device, e.pipeline)))
