"""The live Gantt keeps every event of a run, in a real Chromium against a real server: a page
open from a run's start gets 21,000 timeline events (forward, send, receive, backward and update
on three devices) as the agents report them, one of its deltas lost on the way (what a full
channel-layer buffer does: the page sees a number skipped, asks for a fresh snapshot, which holds
only the newest events, and fetches what it missed from the timeline API); the page's event
store then holds exactly the run's events in the database, and a window of the run's first
seconds is drawn from it, every event a bar."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.browser.conftest import Server, Visit
from tests.browser.test_dashboard import LIVE_WITHIN_S, agent_client
from tests.browser.test_faults import starting_run
from tests.webapp.integration.stack import enrol, generated_testbed

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

MICROBATCHES = 1400  # per device, five events each: 21,000 events on 3 devices
PER_POST = 100  # micro-batches a device reports at a time (500 events: a delta each)
PERIOD_S = 0.05
KINDS = (("forward", 0.0, 0.01), ("send", 0.011, 0.013), ("recv", 0.014, 0.016),
         ("backward", 0.02, 0.03), ("update", 0.031, 0.033))
DROPPED = 9  # the page never sees the tenth timeline delta

# the run page's socket, with one timeline delta taken away before the page's handler sees it,
# and the fresh snapshot the page then asks for held back until the test lets it go (so that it
# holds the newest events only, not the lost ones)
DROP = """
(() => {
  const Native = window.WebSocket;
  window.__dropped = [];
  window.__held = [];
  class Dropping extends Native {
    get onmessage() { return super.onmessage; }
    set onmessage(handler) {
      let n = 0;
      super.onmessage = (m) => {
        const msg = JSON.parse(m.data);
        if (msg.type === "timeline" && n++ === DROPPED) {
          window.__dropped.push(msg.events.length);
          return;
        }
        handler(m);
      };
    }
    send(data) {
      if (window.__held && String(data).includes('"snapshot"')) {
        window.__held.push(() => super.send(data));
        return;
      }
      super.send(data);
    }
  }
  window.__release = () => {
    const held = window.__held;
    window.__held = null;
    held.forEach((send) => send());
  };
  window.WebSocket = Dropping;
})();
""".replace("DROPPED", str(DROPPED))

# every event of the run in the database: [device, kind, micro-batch, start, end, stage]
STORED = """
import json
from webapp.runs.models import TimelineEvent
print(json.dumps(list(TimelineEvent.objects.filter(run_id={run}).values_list(
    "device", "kind", "microbatch", "start", "end", "stage"))))
"""
# every event the page's store holds, likewise
HELD = """() => EdgePipe.runPage.ganttStore().keys().map(k => {
  const p = k.split('|');
  return [p[0], p[1], Number(p[2]), Number(p[3]), Number(p[4]), Number(p[5])];
})"""


def events(run: int, uid: str, stage: int, first: int) -> list[dict[str, Any]]:
    out = []
    for m in range(first, first + PER_POST):
        t = m * PERIOD_S + stage * 0.005
        out.extend({"run": run, "device": uid, "stage": stage, "kind": kind, "microbatch": m,
                    "version": 0, "start": t + a, "end": t + b,
                    "bytes": 4096 if kind in ("send", "recv") else 0}
                   for kind, a, b in KINDS)
    return out


def test_the_page_keeps_every_event_of_a_long_run(visit: Visit, server: Server):
    page = visit.page
    spec, devices = generated_testbed(seed=61, layers=16, devices=3)  # a model of its own
    spec_id, enrolled = enrol(server.api(), spec, devices)
    run, stages = starting_run(server, spec_id, enrolled, "every event")
    keys = {d["uid"]: d["authorization"] for d in enrolled}
    page.add_init_script(DROP)
    visit.login(server.password)
    visit.go(f"/runs/{run}/")
    page.wait_for_selector("#conn.live")
    page.wait_for_function("() => EdgePipe.runPage.state() !== null")

    # Execute: the agents report, a hundred micro-batches at a time each
    agent = agent_client(server)
    for first in range(0, MICROBATCHES, PER_POST):
        for stage, uid in enumerate(stages):
            answer = agent.post(f"/api/agent/runs/{run}/events/",
                                json={"timeline": events(run, uid, stage, first)},
                                headers={"Authorization": keys[uid]})
            assert answer.status_code == 201, answer.text
    total = 3 * MICROBATCHES * len(KINDS)
    page.wait_for_function("() => window.__held.length > 0", timeout=LIVE_WITHIN_S)
    page.evaluate("window.__release()")

    # Assert: a delta was lost and seen to be; the store holds every event, the lost ones
    # fetched, each once
    page.wait_for_function(f"() => EdgePipe.runPage.ganttStore().count === {total} &&"
                           " EdgePipe.runPage.ganttStore().holes.length === 0",
                           timeout=LIVE_WITHIN_S * 2)
    assert page.evaluate("window.__dropped") == [len(KINDS) * PER_POST]
    assert page.evaluate("EdgePipe.runPage.gaps") >= 1
    # what was lost (micro-batches 300-399 of the first stage, 15-20 s) came from the
    # timeline API: the snapshot held only the newest 3,000 events
    lost_from = DROPPED // 3 * PER_POST * PERIOD_S
    lost_to = (DROPPED // 3 + 1) * PER_POST * PERIOD_S
    fetched = [dict(p.split("=") for p in u.split("?")[1].split("&")) for u in visit.requests
               if "/timeline/?" in u and "max_events=" in u]
    assert any(float(f["start"]) <= lost_from and float(f["end"]) >= lost_to for f in fetched)
    stored = json.loads(server.manage_shell(STORED.format(run=run)).strip().splitlines()[-1])
    held = page.evaluate(HELD)
    assert len(stored) == total
    assert sorted(map(tuple, held)) == sorted(map(tuple, stored))
    assert {kind for _, kind, *_ in held} == {kind for kind, _, _ in KINDS}
    # held from the run's start: no window of it is fetched, none merged into bars
    assert page.evaluate("EdgePipe.runPage.ganttStore().completeFrom()") == 0
    assert page.evaluate("EdgePipe.runPage.state().timeline.length") <= 3000  # the window

    # Execute: a window of the first seconds (what dragging a box across the Gantt does)
    page.locator("#gantt").scroll_into_view_if_needed()
    page.evaluate("Plotly.relayout('gantt', {'xaxis.range[0]': 1.0, 'xaxis.range[1]': 2.0})")
    page.wait_for_function("() => { const g = EdgePipe.runPage.gantt();"
                           " return g.mode === 'range' && g.range[0] === 1.0; }",
                           timeout=LIVE_WITHIN_S)

    # Assert: drawn from the store, every event of the window a bar
    assert page.evaluate("EdgePipe.runPage.gantt().source") == "live"
    drawn = page.evaluate("""() => EdgePipe.runPage.ganttItems('events').map(
        e => [e.device, e.kind, e.microbatch, e.start, e.end, e.stage])""")
    window = [e for e in stored if e[4] >= 1.0 and e[3] <= 2.0]
    assert len(window) > 250
    assert sorted(map(tuple, drawn)) == sorted(map(tuple, window))
