"""bench/live.py's probes: the web server's stamps each timeline delta of a commit, and wraps
the function that sends a commit's deltas with the arguments that function takes (when
``_group_send`` came to take a commit's deltas as a list, the probe still took one delta, and
every events batch failed with AttributeError in the bench's server); the agents' finds the
events of a batch in columns (as objects only, it found none once agents sent columns, and
the breakdown by stage came out empty)."""

from __future__ import annotations

import inspect

from bench.live import batch_keys, stamp_parts
from orchestrator.eventcolumns import to_columns
from orchestrator.events import TimelineEvent
from webapp.runs import events


def test_only_a_batch_s_timeline_deltas_are_stamped() -> None:
    parts = [{"type": "timeline", "events": [], "seq": 4}, {"type": "idle", "seq": 5}]
    stamped = stamp_parts(parts, 10.0, 10.5)
    assert stamped[0] == {**parts[0], "bench": {"store": 10.0, "commit": 10.5}}
    assert stamped[1] == parts[1]
    assert stamp_parts(parts, None, 10.5) == parts  # not a batch's commit


def test_the_probe_wraps_the_deltas_sender_as_it_is_called() -> None:
    assert list(inspect.signature(events._group_send).parameters) == ["run_id", "parts"]


def test_a_batch_s_events_are_found_as_objects_and_in_columns() -> None:
    events = [TimelineEvent(1, "edge-a", 0, "forward", m, 0, 0.1 * m, 0.1 * m + 0.05)
              for m in (3, 4)]
    in_columns = {"type": "events", "run": 1, "timeline_columns": to_columns(events)}
    as_objects = {"type": "events", "run": 1, "timeline": [e.to_json() for e in events]}
    assert batch_keys(in_columns, "edge-a") == ["edge-a:3", "edge-a:4"]
    assert batch_keys(as_objects, "edge-a") == ["edge-a:3", "edge-a:4"]
