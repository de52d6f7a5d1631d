"""The live Gantt's flows, in a real Chromium against a real server: the pointer on a send
draws an arrow from it to the receive of the same micro-batch on the neighbouring stage (a
forward's activation to the next stage, a backward's gradient to the previous one), and the
arrow goes when the pointer leaves. Screenshot in tests/artifacts/."""

from __future__ import annotations

import time
from typing import Any

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.browser.conftest import ARTIFACTS, Server, Visit
from tests.browser.test_dashboard import LIVE_WITHIN_S, agent_client
from tests.browser.test_faults import starting_run
from tests.webapp.integration.stack import enrol, generated_testbed

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]


def transfer(run: int, uid: str, stage: int, kind: str, microbatch: int, start: float,
             end: float) -> dict[str, Any]:
    return {"run": run, "device": uid, "stage": stage, "kind": kind, "microbatch": microbatch,
            "version": 0, "start": start, "end": end, "bytes": 4096}


# the pointer onto the middle of a device's send of micro-batch 1 that begins at `start` (the
# bar the Gantt's canvas draws: EdgePipe.runPage.ganttItems, in client pixels)
HOVER = """([uid, start]) => {
  const bar = EdgePipe.runPage.ganttItems('events').find(
    b => b.device === uid && b.kind === 'send' && b.microbatch === 1 && b.start === start);
  return [bar.x, bar.yPx];
}"""
# the flow arrows the Gantt draws (Plotly annotations), and each as [send start, receive end]
FLOWS = """(document.getElementById('gantt').layout.annotations || [])
  .filter(a => a.name === 'flow')"""
ARROWS = f"() => {FLOWS}.map(a => [a.ax, a.x])"
# what the page shows where the pointer is: the element, the bar the hover picks, the arrows
SEEN = """([x, y]) => {
  const at = document.elementFromPoint(x, y);
  return {element: at ? at.tagName + '.' + (at.getAttribute('class') || '') : null, pointer: [x, y],
          picked: EdgePipe.runPage.ganttPick(x, y), shown: EdgePipe.runPage.gantt(),
          arrows: """ + FLOWS + "};\n}"


def test_hovering_a_send_draws_its_flow_to_the_receive(visit: Visit, server: Server):
    page = visit.page
    spec, devices = generated_testbed(seed=41, layers=6, devices=3)
    spec_id, enrolled = enrol(server.api(), spec, devices)
    run, (a, b, c) = starting_run(server, spec_id, enrolled, "flows")
    keys = {d["uid"]: d["authorization"] for d in enrolled}
    agent = agent_client(server)
    # micro-batch 1: a forwards and sends to b (at 1.0), b receives (1.05-1.2); later b
    # sends the gradient back to a (at 3.0), a receives it (3.1-3.3); b also receives
    # micro-batch 1's gradient from c, which must not be taken for a's send's other end
    timeline = {
        a: [transfer(run, a, 0, "send", 1, 1.0, 1.1), transfer(run, a, 0, "recv", 1, 3.1, 3.3)],
        b: [transfer(run, b, 1, "recv", 1, 1.05, 1.2), transfer(run, b, 1, "send", 1, 3.0, 3.2),
            transfer(run, b, 1, "recv", 1, 2.6, 2.8)],
        c: [transfer(run, c, 2, "send", 1, 2.5, 2.7)],
    }
    visit.login(server.password)
    visit.go(f"/runs/{run}/")
    page.wait_for_selector("#conn.live")
    for uid, events in timeline.items():
        answer = agent.post(f"/api/agent/runs/{run}/events/", json={"timeline": events},
                            headers={"Authorization": keys[uid]})
        assert answer.status_code == 201, answer.text
    page.wait_for_function("() => EdgePipe.runPage.ganttItems &&"
                           " EdgePipe.runPage.ganttItems('events').length >= 6",
                           timeout=LIVE_WITHIN_S)
    page.locator("#gantt").scroll_into_view_if_needed()
    # the forward's activation: a's send at 1.0 to b's receive ending at 1.2
    hover_until(page, a, 1.0, [[1.0, 1.2]])
    box = page.locator("#gantt").bounding_box()  # a clip: a locator's screenshot scrolls
    assert box is not None
    page.screenshot(path=str(ARTIFACTS / "gantt-flow.png"), clip=box)
    # off the bars: no arrow
    page.mouse.move(5, 5)
    page.wait_for_function(f"() => ({ARROWS})().length === 0", timeout=10_000)
    # the backward's gradient: b's send at 3.0 to a's receive ending at 3.3
    hover_until(page, b, 3.0, [[3.0, 3.3]])
    page.mouse.move(5, 5)
    page.wait_for_function(f"() => ({ARROWS})().length === 0", timeout=10_000)


def hover_until(page: Any, uid: str, start: float, arrows: list[list[float]]) -> None:
    """Put the pointer on the send until the page draws `arrows` (a loaded machine's redraw
    may move the bars or drop a hover: the pointer goes back on the bar, where it is now)."""
    deadline = time.monotonic() + 30
    while True:
        x, y = page.evaluate(HOVER, [uid, start])
        page.mouse.move(x, y)
        try:
            page.wait_for_function(f"arrows => JSON.stringify(({ARROWS})()) === "
                                   "JSON.stringify(arrows)", arg=arrows, timeout=3_000)
            return
        except PlaywrightTimeout:
            if time.monotonic() > deadline:
                raise AssertionError(f"no flow {arrows} from {uid}'s send at {start}: "
                                     f"{page.evaluate(SEEN, [x, y])}") from None
            page.mouse.move(5, 5)  # off, to hover anew
