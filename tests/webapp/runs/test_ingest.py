"""Taking in a run's events: what the web server does per batch, kept cheap without losing what
the page and the deduplication need."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache
from django.db import connection

from tests.webapp.factories import DeviceFactory, RunFactory
from webapp.runs.models import Run, RunDevice
from webapp.runs.services import ingest


class CountingCache:
    """The cache, with every add() counted."""

    def __init__(self) -> None:
        self.adds: list[str] = []

    def add(self, key: str, value: Any, timeout: float) -> bool:
        self.adds.append(key)
        return bool(cache.add(key, value, timeout=timeout))


def test_the_idle_breakdown_is_asked_for_once_an_interval_not_once_a_batch(
        monkeypatch: pytest.MonkeyPatch, settings: Any):
    # Prepare: a 2 s interval, this process's clock in our hands, the cache's adds counted
    settings.LIVE_IDLE_INTERVAL_S = 2.0
    run_id, key = 987_001, "idle-due:987001"
    cache.delete(key)
    monkeypatch.setattr(ingest, "_idle_asked", {})
    clock = [100.0]
    monkeypatch.setattr(ingest.time, "monotonic", lambda: clock[0])
    counting = CountingCache()
    monkeypatch.setattr(ingest, "cache", counting)
    # Execute / Assert: the first batch sets the mark: due
    assert ingest._idle_due(run_id)
    assert counting.adds == [key]
    # a batch within the interval is not due, and the cache is not asked
    clock[0] += 1.0
    assert not ingest._idle_due(run_id)
    assert len(counting.adds) == 1
    # once the interval has passed (and the mark expired), due again
    clock[0] += 1.5
    cache.delete(key)
    assert ingest._idle_due(run_id)
    assert len(counting.adds) == 2
    # another process set the mark: not due here, asked again a quarter interval later
    monkeypatch.setattr(ingest, "_idle_asked", {})
    assert not ingest._idle_due(run_id)
    clock[0] += 0.4
    assert not ingest._idle_due(run_id)
    assert len(counting.adds) == 3
    clock[0] += 0.2
    cache.delete(key)
    assert ingest._idle_due(run_id)
    assert len(counting.adds) == 4


def test_an_interval_of_zero_makes_every_batch_due(monkeypatch: pytest.MonkeyPatch,
                                                   settings: Any):
    settings.LIVE_IDLE_INTERVAL_S = 0.0
    monkeypatch.setattr(ingest, "_idle_asked", {})
    clock = [5.0]
    monkeypatch.setattr(ingest.time, "monotonic", lambda: clock[0])
    assert all(ingest._idle_due(987_002) for _ in range(3))


@pytest.mark.django_db
def test_the_member_lock_reads_the_newest_batch_stored_and_none_for_a_stranger():
    # Prepare: a running run of one device whose membership has stored batch 7 of a stream
    device, stranger = DeviceFactory(), DeviceFactory()
    run = RunFactory(devices=[device], state=Run.State.RUNNING)
    RunDevice.objects.filter(run=run, device=device).update(events_stream="s1", events_seq=7)
    member = RunDevice.objects.get(run=run, device=device)
    # Execute
    mark = ingest.run_member_lock(run=run, device=device)
    # Assert
    assert mark == ingest.EventsMark(pk=member.pk, events_stream="s1", events_seq=7)
    assert ingest.run_member_lock(run=run, device=stranger) is None


@pytest.mark.django_db
@pytest.mark.parametrize("table", ["runs_timelineevent", "runs_metricpoint"])
def test_the_event_tables_keep_no_index_of_the_run_alone_and_find_a_runs_rows_by_index(
        table: str):
    """Each row a training run stores updates every index of its table: the run's own index
    was one more beside the (run, time) ones that lead with it. Reading or deleting a run's
    rows must still go through an index, not a scan of every run's (SQLite's plan: the
    tests' database)."""
    assert connection.vendor == "sqlite"
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
        indexed = [c["columns"] for c in constraints.values() if c["index"]]
        assert ["run_id"] not in indexed
        assert any(columns[0] == "run_id" for columns in indexed)
        for sql in (f"SELECT * FROM {table} WHERE run_id = 1",
                    f"DELETE FROM {table} WHERE run_id IN (1, 2)"):
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            plan = " ".join(str(row[-1]) for row in cursor.fetchall())
            assert "USING INDEX" in plan or "USING COVERING INDEX" in plan, (sql, plan)
