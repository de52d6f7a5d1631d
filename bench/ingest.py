"""What an events batch's encoding costs the agent and the web server, per event: the timeline
events and metric points as JSON objects (the protocol's first form) against columns (what
agents send: orchestrator.eventcolumns).

    .venv/bin/python bench/ingest.py [--events 250] [--points 60] [--batches 400] [--repeats 5]

A batch like the ones a two-stage MLP's last agent flushes every 0.1 s (``--events`` timeline
events of four kinds, ``--points`` loss and accuracy points), timed in this process, one
thread, the two forms alternating ``--repeats`` times:

- agent: what the reporter and the connection do at a flush, from the TimelineEvent records
  and the stages' metrics to the text sent (building the ``events`` message, its JSON);
- server: what the gateway does before storing, from the text received to the records
  stored (reading the JSON and its depth, the message, each event and point).

The database's part (the inserts, the commit, the page's delta) is the same for both forms and
is not in these figures; bench/peer.py measures the whole web server while agents train.
Reports microseconds per event (timeline events and points together) of each side, the
median and spread over repeats, and the JSON's bytes per event. Prints a table and, last, one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.eventcolumns import (  # noqa: E402  (the path above makes them importable)
    metric_columns,
    parse_columns,
    parse_metric_columns,
    to_columns,
)
from orchestrator.events import TimelineEvent, parse_event  # noqa: E402
from orchestrator.protocol import Events, MetricSample, parse_agent_message  # noqa: E402
from orchestrator.protocol.fields import read_json_text  # noqa: E402

DEVICE, RUN = "edge-1", 7
FORMS = ("objects", "columns")
Point = tuple[float, str, str, float]


def workload(events: int, points: int) -> tuple[list[TimelineEvent], list[Point]]:
    """A last stage's flush: forwards, backwards, receives and sends on the run's clock, and
    a loss and an accuracy point per micro-batch."""
    rng = random.Random(1)
    timeline = []
    for i in range(events):
        kind = ("recv", "forward", "backward", "send")[i % 4]
        start = 12.0 + i * 3e-4 + rng.random() * 1e-5
        timeline.append(TimelineEvent(RUN, DEVICE, 1, kind, i // 4, i // 32, start,
                                      start + 1.5e-4, 16384 if kind in ("recv", "send") else 0))
    metrics = [(12.0 + i * 1e-3, ("loss", "accuracy")[i % 2], DEVICE, rng.random())
               for i in range(points)]
    return timeline, metrics


def encode(form: str, timeline: list[TimelineEvent], metrics: list[Point]) -> str:
    """The agent's flush: the events message's text."""
    if form == "objects":
        message = Events(run=RUN, timeline=tuple(e.to_json() for e in timeline),
                         metrics=tuple(MetricSample(at=a, kind=k, device=d, value=v).to_json()
                                       for a, k, d, v in metrics), stream="s", seq=1)
    else:
        message = Events(run=RUN, timeline_columns=to_columns(timeline),
                         metrics_columns=metric_columns(metrics), stream="s", seq=1)
    return json.dumps(message.to_json())


def ingest(text: str) -> tuple[list[TimelineEvent], list[dict[str, Any]]]:
    """The gateway's reading, up to the records it stores (either form)."""
    message = parse_agent_message(read_json_text(text))
    assert isinstance(message, Events)
    records = [parse_event(e) for e in message.timeline]
    if message.timeline_columns is not None:
        records += parse_columns(message.timeline_columns, run=RUN, device=DEVICE)
    read = MetricSample.reader()
    points = [read(p, f"metrics[{i}]").to_json() for i, p in enumerate(message.metrics)]
    if message.metrics_columns is not None:
        points += parse_metric_columns(message.metrics_columns)[0]
    return records, points


def per_event_us(run: Callable[[], Any], batches: int, events: int) -> float:
    begun = time.perf_counter()
    for _ in range(batches):
        run()
    return (time.perf_counter() - begun) / batches / events * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=250,
                        help="timeline events in a batch (default 250)")
    parser.add_argument("--points", type=int, default=60,
                        help="metric points in a batch (default 60)")
    parser.add_argument("--batches", type=int, default=400, help="batches per timing")
    parser.add_argument("--repeats", type=int, default=5, help="timings of each form")
    args = parser.parse_args(argv)
    if args.events < 1 or args.points < 0 or args.batches < 1 or args.repeats < 1:
        raise SystemExit("--events, --batches and --repeats must be at least 1, --points at "
                         "least 0")
    timeline, metrics = workload(args.events, args.points)
    count = args.events + args.points
    texts = {form: encode(form, timeline, metrics) for form in FORMS}
    for form, text in texts.items():  # both forms carry the same events
        assert ingest(text) == (timeline, ingest(texts["objects"])[1]), form
    timings: dict[str, dict[str, list[float]]] = {
        form: {"agent": [], "server": []} for form in FORMS}
    for _ in range(args.repeats):
        for form in FORMS:
            timings[form]["agent"].append(per_event_us(
                lambda f=form: encode(f, timeline, metrics), args.batches, count))
            timings[form]["server"].append(per_event_us(
                lambda f=form: ingest(texts[f]), args.batches, count))
    rows = {form: {side: {"median_us": statistics.median(got), "min_us": min(got),
                          "max_us": max(got)} for side, got in sides.items()}
            | {"bytes_per_event": len(texts[form].encode()) / count}
            for form, sides in timings.items()}
    print(f"{'form':8} {'agent us/event':>22} {'server us/event':>22} {'bytes/event':>12}")
    for form, row in rows.items():
        cells = [f"{row[side]['median_us']:.2f} ({row[side]['min_us']:.2f}-"
                 f"{row[side]['max_us']:.2f})" for side in ("agent", "server")]
        print(f"{form:8} {cells[0]:>22} {cells[1]:>22} {row['bytes_per_event']:>12.0f}")
    print(json.dumps({"bench": "ingest", "events": args.events, "points": args.points,
                      "batches": args.batches, "repeats": args.repeats, "forms": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
