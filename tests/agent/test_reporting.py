"""agent.reporting.Reporter: a send becomes a ``send`` event of the stage that sent it (found
once per run and tag, found again when that stage is replaced), and metrics become metric
samples at the flush, the non-finite ones left out; both go in columns, read back here as the
server reads them."""

from __future__ import annotations

from typing import Any

from agent.deployments import Deployment, Deployments
from agent.executor import Clock, Metric
from agent.reporting import Reporter
from agent.transport import SendRecord
from agent.wire import Header
from orchestrator.eventcolumns import parse_columns, parse_metric_columns
from orchestrator.protocol import Events, Message, StageSpec


def stage_spec(stage: int, generation: int = 0) -> StageSpec:
    return StageSpec.from_json({
        "run": 7, "device": "edge-a", "stage": stage, "layers": [stage, stage],
        "model": "mlp", "dataset": "digits", "batch_size": 8, "schedule": "1f1b",
        "stage_devices": [["edge-a"], ["edge-b"]] if stage == 0 else [["edge-b"], ["edge-a"]],
        "stage_times_s": [[1.0], [1.0]], "microbatches": 4, "generation": generation})


def deployment(stage: int, started_at: float, generation: int = 0) -> Deployment:
    executor: Any = object()  # the reporter reads the spec and the clock only
    return Deployment(spec=stage_spec(stage, generation), executor=executor,
                      clock=Clock(started_at=started_at))


def sent(microbatch: int, name: str, start: float) -> SendRecord:
    header = Header(run=7, kind="activation", microbatch=microbatch, version=0,
                    dtype="float32", shape=(2,), name=name)
    return SendRecord(peer="edge-b", header=header, nbytes=8, start=start, end=start + 0.5)


def timeline(batch: Events) -> list[dict[str, Any]]:
    """The batch's timeline events, read back from their columns as the server reads them."""
    if batch.timeline_columns is None:
        return []
    return [e.to_json() for e in parse_columns(batch.timeline_columns, run=batch.run,
                                               device="edge-a")]


def points(batch: Events) -> list[dict[str, Any]]:
    """The batch's metric points, read back from their columns as the server reads them."""
    if batch.metrics_columns is None:
        return []
    kept, refused = parse_metric_columns(batch.metrics_columns)
    assert not refused
    return kept


def flushed(reporter: Reporter, posted: list[Message]) -> Events:
    reporter.flush()
    [batch] = posted
    posted.clear()
    assert isinstance(batch, Events)
    return batch


def test_a_send_is_an_event_of_the_stage_that_sent_it_even_after_a_replacement() -> None:
    deployments = Deployments()
    first = deployment(0, started_at=100.0)
    deployments.add(first)
    posted: list[Message] = []
    reporter = Reporter(uid="edge-a", deployments=deployments, post=posted.append,
                        clock=lambda: 0.0)

    reporter.on_send(sent(0, "g0", start=101.0))
    reporter.on_send(sent(1, "g0:x", start=102.0))
    events = timeline(flushed(reporter, posted))
    assert [(e["kind"], e["stage"], e["microbatch"], e["start"]) for e in events] == [
        ("send", 0, 0, 1.0), ("send", 0, 1, 2.0)]

    # the stage is replaced under the same key (same tag): the new one's clock counts
    deployments.remove(first)
    deployments.add(deployment(0, started_at=200.0))
    reporter.on_send(sent(2, "g0", start=201.0))
    assert [e["start"] for e in timeline(flushed(reporter, posted))] == [1.0]

    # a name that is no stage's tag goes to the run's first stage here, and is not kept
    reporter.on_send(sent(3, "chain:7", start=203.0))
    assert [e["microbatch"] for e in timeline(flushed(reporter, posted))] == [3]

    # a run no longer held here: nothing
    deployments.remove(deployments.of_run(7)[0])
    reporter.on_send(sent(4, "g0", start=204.0))
    reporter.flush()
    assert posted == []


def test_metrics_become_samples_at_the_flush_without_the_non_finite_ones() -> None:
    deployments = Deployments()
    deployments.add(deployment(1, started_at=100.0))
    posted: list[Message] = []
    reporter = Reporter(uid="edge-a", deployments=deployments, post=posted.append,
                        clock=lambda: 0.0)
    reporter.metric(7, Metric("loss", 2.5, 3, 1.25))
    reporter.metric(7, Metric("loss", float("nan"), 4, 1.5))
    reporter.metric(7, Metric("accuracy", 0.5, 3, float("inf")))
    samples = points(flushed(reporter, posted))
    assert [(s["kind"], s["value"], s["at"], s["device"]) for s in samples] == [
        ("loss", 2.5, 1.25, "edge-a")]


def test_a_backlog_goes_to_the_server_in_messages_it_accepts() -> None:
    # kept while the web server restarted, 50,000 events went as one message of several MiB:
    # the server (1 MiB a WebSocket message) closed the connection at every reconnect
    import json

    from agent.reporting import MAX_EVENTS_PER_MESSAGE
    from orchestrator.events import TimelineEvent

    deployments = Deployments()
    deployments.add(deployment(0, started_at=100.0))
    posted: list[Message] = []
    reporter = Reporter(uid="edge-a", deployments=deployments, post=posted.append,
                        clock=lambda: 0.0)
    for m in range(5 * MAX_EVENTS_PER_MESSAGE + 7):
        reporter.event(TimelineEvent(7, "edge-a", 0, "forward", m, 0, m * 1e-3,
                                     m * 1e-3 + 5e-4))
        reporter.metric(7, Metric("loss", value=1.0 / (m + 1), microbatch=m, at=m * 1e-3))
    reporter.flush()
    assert len(posted) == 6 and all(isinstance(p, Events) for p in posted)
    batches = [p for p in posted if isinstance(p, Events)]
    assert [e["microbatch"] for b in batches for e in timeline(b)] == list(
        range(5 * MAX_EVENTS_PER_MESSAGE + 7))  # every one, in order
    assert sum(len(points(b)) for b in batches) == 5 * MAX_EVENTS_PER_MESSAGE + 7
    assert max(len(json.dumps(b.to_json())) for b in batches) < 2**20
