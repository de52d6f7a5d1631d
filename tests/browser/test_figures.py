"""The run page's figures say what is true and fit their cards, in a real Chromium against a
real server: a lost device's status reads "lost" until it joins again; the throughput chart
draws the prediction of the plan being trained (the chosen plan's, then each re-partition's)
beside the measured throughput; accuracy on a fixed 0-100% axis, the loss on a log axis; counts
in words agree with their number; no chart's labels are clipped or overlap its legend; the
fault log's details wrap; names with markup in them are shown as text; the compare page shows
every run it compares. Screenshots in tests/artifacts/."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.browser.conftest import ARTIFACTS, Server, Visit
from tests.browser.test_dashboard import LIVE_WITHIN_S, agent_client
from tests.browser.test_faults import fault, starting_run, trained
from tests.webapp.integration.stack import enrol, generated_testbed

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

# the devices' names: one long enough to be clipped, one with markup Plotly would render
NAMES = ["demo-fast", "demo-slowlink behind the garden shed", "<b>bold</b> & co"]
LAYER_WITH_MARKUP = "<i>stem</i>"


@pytest.fixture(scope="module")
def lab(server: Server) -> tuple[int, list[dict[str, Any]]]:
    return renamed_lab(server, seed=37, layers=7)


def renamed_lab(server: Server, *, seed: int, layers: int) -> tuple[int, list[dict[str, Any]]]:
    """Three generated devices (a model of their own, of ``layers`` layers: one per module
    of tests, since a model is enrolled once; its first layer named with markup), enrolled and
    profiled through the agent API, then renamed; the model spec id and the enrolment answers,
    with the names as they are now."""
    spec, devices = generated_testbed(seed=seed, layers=layers, devices=3)
    for _, profile in devices:
        profile["layers"][0]["name"] = LAYER_WITH_MARKUP
    spec_id, enrolled = enrol(server.api(), spec, devices)
    user = server.api()
    for device, name in zip(enrolled, NAMES, strict=True):
        answer = user.http.patch(f"/api/devices/{device['id']}/", json={"name": name},
                                 headers={"X-CSRFToken": user.http.cookies["csrftoken"]})
        assert answer.status_code == 200, answer.text
        device["name"] = name
    return spec_id, enrolled


class Agents:
    """The run's agents reporting through the agent API, each with its own key."""

    def __init__(self, server: Server, run: int, devices: list[dict[str, Any]]) -> None:
        self.run = run
        self.keys = {d["uid"]: d["authorization"] for d in devices}
        self.http = agent_client(server)

    def report(self, uid: str, **body: Any) -> None:
        answer = self.http.post(f"/api/agent/runs/{self.run}/events/", json=body,
                                headers={"Authorization": self.keys[uid]})
        assert answer.status_code == 201, answer.text


def status_of(page: Any, uid: str) -> tuple[str, str]:
    """A device's Status cell on the run page: its text and its badge's class."""
    badge = page.locator(f'#run-devices td[data-status-for="{uid}"] .badge')
    return badge.inner_text(), badge.get_attribute("class") or ""


def wait_status(page: Any, uid: str, text: str) -> None:
    page.wait_for_function(
        """([uid, text]) => {
             const b = document.querySelector(`#run-devices td[data-status-for="${uid}"] .badge`);
             return b !== null && b.textContent === text;
           }""", arg=[uid, text], timeout=LIVE_WITHIN_S)


def test_a_lost_device_reads_lost_until_it_joins_again(visit: Visit, server: Server, lab):
    page = visit.page
    spec, devices = lab
    run, (a, b, c) = starting_run(server, spec, devices, "lost and back")
    agents = Agents(server, run, devices)
    visit.login(server.password)
    visit.go(f"/runs/{run}/")
    page.wait_for_selector("#conn.live")
    before = status_of(page, b)
    assert before[0] != "lost"
    # lost: "lost" in the failed style, through the recovery and after it
    agents.report(a, faults=[fault(run, 20.0, "device_lost", b, detected_by="disconnect"),
                             fault(run, 20.0, "recovery_started", generation=1, lost=[b])])
    wait_status(page, b, "lost")
    assert "badge-lost" in status_of(page, b)[1]
    assert page.evaluate("""() => {
        const lost = getComputedStyle(document.querySelector('#run-devices .badge-lost'));
        const probe = document.createElement('span');
        probe.className = 'badge badge-failed';
        document.body.append(probe);
        const failed = getComputedStyle(probe);
        const same = lost.color === failed.color && lost.backgroundColor === failed.backgroundColor;
        probe.remove();
        return same;
      }""")
    assert [status_of(page, uid)[0] for uid in (a, c)] == [before[0], before[0]]
    agents.report(a, faults=[
        fault(run, 20.5, "repartitioned", generation=1, cause="failure",
              stages=[{"devices": [a], "layers": [0, 3]}, {"devices": [c], "layers": [4, 6]}],
              predicted_throughput_sps=50.0),
        fault(run, 21.0, "recovered", generation=1, recovery_s=1.0)])
    page.wait_for_selector('#recoveries-table tbody[data-phase="resumed"]', timeout=LIVE_WITHIN_S)
    assert status_of(page, b)[0] == "lost"
    # back: a later device_joined ends it; an older loss arriving late does not bring it back
    agents.report(b, faults=[fault(run, 30.0, "device_joined", b)])
    page.wait_for_function(
        f"""() => document.querySelector('#run-devices td[data-status-for="{b}"] .badge')
                   .textContent !== 'lost'""", timeout=LIVE_WITHIN_S)
    assert "badge-lost" not in status_of(page, b)[1]
    assert "rejoined at 30.0 s" in page.inner_text(f'[data-lost-for="{b}"]')
    agents.report(a, faults=[fault(run, 25.0, "device_lost", b, detected_by="probe")])
    page.wait_for_function("() => document.getElementById('faults').rows.length === 6",
                           timeout=LIVE_WITHIN_S)
    assert status_of(page, b)[0] != "lost"
    # lost again: lost again; and a fresh page (the snapshot) says the same as the deltas did
    agents.report(a, faults=[fault(run, 40.0, "device_lost", b, detected_by="heartbeat")])
    wait_status(page, b, "lost")
    visit.go(f"/runs/{run}/")
    page.wait_for_selector("#conn.live")
    wait_status(page, b, "lost")
    assert [status_of(page, uid)[0] for uid in (a, c)] == [before[0], before[0]]
    page.locator("#recoveries-card").screenshot(path=str(ARTIFACTS / "run-device-lost.png"))


def test_throughput_against_the_prediction_and_the_learning_axes(visit: Visit, server: Server,
                                                                 lab):
    page = visit.page
    spec, devices = lab
    run, (a, _, c) = starting_run(server, spec, devices, "predicted")
    [plan] = server.api().get(f"/api/runs/{run}/plans/")
    planned = plan["throughput_sps"]
    assert planned > 0
    agents = Agents(server, run, devices)
    visit.login(server.password)
    visit.go(f"/runs/{run}/")
    page.wait_for_selector("#conn.live")
    # measured throughput, a loss spanning three decades, accuracy up to 45%
    agents.report(c, metrics=[m for t in range(1, 11) for m in (
        {"at": float(t), "kind": "throughput_sps", "value": 0.9 * planned},
        {"at": float(t), "kind": "loss", "value": 2.3 * 10 ** (-0.3 * t)},
        {"at": float(t), "kind": "accuracy", "value": 0.045 * t})])

    def predicted() -> Any:
        return page.evaluate("""() => {
            const t = (document.getElementById('throughput').data || [])
              .find(t => t.name.startsWith('predicted'));
            return t ? {x: t.x, y: t.y, shape: t.line.shape, dash: t.line.dash} : null;
          }""")

    page.wait_for_function(
        "() => (document.getElementById('throughput').data || []).some(t => "
        "t.name.startsWith('predicted'))", timeout=LIVE_WITHIN_S)
    line = predicted()
    assert line["shape"] == "hv" and line["dash"] == "dash"
    assert line["x"][0] == 1.0 and line["x"][-1] == 10.0
    assert line["y"] == pytest.approx([planned] * len(line["y"]))
    # a re-partition predicts another throughput: the line steps there
    agents.report(a, faults=[fault(run, 12.5, "repartitioned", generation=1, cause="dynamic",
                                   stages=[{"devices": [a], "layers": [0, 3]},
                                           {"devices": [c], "layers": [4, 6]}],
                                   predicted_throughput_sps=2 * planned)])
    agents.report(c, metrics=[{"at": float(t), "kind": "throughput_sps", "value": 1.8 * planned}
                              for t in range(11, 16)])
    page.wait_for_function(
        """() => (document.getElementById('throughput').data || []).some(t =>
             t.name.startsWith('predicted') && t.x[t.x.length - 1] === 15)""",
        timeout=LIVE_WITHIN_S)
    line = predicted()
    steps = [(x, y) for x, y in zip(line["x"], line["y"], strict=True)]
    assert steps[0] == (1.0, pytest.approx(planned))
    assert (12.5, pytest.approx(2 * planned)) in steps
    assert steps[-1] == (15.0, pytest.approx(2 * planned))
    assert all(y == pytest.approx(planned) for x, y in steps if x < 12.5)
    # accuracy on 0-100% with round ticks, the loss on a log axis
    page.wait_for_selector("#training .main-svg")
    axes = page.evaluate("""() => {
        const full = document.getElementById('training')._fullLayout;
        return {loss: full.yaxis.type, accuracy: full.yaxis2.range,
                ticks: Array.from(document.querySelectorAll('#training .y2tick text'))
                  .map(e => e.textContent)};
      }""")
    assert axes["loss"] == "log"
    assert axes["accuracy"] == [0, 1]
    assert axes["ticks"] == ["0%", "20%", "40%", "60%", "80%", "100%"]
    page.locator("#throughput").screenshot(path=str(ARTIFACTS / "run-throughput.png"))
    page.locator("#training").screenshot(path=str(ARTIFACTS / "run-training.png"))


def test_counts_agree_with_their_number(visit: Visit, server: Server, lab):
    page = visit.page
    spec, devices = lab
    user = server.api()
    run = user.post("/api/runs/", {"name": "one of each", "model_spec": spec, "devices": [
        devices[0]["id"]], "algorithms": ["uniform"], "microbatches": 1, "batches": 1},
        expect=201)
    user.post(f"/api/runs/{run['id']}/plan/", {}, expect=202)
    user.wait_run(run["id"], ("planned",), timeout=60)
    visit.login(server.password)
    visit.go(f"/runs/{run['id']}/")
    page.wait_for_selector("#conn.live")
    assert "1 micro-batch × 1 batch ·" in page.inner_text(".page-head .sub")
    assert page.evaluate("[0, 1, 2].map(n => EdgePipe.plural(n, 'stage'))") == [
        "0 stages", "1 stage", "2 stages"]
    assert page.evaluate("[1, 4].map(n => EdgePipe.plural(n, 'micro-batch', 'micro-batches'))"
                         ) == ["1 micro-batch", "4 micro-batches"]
    layout = page.locator("#plans-table .plan-layout-head")
    layout.wait_for(timeout=LIVE_WITHIN_S)
    assert layout.inner_text() == "1 stage"
    gantt = page.locator("#plan-gantts .plan-gantt .g-xtitle")
    gantt.wait_for(timeout=LIVE_WITHIN_S)
    assert (gantt.text_content() or "").startswith("2 batches · 2 micro-batches · ")
    other = user.post("/api/runs/", {"name": "and another", "model_spec": spec, "devices": [
        devices[1]["id"]], "algorithms": ["uniform"], "microbatches": 1, "batches": 1},
        expect=201)
    visit.go(f"/runs/compare/?runs={run['id']}&runs={other['id']}")
    schedules = page.locator("#compare tbody tr", has_text="Schedule").inner_text()
    assert schedules.count("· 1 micro-batch") == 2 and "micro-batches" not in schedules


def boxes_overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return not (a["right"] <= b["left"] or b["right"] <= a["left"]
                or a["bottom"] <= b["top"] or b["bottom"] <= a["top"])


CLIPPED = """sel => {
    const chart = document.querySelector(sel);
    const box = chart.getBoundingClientRect();
    return Array.from(chart.querySelectorAll('.ytick text, .xtick text'))
      .filter(e => e.getBoundingClientRect().left < box.left - 0.5 ||
                   e.getBoundingClientRect().right > box.right + 0.5)
      .map(e => e.textContent);
  }"""

TITLE_AND_LEGEND = """sel => {
    const chart = document.querySelector(sel);
    const title = chart.querySelector('.g-xtitle text');
    const legend = chart.querySelector('.legend .bg');
    const box = e => { const r = e.getBoundingClientRect();
                       return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
    return title && legend ? [box(title), box(legend)] : null;
  }"""


def test_the_run_page_fits_its_cards_and_shows_names_as_text(visit: Visit, server: Server,
                                                             lab):
    page = visit.page
    spec, devices = lab
    run, rows = starting_run(server, spec, devices, "fits")
    a, b, c = rows
    labels = {d["uid"]: d["name"] for d in devices}
    agents = Agents(server, run, devices)
    visit.login(server.password)
    visit.go(f"/runs/{run}/")
    page.wait_for_selector("#conn.live")
    for k, uid in enumerate(rows):
        agents.report(uid, timeline=trained(run, uid, k, [0.5 * m + 0.2 * k for m in range(16)]),
                      metrics=[{"at": float(t), "kind": "throughput_sps", "value": 30.0,
                                "device": uid} for t in range(1, 8)])
    stages = [{"devices": [a], "layers": [0, 3]}, {"devices": [c], "layers": [4, 6]}]
    agents.report(a, faults=[
        fault(run, 6.0, "device_lost", b, reason="control connection closed",
              detected_by="disconnect"),
        fault(run, 6.0, "recovery_started", generation=1, lost=[b]),
        fault(run, 6.5, "repartitioned", generation=1, cause="failure", planner="optimal",
              stages=stages, predicted_throughput_sps=80.0, resume_microbatch=48,
              measured_throughput_sps=31.25, saved_s=12.5, cost_s=1.25),
        fault(run, 7.0, "weights_redistributed", generation=1, bytes_moved=4 * 2**20,
              transfers=3, duration_s=0.5),
        fault(run, 7.5, "recovered", generation=1, recovery_s=1.5, microbatches_redone=6)])
    page.wait_for_selector('#recoveries-table tbody[data-phase="resumed"]', timeout=LIVE_WITHIN_S)
    for chart in ("#gantt", "#idle", "#throughput", "#recoveries-chart"):
        page.wait_for_selector(f"{chart} .main-svg", timeout=LIVE_WITHIN_S)
    page.wait_for_function(
        "() => document.querySelectorAll('#plan-gantts .plan-gantt .main-svg').length > 0",
        timeout=LIVE_WITHIN_S)
    page.wait_for_function("() => document.querySelectorAll('#gantt .ytick text').length === 3",
                           timeout=LIVE_WITHIN_S)
    # no device name clipped on the left of a Gantt (or of any chart), no axis title under a
    # legend
    clipped = {chart: page.evaluate(CLIPPED, chart) for chart in (
        "#gantt", "#plan-gantts .plan-gantt .chart", "#idle", "#recoveries-chart")}
    assert clipped == {chart: [] for chart in clipped}
    overlaps = {}
    for chart in ("#recoveries-chart", "#idle", "#throughput", "#gantt"):
        boxes = page.evaluate(TITLE_AND_LEGEND, chart)
        assert boxes is not None, chart
        overlaps[chart] = boxes_overlap(*boxes)
    assert overlaps == dict.fromkeys(overlaps, False)
    # the fault log's details: short key: value text that wraps inside the card, the whole
    # event's JSON in its title
    log = page.locator("#faults-table")
    row = log.locator("tbody tr", has_text="repartitioned")
    detail = row.locator("td").nth(3)
    text = detail.inner_text()
    for part in ("planner: optimal", "predicted_throughput_sps: 80",
                 f"stages: {labels[a]} [0–3] → {labels[c]} [4–6]", "resume_microbatch: 48"):
        assert part in text, (part, text)
    assert "{" not in text
    full = json.loads(detail.get_attribute("title") or "{}")
    assert full["stages"] == stages and full["predicted_throughput_sps"] == 80.0
    lost_row = log.locator("tbody tr", has_text="device lost")
    assert "reason: control connection closed" in lost_row.inner_text()
    assert page.evaluate("""() => {
        const card = document.getElementById('faults-table').closest('.card');
        const table = document.getElementById('faults-table').getBoundingClientRect();
        const scroller = card.querySelector('.log');
        return table.right <= card.getBoundingClientRect().right + 0.5 &&
               scroller.scrollWidth <= scroller.clientWidth;
      }""")
    # names with markup: shown as text in every chart, nothing bold that the page did not make
    literal = labels[c]
    assert any(literal in t for t in page.locator("#gantt .ytick").all_text_contents())
    assert any(literal in t for t in page.locator("#idle .ytick").all_text_contents())
    assert any(literal in t for t in page.locator("#throughput .legendtext").all_text_contents())
    assert f"gen 1 · lost {labels[b]}" in page.locator(
        "#recoveries-chart .ytick").all_text_contents()
    for chart in ("#gantt", "#idle", "#throughput", "#recoveries-chart", "#plan-gantts"):
        assert page.locator(f"{chart} .main-svg tspan[style*='bold']").count() == 0, chart
    assert page.locator("#run-devices b, #faults b, #recoveries-table b, #pipeline b").count() == 0
    visit.screenshot("run-fits")
    page.locator("#recoveries-card").screenshot(path=str(ARTIFACTS / "run-recoveries-fit.png"))
    # the device page's profile chart: a layer's name with markup, as text
    visit.go(f"/devices/{devices[0]['id']}/")
    page.wait_for_selector("#profile-chart .main-svg")
    ticks = page.locator("#profile-chart .xtick").all_text_contents()
    assert f"0 {LAYER_WITH_MARKUP}" in ticks, ticks
    assert page.locator("#profile-chart .main-svg tspan[style*='italic']").count() == 0


def test_the_compare_page_shows_four_runs(visit: Visit, server: Server, lab):
    page = visit.page
    spec, devices = lab
    runs = []
    for k, nth in enumerate(("first", "second", "third", "fourth")):
        run, rows = starting_run(server, spec, devices, f"four runs compared, the {nth} of them")
        agents = Agents(server, run, devices)
        agents.report(rows[-1], metrics=[{"at": float(t), "kind": "throughput_sps",
                                          "value": 30.0 + k + t} for t in range(1, 8)])
        for j, uid in enumerate(rows):
            agents.report(uid, timeline=trained(run, uid, j, [0.5 * m for m in range(6)]))
        runs.append(run)
    visit.login(server.password)
    visit.go("/runs/compare/?" + "&".join(f"runs={r}" for r in runs))
    page.wait_for_selector("#compare-throughput .main-svg")
    assert page.locator("#compare thead th").count() == 5
    fits = """() => {
        const table = document.getElementById('compare');
        const card = table.closest('.card').getBoundingClientRect();
        const wrap = table.parentElement;
        const page = document.documentElement;
        return {
          card_in_page: card.right <= page.clientWidth + 0.5,
          page_scrolls: page.scrollWidth > page.clientWidth,
          runs_in_card: Array.from(table.querySelectorAll('thead th'))
            .every(th => th.getBoundingClientRect().right <= card.right + 0.5),
          wrap_scrolls: getComputedStyle(wrap).overflowX === 'auto' &&
                        wrap.scrollWidth > wrap.clientWidth,
        };
      }"""
    # at a desktop's width every run's column is in the card, nothing to scroll
    state = page.evaluate(fits)
    assert state == {"card_in_page": True, "page_scrolls": False, "runs_in_card": True,
                      "wrap_scrolls": False}, state
    # every run in the legend, inside the chart, clear of the axis title
    legend = page.locator("#compare-throughput .legendtext").all_text_contents()
    assert [t.split(" ", 1)[0] for t in legend] == [f"#{r}" for r in runs]
    assert page.evaluate(CLIPPED, "#compare-throughput") == []
    boxes = page.evaluate(TITLE_AND_LEGEND, "#compare-throughput")
    assert boxes is not None and not boxes_overlap(*boxes)
    assert page.evaluate("""() => {
        const chart = document.getElementById('compare-throughput').getBoundingClientRect();
        return Array.from(document.querySelectorAll('#compare-throughput .legend .traces'))
          .every(e => e.getBoundingClientRect().bottom <= chart.bottom + 0.5);
      }""")
    visit.screenshot("runs-compare-four")
    # on a narrow screen the table scrolls in its card, and the page does not
    page.set_viewport_size({"width": 960, "height": 900})
    page.wait_for_function("() => document.querySelector('#compare-throughput .main-svg')"
                           ".getBoundingClientRect().width < 960")
    state = page.evaluate(fits)
    wide = page.evaluate("""() => Array.from(document.querySelectorAll('body *'))
        .filter(e => !e.closest('.table-wrap') &&
                     e.getBoundingClientRect().right > document.documentElement.clientWidth + 0.5)
        .slice(0, 8).map(e => e.tagName + '#' + e.id + '.' + e.className)""")
    assert state["card_in_page"] and not state["page_scrolls"], (state, wide)
    assert state["runs_in_card"] or state["wrap_scrolls"], state
