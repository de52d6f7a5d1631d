"""The run page's "Devices' system" card, in a real Chromium against a real server: the
system metric points the agents report (CPU, memory, temperature where a device has a
sensor) become one trace per device and figure, named as the page names the devices and in
pipeline order, beside the idle breakdown. Screenshot in tests/artifacts/."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser import test_figures
from tests.browser.conftest import ARTIFACTS, Server, Visit
from tests.browser.test_dashboard import LIVE_WITHIN_S
from tests.browser.test_faults import starting_run
from tests.browser.test_figures import Agents

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

@pytest.fixture(scope="module")
def lab(server: Server) -> tuple[int, list[dict[str, Any]]]:
    """Three generated devices enrolled and profiled, one named with markup Plotly would
    render (a model of this module's own: test_figures enrols its own)."""
    return test_figures.renamed_lab(server, seed=59, layers=15)

GIB = 2**30


def readings(uid: str, times: range, *, cpu: float, temp: float | None = None
             ) -> list[dict[str, Any]]:
    out = []
    for t in times:
        figures = {"cpu_pct": cpu, "proc_cpu_pct": cpu / 2, "mem_used_bytes": 3 * GIB,
                   "mem_total_bytes": 8 * GIB, "proc_rss_bytes": 0.4 * GIB}
        if temp is not None:
            figures["temp_c"] = temp
        out += [{"at": 2.0 * t, "kind": kind, "device": uid, "value": value}
                for kind, value in figures.items()]
    return out


def drawn(page: Any) -> list[dict[str, Any]]:
    return page.evaluate("""() => (document.getElementById('system').data || []).map(t => ({
        device: t.meta.device, kind: t.meta.kind, name: t.name, legend: t.showlegend,
        x: t.x, y: t.y, axis: t.yaxis}))""")


def test_the_card_draws_a_trace_per_device_beside_the_idle_breakdown(visit: Visit,
                                                                      server: Server, lab):
    # Prepare: a run starting on the three devices, its page open
    page = visit.page
    spec, devices = lab
    run, stages = starting_run(server, spec, devices, "system figures")
    names = {d["uid"]: d["name"] for d in devices}
    agents = Agents(server, run, devices)
    visit.login(server.password)
    visit.go(f"/runs/{run}/")
    page.wait_for_selector("#conn.live")
    assert page.locator("#system-empty").is_visible()
    assert not page.locator("#system").is_visible()

    # Execute: each device reports its figures; the last stage's device has a sensor
    hot = stages[-1]
    for k, uid in enumerate(stages):
        agents.report(uid, metrics=readings(uid, range(1, 6), cpu=20.0 + 30 * k,
                                            temp=61.5 if uid == hot else None))
    page.wait_for_function(
        "() => (document.getElementById('system').data || [])"
        ".filter(t => t.meta.kind === 'cpu_pct').length === 3", timeout=LIVE_WITHIN_S)

    # Assert: a trace per device and figure, in pipeline order, named as text
    traces = drawn(page)
    cpu = [t for t in traces if t["kind"] == "cpu_pct"]
    assert [t["device"] for t in cpu] == stages
    assert [t["y"] for t in cpu] == [[20.0 + 30 * k] * 5 for k in range(3)]
    assert cpu[0]["x"] == [2.0, 4.0, 6.0, 8.0, 10.0]
    escaped = {uid: n.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
               for uid, n in names.items()}
    assert [t["name"] for t in traces if t["legend"]] == [escaped[uid] for uid in stages]
    for kind in ("proc_cpu_pct", "mem_used_bytes", "mem_total_bytes", "proc_rss_bytes"):
        assert [t["device"] for t in traces if t["kind"] == kind] == stages, kind
    memory = next(t for t in traces if t["kind"] == "mem_used_bytes")
    assert memory["y"] == [3.0] * 5 and memory["axis"] == "y2"  # GiB
    assert [(t["device"], t["axis"], t["y"][0]) for t in traces if t["kind"] == "temp_c"] == [
        (hot, "y3", 61.5)]
    legend = page.evaluate("() => Array.from(document.querySelectorAll('#system .legendtext'))"
                           ".map(e => e.textContent)")
    assert legend == [names[uid] for uid in stages]  # markup shown as written
    assert not page.locator("#system-empty").is_visible()
    # beside the idle breakdown: the same row of the grid, to its right
    idle = page.locator("#idle-empty").locator("xpath=ancestor::section[1]").bounding_box()
    card = page.locator("#system-card").bounding_box()
    assert idle is not None and card is not None
    assert card["y"] == idle["y"] and card["x"] > idle["x"] + idle["width"]

    # a new reading is drawn as it arrives
    agents.report(stages[0], metrics=readings(stages[0], range(6, 7), cpu=90.0))
    page.wait_for_function(
        """() => (document.getElementById('system').data || []).some(t =>
             t.meta.kind === 'cpu_pct' && t.x.length === 6)""", timeout=LIVE_WITHIN_S)
    first = next(t for t in drawn(page) if t["kind"] == "cpu_pct")
    assert first["y"][-1] == 90.0 and first["device"] == stages[0]
    page.locator("#system-card").screenshot(path=str(ARTIFACTS / "run-system.png"))
