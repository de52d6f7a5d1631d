"""What this agent's stages produce, batched for the server: timeline events and metric points
kept per run as they happen (from the stages' threads and the data plane's), and moved into
the connection's outbox as one ``events`` message per run at each flush (in columns:
orchestrator.eventcolumns), with the rates measured over each second (samples per
second through the last stage, bytes per second sent)."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable

from agent.deployments import Deployment, Deployments
from agent.executor import Metric
from agent.transport import SendRecord
from orchestrator.eventcolumns import metric_columns, to_columns
from orchestrator.events import TimelineEvent
from orchestrator.protocol import Events, Message, MetricSample

log = logging.getLogger("edgepipe.agent")

RATE_WINDOW_S = 1.0
# timeline events (and metric points) in one events message: a metric point takes about 200
# bytes as JSON, an event in columns about 50, so a message stays well under the 1 MiB the web
# server takes in one WebSocket message
MAX_EVENTS_PER_MESSAGE = 2000


class Reporter:
    def __init__(self, *, uid: str, deployments: Deployments, post: Callable[[Message], None],
                 clock: Callable[[], float]) -> None:
        """``post`` puts a message in the connection's outbox; ``clock`` is the server's."""
        self.uid = uid
        self.deployments = deployments
        self.post = post
        self.clock = clock
        self._lock = threading.Lock()  # the stages take it for every event: held briefly
        self._flushing = threading.Lock()  # one flush at a time: batches keep their order
        self._timeline: dict[int, list[TimelineEvent]] = {}
        # the stages' metrics as they report them, put in columns at the flush, off the
        # stages' threads (the server reads each point as a MetricSample)
        self._metrics: dict[int, list[Metric]] = {}
        # the deployment each (run, message tag) was last sent for: on_send runs for every
        # message a stage sends, on the stage's thread
        self._senders: dict[tuple[int, str], Deployment] = {}
        self._windows: dict[int, tuple[float, int, int]] = {}  # run: (since, samples, bytes)

    def event(self, event: TimelineEvent) -> None:
        with self._lock:
            self._timeline.setdefault(event.run, []).append(event)

    def metric(self, run: int, metric: Metric) -> None:
        if not (math.isfinite(metric.value) and math.isfinite(metric.at)):
            log.debug("run %s: %s is %s, not sent", run, metric.name, metric.value)
            return  # not JSON (a diverged loss shows as the last finite one)
        with self._lock:
            self._metrics.setdefault(run, []).append(metric)

    def on_send(self, record: SendRecord) -> None:
        """The data plane finished a send: a ``send`` event of the run's stage here."""
        run = record.header.run
        # a message's name starts with its stage's tag (generation and pipeline: one stage
        # of each pipeline of a run per device); else the run's first stage here
        tag = (record.header.name or "").split(":", 1)[0]
        deployment = self._senders.get((run, tag))
        if deployment is None or self.deployments.get(deployment.key) is not deployment:
            held = self.deployments.of_run(run)
            if not held:
                return
            deployment = next((d for d in held if d.spec.tag == tag), None)
            if deployment is None:  # not a stage's tag: the run's first stage, not kept
                deployment = held[0]
            else:
                self._senders[(run, tag)] = deployment
        started = deployment.clock.started_at
        self.event(TimelineEvent(run, self.uid, deployment.spec.stage, "send",
                                 record.header.microbatch, record.header.version,
                                 record.start - started, record.end - started, record.nbytes,
                                 pipeline=deployment.spec.pipeline))

    def flush(self) -> None:
        """Move what the stages produced into the outbox, one message per run."""
        with self._flushing:
            now = self.clock()
            with self._lock:
                taken = [(run, self._timeline.pop(run, []), self._metrics.pop(run, []))
                         for run in sorted(set(self._timeline) | set(self._metrics))]
            for run, timeline, reported in taken:
                metrics = [(m.at, m.name, self.uid, m.value) for m in reported]
                metrics += [(p.at, p.kind, p.device, p.value)
                            for p in self._rates(run, timeline, now)]
                # a backlog (kept while the server was away) goes in messages of a bounded
                # size: as one, it exceeded the server's 1 MiB a WebSocket message and the
                # server closed the connection at each reconnect until the run was lost
                for first in range(0, max(len(timeline), len(metrics)), MAX_EVENTS_PER_MESSAGE):
                    last = first + MAX_EVENTS_PER_MESSAGE
                    events, points = timeline[first:last], metrics[first:last]
                    self.post(Events(
                        run=run, timeline_columns=to_columns(events) if events else None,
                        metrics_columns=metric_columns(points) if points else None))

    def _rates(self, run: int, timeline: list[TimelineEvent], now: float
               ) -> list[MetricSample]:
        """Samples per second through the last stage and bytes per second sent, each second."""
        held = self.deployments.of_run(run)
        if not held:
            self._windows.pop(run, None)
            return []
        since, samples, sent = self._windows.get(run, (now, 0, 0))
        last = next((d for d in held if d.spec.last), None)
        if last is not None:
            samples += sum(last.spec.batch_size for e in timeline if e.kind == "backward")
        sent += sum(e.bytes for e in timeline if e.kind == "send")
        if now - since < RATE_WINDOW_S:
            self._windows[run] = (since, samples, sent)
            return []
        self._windows[run] = (now, 0, 0)
        at = held[0].clock.now()
        out = [MetricSample(at=at, kind="network_bps", device=self.uid,
                            value=sent / (now - since))]
        if last is not None:  # a replica of the last stage: its own share, by device
            out.append(MetricSample(at=at, kind="throughput_sps",
                                    device=self.uid if last.spec.replicated else "",
                                    value=samples / (now - since)))
        return out
