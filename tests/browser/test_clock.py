"""One run clock per page, in a real Chromium against a real server: a run trains 190 s, fails,
is planned again and started again; the agents time the second attempt's events from the run's
``started_at`` as the server hands it to them, and the page's Gantt, its fault marks, its
events table and its throughput chart then all read one clock, the second attempt after the
first (before, the second attempt restarted at 0 s: its Gantt was off the page's window while
the events table read 17 s beside a Gantt at 135-190 s)."""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Any

import pytest

from tests.browser.conftest import ARTIFACTS, Server, Visit
from tests.browser.test_dashboard import LIVE_WITHIN_S, agent_client
from tests.browser.test_faults import starting_run, trained
from tests.webapp.integration.stack import enrol, generated_testbed

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

FIRST_ATTEMPT_S = 190.0

# the first attempt: it ran 200 s ago and trained until 190 s (its events as its agents would
# have stored them), then a stage failed
FIRST_ATTEMPT = """
from datetime import timedelta
from django.db import transaction
from django.utils import timezone
from webapp.runs.models import Run, TimelineEvent
from webapp.runs.services.control import fail_run, lock_run
Run.objects.filter(pk={run}).update(state="running",
                                    started_at=timezone.now() - timedelta(seconds=200))
TimelineEvent.objects.bulk_create(
    TimelineEvent(run_id={run}, device=uid, stage=k, kind="forward", microbatch=m, version=0,
                  start=0.5 * m, end=0.5 * m + 0.2)
    for k, uid in enumerate({uids!r}) for m in range(int({end} / 0.5)))
with transaction.atomic():
    fail_run(lock_run(Run.objects.get(pk={run})), "a stage ran out of memory")
"""
# started again: every stage deployed and ready (what the agents' acks do; their connection,
# as their hello would have said it)
START_AGAIN = """
from webapp.devices.models import Device
from webapp.runs import services
from webapp.runs.models import Run, RunDevice
Device.objects.filter(run_devices__run_id={run}).update(
    status="online", control_channel="x", data_address="tcp://127.0.0.1:9", data_key="k" * 40)
services.run_start(run=Run.objects.get(pk={run}))
for rd in RunDevice.objects.filter(run_id={run}, stage__isnull=False).select_related("device"):
    services.run_stage_ready(run=Run.objects.get(pk={run}), device=rd.device)
run = Run.objects.get(pk={run})
print(run.error)
print(run.state)
"""


def test_a_run_started_again_reads_one_clock_across_the_page(visit: Visit, server: Server):
    page = visit.page
    spec, devices = generated_testbed(seed=47, layers=12, devices=3)  # a model of its own
    spec_id, enrolled = enrol(server.api(), spec, devices)
    keys = {d["uid"]: d["authorization"] for d in enrolled}
    run, uids = starting_run(server, spec_id, enrolled, "started again")
    server.manage_shell(FIRST_ATTEMPT.format(run=run, uids=uids, end=FIRST_ATTEMPT_S))
    user = server.api()
    user.post(f"/api/runs/{run}/plan/", {}, expect=202)
    user.wait_run(run, ("planned",), timeout=120)
    said = server.manage_shell(START_AGAIN.format(run=run))
    assert said.split()[-1] == "running", said

    visit.login(server.password)
    visit.go(f"/runs/{run}/")
    page.wait_for_selector("#conn.live")
    # the second attempt's agents: their clock is the run's, from its started_at
    started_at = datetime.fromisoformat(user.get(f"/api/runs/{run}/")["started_at"])
    now_s = time.time() - started_at.timestamp()
    agent = agent_client(server)
    starts = [now_s + 0.5 * k for k in range(6)]
    for k, uid in enumerate(uids[:2]):
        body: dict[str, Any] = {"timeline": trained(run, uid, k, starts)}
        if k == 1:  # the last stage reports the throughput
            body["metrics"] = [{"at": now_s + 2.0, "kind": "throughput_sps", "value": 64.0}]
        stored = agent.post(f"/api/agent/runs/{run}/events/", json=body,
                            headers={"Authorization": keys[uid]})
        assert stored.status_code == 201, stored.text

    # the Gantt draws the second attempt's bars
    page.wait_for_function(
        "start => EdgePipe.runPage.ganttItems && EdgePipe.runPage.ganttItems('events')"
        ".some(e => e.kind === 'forward' && Math.abs(e.start - start) < 1e-6)",
        arg=starts[0], timeout=LIVE_WITHIN_S)
    gantt = page.evaluate("document.getElementById('gantt').layout.xaxis.range")
    marks = page.evaluate("document.getElementById('gantt').layout.shapes"
                          ".filter(s => s.type === 'line' && s.xref !== 'paper').map(s => s.x0)")
    # the events table: its newest row is the new start, on the same clock, after the failure
    rows = page.locator("#faults tr")
    first_row = rows.nth(0).inner_text()
    assert "run started" in first_row
    restarted_at = float(re.search(r"([\d.]+) s", first_row).group(1))
    failed = next(rows.nth(i).inner_text() for i in range(rows.count())
                  if "run failed" in rows.nth(i).inner_text())
    failed_at = float(re.search(r"([\d.]+) s", failed).group(1))
    assert FIRST_ATTEMPT_S <= failed_at <= restarted_at <= starts[0]
    # the Gantt's window holds the new start and its mark; the throughput chart the same clock
    assert gantt[0] <= restarted_at <= gantt[1]
    assert any(abs(x - restarted_at) < 1e-3 for x in marks)
    page.wait_for_selector("#throughput .main-svg", timeout=LIVE_WITHIN_S)
    throughput = page.evaluate("document.getElementById('throughput').data"
                               ".filter(t => t.name.startsWith('samples/s')).map(t => t.x).flat()")
    assert throughput == [pytest.approx(now_s + 2.0)]
    assert gantt[0] <= throughput[0] <= gantt[1]
    box = page.locator("#gantt").bounding_box()
    assert box is not None
    page.screenshot(path=str(ARTIFACTS / "gantt-started-again.png"), clip=box)
