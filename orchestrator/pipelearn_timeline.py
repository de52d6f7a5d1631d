"""PipeLearn's planned timeline in the shared event schema (docs/architecture.md, "Timeline
events"), for the dashboard's Gantt chart.

Zhang et al., "PipeLearn" (Figure 3): each iteration of each client is scheduled as soon as
Table I allows (:func:`orchestrator.pipelearn.asap_schedule`), iterations follow each other on a
client, and after the last one comes the epoch's aggregation. Rows:

- a client: ``device`` = its id, ``stage`` 0: ``forward`` and ``backward`` of its micro-batches,
  ``send`` of each activation (and of its model at aggregation), ``recv`` of each gradient (and
  of the aggregated model);
- a server-side replica: ``device`` = the server's id, ``stage`` = 1 + the client's index among
  the clients: ``recv`` of each activation, ``forward``, ``backward``, ``send`` of the gradient,
  ``recv``/``send`` of the client's model;
- the server's FedAvg: ``device`` = the server, ``stage`` 0, one ``aggregate`` of zero length.

``microbatch`` counts a client's micro-batches from 0 across iterations, ``version`` is the
iteration (the weight version a micro-batch is computed with); at aggregation both are the
client's last. A ``recv`` lasts as its ``send``, shifted by the link's latency. Stages of zero
time (the server stages and transfers of federated learning) are omitted.
"""

from __future__ import annotations

from orchestrator.events import TimelineEvent
from orchestrator.pipelearn import STAGES
from orchestrator.pipelearn import asap_schedule as _asap
from orchestrator.pipelearn_plan import DevicePlan, MethodPlan

_COMPUTE = {"device_forward": "forward", "device_backward": "backward",
            "server_forward": "forward", "server_backward": "backward"}


Row = tuple[str, int]


def _transfer(run: int, sender: Row, receiver: Row, *, microbatch: int, version: int,
              start: float, end: float, latency_s: float, size: int) -> list[TimelineEvent]:
    """A ``send`` on the sender's row and the matching ``recv``, ``latency_s`` later."""
    return [TimelineEvent(run, *sender, "send", microbatch, version, start, end, size),
            TimelineEvent(run, *receiver, "recv", microbatch, version, start + latency_s,
                          end + latency_s, size)]


def _iteration_events(plan: DevicePlan, *, run: int, server: str, replica: int,
                      iteration: int, offset_s: float) -> list[TimelineEvent]:
    n = plan.parallel_batches
    sched = _asap(stages=plan.stages, parallel_batches=n)
    client: Row = (plan.device, 0)
    host: Row = (server, replica)
    size = round(plan.activation_bytes / n)
    out: list[TimelineEvent] = []
    for stage in STAGES:
        if plan.stages.of(stage) <= 0:
            continue
        for i in range(n):
            start, end = (t + offset_s for t in sched[(stage, i)])
            mb = iteration * n + i
            if stage in _COMPUTE:
                row = host if stage.startswith("server") else client
                out.append(TimelineEvent(run, *row, _COMPUTE[stage], mb, iteration, start, end))
            else:
                ends = (client, host) if stage == "upload" else (host, client)
                out += _transfer(run, *ends, microbatch=mb, version=iteration, start=start,
                                 end=end, latency_s=plan.stages.latency_s, size=size)
    return out


def timeline(*, method: MethodPlan, iterations: int | None = None,
             run: int = 0) -> tuple[TimelineEvent, ...]:
    """The events of one epoch of ``method`` cut to its first ``iterations`` iterations (all by
    default) and its aggregation, sorted by start time."""
    setting = method.setting
    iters = setting.iterations if iterations is None else iterations
    if iters < 1:
        raise ValueError(f"iterations must be at least 1, got {iters}")
    server = setting.server
    events: list[TimelineEvent] = []
    arrivals = []
    for k, plan in enumerate(method.devices):
        for j in range(iters):
            events += _iteration_events(plan, run=run, server=server, replica=1 + k,
                                        iteration=j, offset_s=j * plan.iteration_s)
        arrivals.append(iters * plan.iteration_s + plan.model_up_s + plan.latency_s)
    at = max(arrivals)
    for k, plan in enumerate(method.devices):
        client, host = (plan.device, 0), (server, 1 + k)
        last, size, lam = iters * plan.parallel_batches - 1, round(plan.model_bytes), plan.latency_s
        up = iters * plan.iteration_s
        events += _transfer(run, client, host, microbatch=last, version=iters - 1, start=up,
                            end=up + plan.model_up_s, latency_s=lam, size=size)
        events += _transfer(run, host, client, microbatch=last, version=iters - 1, start=at,
                            end=at + plan.model_down_s, latency_s=lam, size=size)
    events.append(TimelineEvent(run, server, 0, "aggregate", 0, iters - 1, at, at, 0))
    return tuple(sorted(events, key=lambda e: (e.start, e.end, e.device, e.stage)))
