"""The live Gantt keeps the whole run, in a real Chromium against a real server: a stored run of
21,000 timeline events, of which the page's window holds the newest 4,000; zoomed into an early
window, the page fetches that window's events and draws each of its micro-batches' bars;
zoomed out, it draws the overview of the whole run, every event merged into some bar.
Screenshots in tests/artifacts/."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import ARTIFACTS, Server, Visit
from tests.browser.test_dashboard import LIVE_WITHIN_S
from tests.webapp.integration.stack import enrol, generated_testbed

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

MICROBATCHES = 3500  # per device, a forward and a backward each: 21,000 events on 3 devices
PERIOD_S = 0.05  # a micro-batch every 50 ms: the run lasts 175 s
STAGE_LAG_S = 0.005

# the run's events, stored as the agents' reports would have stored them (bulk: a test of the
# page, not of the ingest), and the run marked finished
STORE = """
from webapp.runs.models import Run, TimelineEvent
uids = {uids!r}
rows = []
for k, uid in enumerate(uids):
    for m in range({n}):
        t = m * {period} + k * {lag}
        rows.append(TimelineEvent(run_id={run}, device=uid, stage=k, kind="forward",
                                  microbatch=m, version=0, start=t, end=t + 0.02))
        rows.append(TimelineEvent(run_id={run}, device=uid, stage=k, kind="backward",
                                  microbatch=m, version=0, start=t + 0.025, end=t + 0.045))
TimelineEvent.objects.bulk_create(rows, batch_size=5000)
Run.objects.filter(pk={run}).update(state="finished")
"""

# the bars drawn of exact events: [device, kind, micro-batch, start] once each (the Gantt's
# canvas layer: EdgePipe.runPage.ganttItems, what its last frame drew)
DRAWN_EVENTS = """() => {
  const seen = new Set(), out = [];
  for (const e of EdgePipe.runPage.ganttItems('events')) {
    const key = [e.device, e.kind, e.microbatch, e.start].join();
    if (!seen.has(key)) { seen.add(key); out.push([e.device, e.kind, e.microbatch, e.start]); }
  }
  return out;
}"""
# the merged bars drawn, per device: [first start, last end, events merged]
DRAWN_BARS = """() => {
  const out = {};
  for (const b of EdgePipe.runPage.ganttItems('bars')) {
    const d = out[b.device] || (out[b.device] = [Infinity, -Infinity, 0]);
    d[0] = Math.min(d[0], b.start); d[1] = Math.max(d[1], b.end); d[2] += b.count;
  }
  return out;
}"""


def stored_run(server: Server) -> tuple[int, list[str]]:
    spec, devices = generated_testbed(seed=43, layers=11, devices=3)  # a model of its own
    spec_id, enrolled = enrol(server.api(), spec, devices)
    run = server.api().post("/api/runs/", {
        "name": "long run", "model_spec": spec_id, "devices": [d["id"] for d in enrolled],
        "algorithms": ["ftpipehd"], "microbatches": 4}, expect=201)["id"]
    uids = [d["uid"] for d in enrolled]
    server.manage_shell(STORE.format(uids=uids, n=MICROBATCHES, period=PERIOD_S,
                                     lag=STAGE_LAG_S, run=run))
    return run, uids


def gantt(page: Any) -> dict[str, Any]:
    return page.evaluate("(() => { const g = EdgePipe.runPage.gantt(); return {mode: g.mode,"
                         " source: g.source, exact: g.exact, range: g.range}; })()")


def test_zooming_into_a_past_window_draws_its_bars_and_zooming_out_the_whole_run(
        visit: Visit, server: Server):
    page = visit.page
    run, uids = stored_run(server)
    visit.login(server.password)
    visit.go(f"/runs/{run}/")
    page.wait_for_function("() => EdgePipe.runPage.state() && EdgePipe.runPage.gantt().range",
                           timeout=LIVE_WITHIN_S)
    # the page's window holds the newest events only: nothing of the first minutes
    held_from = page.evaluate("Math.min(...EdgePipe.runPage.state().timeline.map(e => e.end))")
    assert held_from > 60.0
    assert gantt(page)["mode"] == "follow"
    page.locator("#gantt").scroll_into_view_if_needed()

    # Execute: zoom into 10.0-10.5 s (what dragging a box across the Gantt does)
    page.evaluate("Plotly.relayout('gantt', {'xaxis.range[0]': 10.0, 'xaxis.range[1]': 10.5})")
    page.wait_for_function("() => { const g = EdgePipe.runPage.gantt();"
                           " return g.mode === 'range' && g.source === 'detail' && g.exact; }",
                           timeout=LIVE_WITHIN_S)

    # Assert: each micro-batch of the window, forward and backward on every device, is a bar
    drawn = {(d, kind, m): start for d, kind, m, start in page.evaluate(DRAWN_EVENTS)}
    for k, uid in enumerate(uids):
        for m in range(201, 209):  # wholly inside 10.0-10.5 s on every stage
            start = m * PERIOD_S + k * STAGE_LAG_S
            assert drawn[(uid, "forward", m)] == pytest.approx(start)
            assert drawn[(uid, "backward", m)] == pytest.approx(start + 0.025)
    assert page.evaluate("document.getElementById('gantt').layout.xaxis.range") == [10.0, 10.5]
    box = page.locator("#gantt").bounding_box()
    assert box is not None
    page.screenshot(path=str(ARTIFACTS / "gantt-past-window.png"), clip=box)

    # Execute: zoom out (a double-click on the plot)
    page.locator("#gantt .nsewdrag").first.dblclick()
    page.wait_for_function("() => { const g = EdgePipe.runPage.gantt();"
                           " return g.mode === 'overview' && g.source === 'overview'; }",
                           timeout=LIVE_WITHIN_S)

    # Assert: the overview covers the whole run, every device from its first event to its
    # last, every event merged into a bar
    view = gantt(page)
    assert not view["exact"] and view["range"][0] == 0.0
    last_end = (MICROBATCHES - 1) * PERIOD_S + 0.045
    assert view["range"][1] >= last_end + 2 * STAGE_LAG_S - 1e-6
    bars = page.evaluate(DRAWN_BARS)
    assert set(bars) == set(uids)
    for k, uid in enumerate(uids):
        first, last, count = bars[uid]
        assert first == pytest.approx(k * STAGE_LAG_S)
        assert last == pytest.approx(last_end + k * STAGE_LAG_S)
        assert count == 2 * MICROBATCHES
    page.screenshot(path=str(ARTIFACTS / "gantt-overview.png"), clip=box)

    # Execute: back to the live tail
    page.click("#follow")
    page.wait_for_function("() => EdgePipe.runPage.gantt().mode === 'follow'",
                           timeout=LIVE_WITHIN_S)
    assert gantt(page)["source"] == "live"
