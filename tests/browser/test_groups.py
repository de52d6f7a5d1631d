"""Plans that put several devices on one stage (a group of replicas) and split resources
between the passes (Duan-Wu's beta), on the run page in a real Chromium against a real server:
the Gantts have one row per device in pipeline order with a stage's replicas side by side and
labelled with their stage, the replicas' aggregation bars have their own kind and legend entry,
and the plans table lists each stage's group, the betas and the planner's notes. A device name
with markup in it is shown as text. Screenshots in tests/artifacts/."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.browser.conftest import ARTIFACTS, Server, Visit
from tests.browser.test_dashboard import LIVE_WITHIN_S

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

FAST, SLOW, LINK = "grp-fast", "grp-slow", "grp-link"
NAMES = {FAST: "demo-fast", SLOW: "demo-slow", LINK: "demo-<b>slowlink</b>"}
NOTES = ["beta brings nothing on a device with a single resource, so it runs sequentially",
         "stage 1 is replicated: its replicas all-reduce their gradients every update"]
# the chosen plan: stage 0 on demo-fast, stage 1 on demo-slow and demo-<b>slowlink</b>
PLAN = {"algorithm": "duanwu", "schedule": "1f1b", "microbatches": 4,
        "stages": [{"layers": [0, 2], "devices": [FAST]},
                   {"layers": [3, 5], "devices": [SLOW, LINK]}],
        "beta": {FAST: {"cpu": 0.42}, SLOW: {"cpu": 0.6}, LINK: {"cpu": 0.55}},
        "notes": NOTES}
# another planner's: every device on one stage
ONE_STAGE = {"algorithm": "tapp", "schedule": "1f1b", "microbatches": 4,
             "stages": [{"layers": [0, 5], "devices": [FAST, SLOW, LINK]}]}


def timeline(run: int) -> dict[str, list[dict[str, Any]]]:
    """Eight micro-batches: demo-fast runs stage 0; the replicas of stage 1 take every other
    one, and after each pair they all-reduce (an aggregate bar on both, at the same time)."""
    events: dict[str, list[dict[str, Any]]] = {FAST: [], SLOW: [], LINK: []}

    def add(device: str, stage: int, kind: str, m: int, start: float, end: float,
            size: int = 0) -> None:
        events[device].append({"run": run, "device": device, "stage": stage, "kind": kind,
                               "microbatch": m, "version": 0, "start": round(start, 3),
                               "end": round(end, 3), "bytes": size})

    for m in range(8):
        t = 0.3 * m
        replica = LINK if m % 2 == 0 else SLOW
        add(FAST, 0, "forward", m, t, t + 0.1)
        add(FAST, 0, "send", m, t + 0.1, t + 0.15, 4096)
        add(replica, 1, "recv", m, t + 0.1, t + 0.15, 4096)
        add(replica, 1, "forward", m, t + 0.15, t + 0.35)
        add(replica, 1, "backward", m, t + 0.35, t + 0.75)
        add(replica, 1, "send", m, t + 0.75, t + 0.8, 4096)
        add(FAST, 0, "recv", m, t + 0.75, t + 0.8, 4096)
        add(FAST, 0, "backward", m, t + 0.8, t + 0.88)
        if m % 2 == 1:
            for device in (SLOW, LINK):
                add(device, 1, "aggregate", m, t + 0.8, t + 0.95, 65536)
    return events


SETUP = """
import json
from django.utils import timezone
from tests.webapp.factories import (DeviceFactory, LayerProfileFactory, ModelSpecFactory,
                                    PlanFactory, RunFactory)
from webapp.runs import services
from webapp.runs.models import Run

names, plan_document, one_stage = json.loads({args!r})
spec = ModelSpecFactory(model="mlp", dataset="groups", batch_size=32)
# offline: no agent heartbeats for them, and the server must not start recovering the run
devices = {{uid: DeviceFactory(uid=uid, name=name, status="offline")
            for uid, name in names.items()}}
for k, device in enumerate(devices.values()):
    LayerProfileFactory(device=device, model_spec=spec, layers=6, scale=1.0 + k)
# the run's own device order is not the pipeline's: the plan lays the rows out
run = RunFactory(name="replicated stage", model_spec=spec, microbatches=4, batches=10,
                 devices=[devices["{link}"], devices["{fast}"], devices["{slow}"]])
plan = PlanFactory(run=run, algorithm="duanwu", stages=2, period_s=0.3,
                   document=plan_document)
other = PlanFactory(run=run, algorithm="tapp", stages=1, period_s=0.6, document=one_stage)
Run.objects.filter(pk=run.pk).update(state=Run.State.RUNNING, chosen_plan=plan,
                                     started_at=timezone.now())
print("SETUP " + json.dumps({{"run": run.pk, "plans": [plan.pk, other.pk]}}))
"""

STORE = """
import json
from webapp.devices.models import Device
from webapp.runs import services
from webapp.runs.models import Run

run = Run.objects.get(pk={run})
# the second replica's events are stored first: the rows must not follow arrival
for uid, events in json.loads({events!r}):
    services.run_events_store(run=run, device=Device.objects.get(uid=uid), timeline=events)
"""


def replicated_run(server: Server) -> tuple[int, int, int]:
    """The run, its chosen plan and its other plan."""
    out = server.manage_shell(SETUP.format(
        args=json.dumps([NAMES, PLAN, ONE_STAGE]), fast=FAST, slow=SLOW, link=LINK))
    ids = json.loads(next(line for line in out.splitlines()
                          if line.startswith("SETUP "))[len("SETUP "):])
    events = timeline(ids["run"])
    server.manage_shell(STORE.format(run=ids["run"], events=json.dumps(
        [[uid, events[uid]] for uid in (LINK, SLOW, FAST)])))
    plan, other = ids["plans"]
    return ids["run"], plan, other


def tick_labels(page: Any, selector: str) -> list[str]:
    """A Gantt's row labels, top to bottom, as shown (text content: markup would be gone)."""
    return page.locator(f"{selector} .ytick text").evaluate_all(
        "els => els.map(e => [e.getBoundingClientRect().top, e.textContent])"
        ".sort((a, b) => a[0] - b[0]).map(p => p[1])")


ROWS = ["stage 0 · demo-fast", "stage 1 · demo-slow", "stage 1 · demo-<b>slowlink</b>"]


def test_a_replicated_stage_on_the_run_page(visit: Visit, server: Server):
    page = visit.page
    run, plan, other = replicated_run(server)
    visit.login(server.password)
    visit.go(f"/runs/{run}/")
    page.wait_for_selector("#conn.live")
    page.wait_for_selector("#gantt .main-svg", timeout=LIVE_WITHIN_S)
    # the live Gantt: one row per device, pipeline order, the replicas adjacent and labelled
    # with their stage, the names as text
    page.wait_for_function(f"() => document.querySelectorAll('#gantt .ytick text').length"
                           f" === {len(ROWS)}", timeout=LIVE_WITHIN_S)
    assert tick_labels(page, "#gantt") == ROWS
    assert page.evaluate("EdgePipe.runPage.rows().map(r => [r.device, r.stage])") == [
        [FAST, 0], [SLOW, 1], [LINK, 1]]
    # the group's bracket spans exactly the two replicas' rows
    brackets = page.evaluate("""() => document.getElementById('gantt').layout.shapes
        .filter(s => s.type === 'path').map(s => s.path)""")
    assert len(brackets) == 1
    # aggregation: a kind of its own, on both replicas' rows, in its own lane, in the legend
    kinds = page.evaluate("EdgePipe.charts.KINDS")
    label = kinds["aggregate"]["label"]
    assert len({k["color"] for k in kinds.values()}) == len(kinds)  # every kind its colour
    bars = page.evaluate("""() => {
        const items = EdgePipe.runPage.ganttItems('events');
        const of = kind => items.filter(b => b.kind === kind).map(b => b.y);
        return {aggregate: of('aggregate'), forward: of('forward')};
      }""")
    assert {round(y) for y in bars["aggregate"]} == {1, 2}
    assert len(bars["aggregate"]) == 8  # four all-reduces on each replica
    assert not set(bars["aggregate"]) & set(bars["forward"])  # a lane of its own
    legend = page.locator("#gantt .legend .legendtext").all_text_contents()
    assert label in legend and "forward" in legend
    assert label in page.inner_text("#kind-legend")  # the planned Gantts' legend too
    # the plans table: each stage's group, the betas per device and resource, the notes
    layout = page.locator(f'#plans-table [data-plan-layout="{plan}"]')
    layout.wait_for(timeout=LIVE_WITHIN_S)
    assert layout.locator(".plan-layout-head").inner_text() == "2 stages (1 replicated)"
    assert layout.locator('li[data-stage="0"] .stage-text').inner_text() == (
        "layers 0–2 on demo-fast")
    group = layout.locator('li[data-stage="1"]')
    assert group.get_attribute("data-replicas") == "2"
    assert group.locator(".stage-text").inner_text() == (
        "layers 3–5 on demo-slow + demo-<b>slowlink</b> (2 replicas)")
    passes = {uid: layout.locator(f'.passes[data-device="{uid}"]').inner_text()
              for uid in NAMES}
    assert passes == {FAST: "demo-fast: β cpu 0.42 forward",
                      SLOW: "demo-slow: β cpu 0.60 forward",
                      LINK: "demo-<b>slowlink</b>: β cpu 0.55 forward"}
    assert layout.locator(".plan-notes li").all_inner_texts() == NOTES
    one = page.locator(f'#plans-table [data-plan-layout="{other}"]')
    assert one.locator(".plan-layout-head").inner_text() == "1 stage (1 replicated)"
    assert one.locator(".stage-text").inner_text() == (
        "layers 0–5 on demo-fast + demo-slow + demo-<b>slowlink</b> (3 replicas)")
    # the pipeline under the run's name: the chosen plan's stages and groups
    assert page.inner_text("#pipeline-label") == "Pipeline (duanwu plan)"
    assert page.locator("#pipeline .tag").all_inner_texts() == [
        "stage 0 · demo-fast", "stage 1 · demo-slow + demo-<b>slowlink</b> (2 replicas)"]
    # the planned Gantt of the chosen plan: the same rows, and its replicas' aggregation
    planned = f'#plan-gantts .plan-gantt[data-plan="{plan}"]'
    page.wait_for_selector(f"{planned} .main-svg", timeout=LIVE_WITHIN_S)
    assert tick_labels(page, planned) == ROWS
    assert page.evaluate(f"""() => document.querySelector('{planned} .chart').data
        .some(t => t.name === {json.dumps(label)} && t.x.length > 0)""")
    # the idle breakdown in the same order
    page.wait_for_function("() => (document.getElementById('idle').data || []).length > 0",
                           timeout=LIVE_WITHIN_S)
    assert tick_labels(page, "#idle") == ROWS
    # nothing of a device's name became markup anywhere
    assert page.locator("#plans-table b, #pipeline b, #run-devices b").count() == 0
    visit.screenshot("run-groups")
    page.locator("#gantt-card").screenshot(path=str(ARTIFACTS / "run-groups-gantt.png"))
    page.locator("#plans-card").screenshot(path=str(ARTIFACTS / "run-groups-plans.png"))
