"""Nothing dropped silently, in a real Chromium against a real server: every event a run page
gets carries the run's next number; an event the channel layer lost (here: a number taken and
its event never sent) shows as a skipped number, and the page asks for a fresh snapshot, which
holds what was lost."""

from __future__ import annotations

import pytest

from tests.browser.conftest import Server, Visit
from tests.browser.test_dashboard import LIVE_WITHIN_S
from tests.webapp.integration.stack import enrol, generated_testbed

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

# a fault stored and numbered, its event never sent: what a full channel-layer buffer does
LOST = """
from orchestrator.events import FaultEvent
from webapp.runs import events
from webapp.runs.models import Run
from webapp.runs.services import fault_events_store
fault_events_store(run=Run.objects.get(pk={run}), records=[FaultEvent(
    run={run}, at=0.0, kind="device_joined", device="lost-1", detail={{}})])
print(events.run_seq_next({run}))
"""


def test_a_page_that_misses_an_event_asks_for_a_snapshot_that_has_it(visit: Visit,
                                                                      server: Server):
    page = visit.page
    spec, devices = generated_testbed(seed=53, layers=13, devices=2)  # a model of its own
    spec_id, enrolled = enrol(server.api(), spec, devices)
    user = server.api()
    run = user.post("/api/runs/", {"name": "gaps", "model_spec": spec_id,
                                   "devices": [d["id"] for d in enrolled],
                                   "algorithms": ["ftpipehd"]}, expect=201)["id"]
    visit.login(server.password)
    visit.go(f"/runs/{run}/")
    page.wait_for_selector("#conn.live")
    page.wait_for_function("() => EdgePipe.runPage.state() !== null")
    assert page.evaluate("EdgePipe.runPage.gaps") == 0
    lost = int(server.manage_shell(LOST.format(run=run)).split()[-1])
    # Execute: the next event the page gets (planning) comes after the lost one
    user.post(f"/api/runs/{run}/plan/", {}, expect=202)
    # Assert: the page saw the gap, asked for a snapshot, and holds the lost fault
    page.wait_for_function(
        "lost => EdgePipe.runPage.gaps >= 1 && EdgePipe.runPage.state().seq > lost &&"
        " EdgePipe.runPage.state().faults.some(f => f.device === 'lost-1')",
        arg=lost, timeout=LIVE_WITHIN_S)
    assert page.evaluate("EdgePipe.runPage.snapshots") >= 2
