"""GET /api/runs/<id>/timeline/: a span of a run's timeline (default the whole run), its events
when few enough, else downsampled to at most max_bars per device and lane; a 400 names the bad
query parameter; session users only, as every run endpoint."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.webapp.factories import RunFactory
from webapp.runs.models import Run, TimelineEvent

pytestmark = pytest.mark.django_db


def store(run: Run, n: int, *, devices: tuple[str, ...] = ("a", "b"), period_s: float = 0.01
          ) -> None:
    """``n`` forward passes per device, one every period_s (busy half of it)."""
    TimelineEvent.objects.bulk_create(
        TimelineEvent(run=run, device=d, stage=k, kind="forward", microbatch=m, version=0,
                      start=m * period_s, end=m * period_s + period_s / 2)
        for k, d in enumerate(devices) for m in range(n))


def test_a_short_run_comes_back_whole_and_exact(api: APIClient):
    run = RunFactory(state=Run.State.RUNNING)
    store(run, 10)
    answer = api.get(f"/api/runs/{run.pk}/timeline/")
    assert answer.status_code == 200
    body = answer.json()
    assert (body["start_s"], body["end_s"], body["newest_s"]) == (0.0, 0.095, 0.095)
    assert body["exact"] and body["events_in_span"] == 20 and body["bars"] == []
    assert [(e["device"], e["microbatch"]) for e in body["events"]] == sorted(
        [(d, m) for d in "ab" for m in range(10)], key=lambda x: (x[1], x[0]))


def test_a_long_run_is_downsampled_and_covers_every_device_from_start_to_end(api: APIClient):
    run = RunFactory(state=Run.State.FINISHED)
    store(run, 6000)  # 12,000 events over 60 s
    answer = api.get(f"/api/runs/{run.pk}/timeline/", {"max_bars": 50})
    assert answer.status_code == 200
    body = answer.json()
    assert not body["exact"] and body["events"] == [] and body["events_in_span"] == 12_000
    assert body["bin_s"] == pytest.approx(body["end_s"] / 50)
    for device in "ab":
        bars = [b for b in body["bars"] if b["device"] == device]
        assert 1 <= len(bars) <= 50
        assert bars[0]["start"] == 0.0 and bars[-1]["end"] == pytest.approx(59.995)
        assert sum(b["count"] for b in bars) == 6000
        assert sum(b["busy_s"] for b in bars) == pytest.approx(30.0)
        assert (bars[0]["microbatches"][0], bars[-1]["microbatches"][1]) == (0, 5999)
        assert {b["lane"] for b in bars} == {"compute"} and {b["kind"] for b in bars} == {
            "forward"}


def test_a_window_comes_back_exact_with_only_its_events(api: APIClient):
    run = RunFactory(state=Run.State.FINISHED)
    store(run, 6000)
    answer = api.get(f"/api/runs/{run.pk}/timeline/", {"start": 10.0025, "end": 10.0975})
    body = answer.json()
    assert body["exact"] and (body["start_s"], body["end_s"]) == (10.0025, 10.0975)
    assert [e["microbatch"] for e in body["events"]] == [m for m in range(1000, 1010)
                                                         for _ in "ab"]


def test_max_events_decides_between_events_and_bars(api: APIClient):
    run = RunFactory(state=Run.State.RUNNING)
    store(run, 100)
    few = api.get(f"/api/runs/{run.pk}/timeline/", {"max_events": 200}).json()
    many = api.get(f"/api/runs/{run.pk}/timeline/", {"max_events": 199, "max_bars": 4}).json()
    assert few["exact"] and len(few["events"]) == 200
    assert not many["exact"] and len(many["bars"]) <= 2 * 4


def test_a_run_without_events_answers_an_empty_span(api: APIClient):
    run = RunFactory()
    body = api.get(f"/api/runs/{run.pk}/timeline/").json()
    assert body["newest_s"] is None and body["events"] == [] and body["events_in_span"] == 0


@pytest.mark.parametrize(("query", "field"), [
    ({"start": 5, "end": 5}, "end"),
    ({"start": 5, "end": 2}, "end"),
    ({"start": -1}, "start"),
    ({"end": "soon"}, "end"),
    ({"max_bars": 0}, "max_bars"),
    ({"max_bars": 100_000}, "max_bars"),
    ({"max_events": -1}, "max_events"),
])
def test_a_bad_query_is_a_400_naming_the_field(api: APIClient, query: dict, field: str):
    run = RunFactory()
    answer = api.get(f"/api/runs/{run.pk}/timeline/", query)
    assert answer.status_code == 400
    assert answer.json()["errors"][0]["field"] == field


def test_the_timeline_needs_a_session_and_a_run(api: APIClient, anon: APIClient):
    run = RunFactory()
    assert anon.get(f"/api/runs/{run.pk}/timeline/").status_code == 401
    assert api.get("/api/runs/999999/timeline/").status_code == 404
