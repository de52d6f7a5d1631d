"""A split run's page in a real Chromium against a real server: its plans laid out as clients
and helpers, and the Split learning card drawing each batch's makespan against the plan,
each client's progress with its helper, and each round's held-out accuracy, as the agents
report their batches. Screenshot in tests/artifacts/."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser import test_figures
from tests.browser.conftest import Server, Visit
from tests.browser.test_dashboard import LIVE_WITHIN_S
from tests.browser.test_figures import Agents

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def lab(server: Server) -> tuple[int, list[dict[str, Any]]]:
    return test_figures.renamed_lab(server, seed=67, layers=17)


def starting_split_run(server: Server, spec: int, devices: list[dict[str, Any]]
                       ) -> dict[str, Any]:
    """Two clients and one helper, planned with two methods; moved to starting with the
    exact plan through the state machine (the agents' deployment is not this test's)."""
    user = server.api()
    run = user.post("/api/runs/split/", {
        "name": "split page", "model_spec": spec, "clients": [devices[0]["id"],
                                                             devices[1]["id"]],
        "helpers": [devices[2]["id"]], "algorithms": ["exact", "balanced-greedy"],
        "sigma1": 1, "sigma2": 3, "batches": 3, "epochs": 2}, expect=201)
    user.post(f"/api/runs/{run['id']}/plan/", {}, expect=202)
    user.wait_run(run["id"], ("planned",), timeout=60)
    plans = {p["algorithm"]: p for p in user.get(f"/api/runs/{run['id']}/plans/")}
    server.manage_shell(
        "from webapp.runs import services; from webapp.runs.models import Run, Plan; "
        f"services.run_transition(run=Run.objects.get(pk={run['id']}), target='starting', "
        f"chosen_plan=Plan.objects.get(pk={plans['exact']['id']}))")
    return {"id": run["id"], "plan": plans["exact"], "clients": run["split"]["clients"],
            "helper": run["split"]["helpers"][0]}


def passes(run: int, uid: str, pipeline: int, batch: int, start: float) -> list[dict[str, Any]]:
    """A client's part-1 forward and backward of one batch."""
    return [{"run": run, "device": uid, "stage": 0, "kind": kind, "microbatch": batch,
             "version": batch, "start": start + a, "end": start + b, "bytes": 0,
             "pipeline": pipeline}
            for kind, a, b in (("forward", 0.0, 0.05), ("backward", 0.4, 0.5))]


def test_the_split_card_follows_the_clients_and_the_rounds(visit: Visit, server: Server, lab):
    page = visit.page
    spec, devices = lab
    run = starting_split_run(server, spec, devices)
    names = {d["uid"]: d["name"] for d in devices}
    (c0, c1), helper = run["clients"], run["helper"]
    visit.login(server.password)
    visit.go(f"/runs/{run['id']}/")
    page.wait_for_selector("#conn.live")
    # the plans: the helper's part-2 of both clients, in words
    page.wait_for_selector(f'[data-plan-layout="{run["plan"]["id"]}"]', timeout=LIVE_WITHIN_S)
    layout = page.locator(f'[data-plan-layout="{run["plan"]["id"]}"]').inner_text()
    assert "part-2" in layout and names[helper] in layout and "2 clients, 1 helper" in layout
    assert page.locator("#split-empty").is_visible()
    # the strip under the run's name: its clients and helpers, not a chain of stages
    strip = page.locator("#pipeline").inner_text()
    assert f"clients · {names[c0]}, {names[c1]}" in strip and "replicas" not in strip
    # the agents report: both clients finish batch 0 and 1, the first also batch 2
    agents = Agents(server, run["id"], devices)
    agents.report(c0, timeline=passes(run["id"], c0, 0, 0, 0.0) + passes(run["id"], c0, 0, 1, 1.0)
                  + passes(run["id"], c0, 0, 2, 2.0))
    agents.report(c1, timeline=passes(run["id"], c1, 1, 0, 0.1)
                  + passes(run["id"], c1, 1, 1, 1.3))
    page.wait_for_function("""() => {
        const rows = document.querySelectorAll('#split-clients tbody tr');
        return rows.length === 2 && rows[0].textContent.includes('3 / 6')
          && rows[1].textContent.includes('2 / 6');
      }""", timeout=LIVE_WITHIN_S)
    rows = page.locator("#split-clients tbody tr").all_inner_texts()
    assert names[c0] in rows[0] and names[c1] in rows[1]
    assert all(names[helper] in row for row in rows)
    # the makespans: batch 0 from 0.0 to 0.6 (the second client's end), batch 1 to 1.8
    drawn = page.evaluate("() => document.getElementById('split-makespan').data"
                          ".map(t => ({name: t.name, x: t.x, y: t.y}))")
    measured = next(t for t in drawn if t["name"] == "measured")
    assert measured["x"] == [1, 2]
    assert measured["y"] == pytest.approx([0.6, 0.8])
    planned = next(t for t in drawn if t["name"] == "planned")
    assert planned["y"][0] == pytest.approx(run["plan"]["period_s"])
    assert "planned" in page.locator("#split-hint").inner_text()
    # a round evaluated by the server: its accuracy in the rounds table and on the chart
    server.manage_shell(
        "from webapp.runs.models import Run; from webapp.runs.services import control, ingest;"
        " from webapp.runs import events; "
        f"run = Run.objects.get(pk={run['id']}); "
        "events.run_event_send(run.pk, events.event_metrics(ingest.metric_points_store("
        "run=run, points=[{'at': 1.9, 'kind': 'test_accuracy', 'device': '', 'value': 0.875}])));"
        " control.control_event(run, 'round_evaluated', at=1.9, detail={'round': 1, "
        "'applied': 3, 'accuracy': 0.875, 'samples': 360})")
    page.wait_for_selector('#split-rounds tbody tr[data-round="1"]', timeout=LIVE_WITHIN_S)
    assert "87.5%" in page.locator("#split-rounds tbody tr").inner_text()
    assert page.locator("#split-rounds-empty").is_hidden()
    visit.screenshot("split-run")
