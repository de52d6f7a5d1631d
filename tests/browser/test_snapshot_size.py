"""A busy run's page still connects, in a real Chromium against a real daphne: a minute of a fast
model made 4,000 timeline events and 9,000 metric points, a 1.7 MB snapshot that daphne refused
to send (its WebSocket messages stop at 1 MiB): the page's socket closed with 1011 each time it
connected, a minute into the demo. The snapshot now keeps the newest 3,000 events and 2,000
points (and halves those while it is still too large), and the page draws them."""

from __future__ import annotations

import pytest

from tests.browser.conftest import Server, Visit
from tests.browser.test_dashboard import LIVE_WITHIN_S
from tests.webapp.integration.stack import enrol, generated_testbed

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

# a minute of a fast run, stored as the agents' reports would have stored it
STORE = """
from webapp.runs.models import MetricPoint, Run, TimelineEvent
uids = {uids!r}
rows, points = [], []
for k, uid in enumerate(uids):
    for m in range(2000):
        t = m * 0.03 + k * 0.005
        rows.append(TimelineEvent(run_id={run}, device=uid, stage=k, kind="forward",
                                  microbatch=m, version=0, start=t, end=t + 0.01))
        rows.append(TimelineEvent(run_id={run}, device=uid, stage=k, kind="backward",
                                  microbatch=m, version=0, start=t + 0.012, end=t + 0.025))
for m in range(9000):
    points.append(MetricPoint(run_id={run}, at=m * 0.006, kind="loss" if m % 2 else "accuracy",
                              device=uids[-1], value=1.0 / (1 + m)))
TimelineEvent.objects.bulk_create(rows, batch_size=5000)
MetricPoint.objects.bulk_create(points, batch_size=5000)
Run.objects.filter(pk={run}).update(state="running")
"""


def test_a_busy_minute_of_a_run_reaches_its_page(visit: Visit, server: Server):
    # Prepare: 12,000 timeline events and 9,000 metric points in the last minute
    spec, devices = generated_testbed(seed=47, layers=14, devices=3)  # a model of its own
    spec_id, enrolled = enrol(server.api(), spec, devices)
    run = server.api().post("/api/runs/", {
        "name": "busy minute", "model_spec": spec_id, "devices": [d["id"] for d in enrolled],
        "algorithms": ["ftpipehd"], "microbatches": 4}, expect=201)["id"]
    server.manage_shell(STORE.format(uids=[d["uid"] for d in enrolled], run=run))

    # Execute
    visit.login(server.password)
    visit.go(f"/runs/{run}/")

    # Assert: the snapshot arrived, with the newest rows, and the charts drew them
    page = visit.page
    page.wait_for_function("() => EdgePipe.runPage.state() &&"
                           " document.getElementById('gantt').data", timeout=LIVE_WITHIN_S)
    held = page.evaluate("(() => { const s = EdgePipe.runPage.state(); return {"
                         " timeline: s.timeline.length, metrics: s.metrics.length,"
                         " timeline_limit: s.timeline_limit, metrics_limit: s.metrics_limit,"
                         " newest_point: Math.max(...s.metrics.map(p => p.at)) }; })()")
    assert held["timeline"] == held["timeline_limit"] == 3000
    assert held["metrics"] == held["metrics_limit"] == 2000
    assert held["newest_point"] == pytest.approx(8999 * 0.006)
    page.wait_for_function("() => !document.getElementById('training').hidden",
                           timeout=LIVE_WITHIN_S)
    assert page.evaluate("EdgePipe.runPage.snapshots") == 1  # no reconnecting
