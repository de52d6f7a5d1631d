"""The dashboard in a real Chromium against a real server: log in, enrol a device and watch it
come online, create a run through the form, and watch a running run's page fill from the
events its agents post. Screenshots in tests/artifacts/."""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import Server, Visit
from tests.webapp.integration.stack import enrol, resnet_testbed

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

LIVE_WITHIN_S = 30_000  # ms: what the page may take to show what the server received


def agent_client(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.base, timeout=30, trust_env=False)


@pytest.fixture(scope="module")
def lab(server: Server) -> tuple[int, list[dict[str, Any]]]:
    """Three devices of the ResNet-101 testbed, enrolled with one token and profiled through
    the agent API as their agents would; the model spec id and the enrolment answers."""
    spec, devices = resnet_testbed()
    return enrol(server.api(), spec, devices[:3])


def summary(page: Any) -> tuple[int, int]:
    """The Devices page's counts: online (training or not), and training."""
    text = page.inner_text("#devices-summary")
    found = re.fullmatch(r"(\d+) online \((\d+) training\) · \d+ offline", text)
    assert found is not None, text
    return int(found.group(1)), int(found.group(2))


def test_log_in_then_enrol_a_device_and_see_it_come_online(visit: Visit, server: Server):
    page = visit.page
    # a page asks for the login first, then comes back
    visit.go("/devices/")
    page.wait_for_url(re.compile(r"/login/\?next=/devices/"))
    page.fill("#id_username", "admin")
    page.fill("#id_password", "wrong password")
    page.click("button[type=submit]")
    assert "Please enter a correct username and password" in page.inner_text(".form-error")
    visit.screenshot("login-error")
    page.fill("#id_password", server.password)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/devices/$"))
    page.wait_for_selector("#conn.live")
    # Add device: a token and the exact commands to run on the device
    page.click("#add-device")
    page.fill("#id_name", "pi kitchen")
    page.click("text=Create enrolment token")
    commands = [c.inner_text() for c in page.query_selector_all("#commands code")]
    assert commands[0] == "pip install -r requirements-agent.txt"
    assert commands[2] == "python -m agent run"
    enrol = re.fullmatch(r"python -m agent enrol --server (\S+) --token (ept_\S+) "
                         r"--name 'pi kitchen'", commands[1])
    assert enrol is not None, commands[1]
    assert enrol.group(1) == server.base
    visit.screenshot("devices-enrolment")
    page.wait_for_selector("#conn.live")
    # the agent enrols with that token: the page shows the device online without a reload
    answer = agent_client(server).post("/api/agent/enrol/", json={
        "token": enrol.group(2), "name": "pi kitchen", "memory_bytes": 4 * 2**30,
        "bandwidth_bps": 12_500_000, "hardware": {"cpu": "Cortex-A72", "os": "Linux 6.6"}})
    assert answer.status_code == 201, answer.text
    device = answer.json()
    row = f'tr[data-device="{device["uid"]}"]'
    page.wait_for_selector(f"{row} .badge-online", timeout=LIVE_WITHIN_S)
    assert "Cortex-A72" in page.inner_text(row)
    assert summary(page)[0] >= 1
    # a heartbeat saying it trains makes it busy, still without a reload
    beat = agent_client(server).post("/api/agent/heartbeat/", json={"status": "busy"},
                                     headers={"Authorization": device["authorization"]})
    assert beat.status_code == 200, beat.text
    page.wait_for_selector(f"{row} .badge-busy", timeout=LIVE_WITHIN_S)
    # counted online as the overview counts it (the page said "0 online · 1 busy")
    online, training = summary(page)
    assert online >= training >= 1
    visit.screenshot("devices-live")
    # the device's own page, renamed through its form
    page.click(f"{row} a.name")
    page.fill("#id_name", "")
    page.click("button:has-text(\"Rename\")")
    assert "This field may not be blank." in page.inner_text(".field.has-error .field-error")
    page.fill("#id_name", "pi in the kitchen")
    page.click("button:has-text(\"Rename\")")
    page.wait_for_selector("text=Renamed to pi in the kitchen")
    assert page.inner_text("#device-name") == "pi in the kitchen"
    # asking it to profile a model: the API's errors next to the fields, then the reason
    page.click("#profile-open")
    page.click("#profile-form button[type=submit]")
    page.wait_for_selector('[data-for="model"]:not([hidden])')
    assert page.inner_text('[data-for="model"]') == "This field may not be blank."
    page.fill("#id_model", "vgg5")
    page.fill("#id_dataset", "digits")
    page.click("#profile-form button[type=submit]")
    page.wait_for_selector("#profile-error:not([hidden])")
    assert "has no agent connected" in page.inner_text("#profile-error")
    assert page.locator("#profile-form .has-error").count() == 0
    visit.screenshot("device-detail-empty")


def test_create_a_run_through_the_form(visit: Visit, server: Server, lab):
    page = visit.page
    spec, devices = lab
    visit.login(server.password)
    visit.go("/runs/new/")
    page.fill("#id_name", "resnet on three")
    page.select_option("#id_model_spec", str(spec))
    for device in devices:  # tick them, then move the last to the top
        page.check(f"#dev-{device['id']}")
    row = page.locator(f".choice:has(#dev-{devices[2]['id']})")
    for _ in range(page.locator(".choice").count()):
        row.locator("[data-move=up]").click()
    page.check("input[name=algorithms][value=tapp]")  # besides the quick planners
    assert page.is_checked("#id_vertical_sync")  # the run's default
    page.uncheck("#id_vertical_sync")
    page.fill("#id_aggregate_every", "3")
    page.fill("#id_microbatches", "0")
    page.click("text=Create and plan")
    # refused: the reason next to the field, the rest of the form as it was
    error = page.locator(".field.has-error:has(#id_microbatches) .field-error")
    assert error.inner_text() == "Ensure this value is greater than or equal to 1."
    assert page.locator(".field.has-error").count() == 1
    assert page.input_value("#id_name") == "resnet on three"
    assert not page.is_checked("#id_vertical_sync")
    assert page.input_value("#id_aggregate_every") == "3"
    visit.screenshot("run-new-error")
    order = [int(v) for v in page.eval_on_selector_all(
        "#device-choices input:checked", "els => els.map(e => e.value)")]
    assert order == [devices[2]["id"], devices[0]["id"], devices[1]["id"]]
    page.fill("#id_microbatches", "4")
    page.click("text=Create and plan")
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    run = server.api().get(f"/api/runs/{run_id}/")
    assert [d["id"] for d in run["devices"]] == order and run["microbatches"] == 4
    assert (run["vertical_sync"], run["aggregate_every"]) == (False, 3)
    # planned by the worker; the page asks for snapshots while planning (embedded setup)
    page.wait_for_selector("#run-state.badge-planned", timeout=60_000)
    page.wait_for_selector("#plans-why:not([hidden])")
    assert "has the shortest predicted period" in page.inner_text("#plans-why")
    done = sum(1 for p in server.api().get(f"/api/runs/{run_id}/plans/")
               if p["status"] == "done")
    page.wait_for_function(f"document.querySelectorAll('#plan-gantts .plan-gantt .main-svg')"
                           f".length >= {done}", timeout=LIVE_WITHIN_S)
    assert page.locator("#plans-table tr.is-best").count() == 1
    # TAPP's training curve, from the snapshots the page polled while it learned
    training = page.locator("#plan-trainings .plan-training")
    training.locator(".main-svg").first.wait_for(timeout=LIVE_WITHIN_S)
    assert re.fullmatch(r"tapp\s+\d+ episodes · best step \S+ \S+", training.locator("h3")
                        .inner_text()), training.locator("h3").inner_text()
    assert training.locator(".scatterlayer .trace").count() == 2  # best, episode's samples
    visit.screenshot("run-planned")


def measured_batches(planned: dict[str, Any], rows: list[str]) -> list[dict[str, list]]:
    """The planned timeline as the agents would measure it, a little slower the further down
    the pipeline (so measured bars drift from the planned ghosts), cut into four batches in
    time order; each device reports its own events."""
    events = sorted(planned["events"], key=lambda e: e["start"])
    slow = {uid: 1.0 + 0.06 * k for k, uid in enumerate(rows)}
    for e in events:
        e["start"], e["end"] = e["start"] * slow[e["device"]], e["end"] * slow[e["device"]]
    quarter = max(e["end"] for e in events) / 4
    batches: list[dict[str, list]] = [defaultdict(list) for _ in range(4)]
    for e in events:
        batches[min(3, int(e["start"] // quarter))][e["device"]].append(e)
    return batches


def test_a_running_run_page_fills_live_from_the_agents_events(visit: Visit, server: Server,
                                                              lab):
    page = visit.page
    user = server.api()
    spec, devices = lab
    run = user.post("/api/runs/", {"name": "live", "model_spec": spec, "devices": [
        d["id"] for d in devices], "algorithms": ["ftpipehd", "uniform"], "microbatches": 4,
        "schedule": "gpipe"}, expect=201)
    user.post(f"/api/runs/{run['id']}/plan/", {}, expect=202)
    planned = user.wait_run(run["id"], ("planned",), timeout=60)
    best = user.get(f"/api/runs/{run['id']}/plans/compare/")["best"]
    # The agents' deployment is not this test's subject: the run moves to starting with the
    # best plan through the state machine's service, in the server's database.
    server.manage_shell(
        "from webapp.runs import services; from webapp.runs.models import Run, Plan; "
        f"run = Run.objects.get(pk={run['id']}); "
        f"services.run_transition(run=run, target='starting', chosen_plan=Plan.objects.get("
        f"pk={best}))")
    visit.login(server.password)
    visit.go(f"/runs/{run['id']}/")
    page.wait_for_selector("#conn.live")
    page.wait_for_selector("#run-state.badge-starting")
    assert page.is_visible("#gantt-empty")
    # the agents report: each device posts its own timeline, metrics and a control event
    timeline = user.get(f"/api/dashboard/runs/{run['id']}/plans/{best}/timeline/?batches=6")
    rows = [d["uid"] for d in planned["devices"]]
    keys = {d["uid"]: d["authorization"] for d in devices}
    agent = agent_client(server)
    renders, posted_at = page.evaluate("EdgePipe.runPage.renders"), time.monotonic()
    for k, batch in enumerate(measured_batches(timeline, rows)):
        end = max(e["end"] for events in batch.values() for e in events)
        for uid in rows:
            body: dict[str, Any] = {"timeline": batch[uid]}
            if uid == rows[0]:
                body["metrics"] = [
                    {"at": end, "kind": "throughput_sps", "value": 20.0 + 3 * k},
                    {"at": end, "kind": "network_bps", "value": 2.5e6 + 4e5 * k},
                    {"at": end, "kind": "loss", "value": 2.3 - 0.4 * k},
                    {"at": end, "kind": "accuracy", "value": 0.1 + 0.15 * k}]
                if k == 0:
                    body["faults"] = [{"run": run["id"], "at": 0.0, "kind": "run_started",
                                       "detail": {"plan": best}}]
            if k == 3 and uid == rows[1]:  # inside the Gantt's last minute: a marker
                body["faults"] = [{"run": run["id"], "at": end - 1.0, "kind": "repartitioned",
                                   "device": uid, "detail": {"reason": "slower than planned"}}]
            answer = agent.post(f"/api/agent/runs/{run['id']}/events/", json=body,
                                headers={"Authorization": keys[uid]})
            assert answer.status_code == 201, answer.text
    # the live Gantt: bars on every device's row, ghosts of the plan beneath
    page.wait_for_function(
        """rows => {
             if (!EdgePipe.runPage.ganttItems) return false;
             const seen = new Set(EdgePipe.runPage.ganttItems('events').map(b => b.row));
             return rows.every((_, i) => seen.has(i));
           }""", arg=rows, timeout=LIVE_WITHIN_S)
    page.wait_for_function("() => EdgePipe.runPage.ganttItems('ghost').length > 0",
                           timeout=LIVE_WITHIN_S)
    legend = page.locator("#gantt .legend .legendtext").all_text_contents()
    assert "forward" in legend and "planned forward" in legend
    # the idle breakdown for each device, throughput and training curves, the fault log
    page.wait_for_function(
        f"() => (document.getElementById('idle').data || []).length === 5 && "
        f"document.getElementById('idle').data[0].y.length === {len(rows)}",
        timeout=LIVE_WITHIN_S)
    page.wait_for_function(
        "() => (document.getElementById('throughput').data || []).length === 3 && "
        "document.getElementById('throughput').data[0].x.length === 4", timeout=LIVE_WITHIN_S)
    # measured against the chosen plan's prediction (a dashed step line), and the network
    assert page.evaluate("document.getElementById('throughput').data.map(t => t.name)") == [
        "samples/s", "predicted (plan)", "network MB/s"]
    assert page.evaluate("document.getElementById('training').data.length") == 2
    # the last batch's fault may come after its metrics: wait for it too
    page.wait_for_function("() => document.getElementById('faults').innerText"
                           ".includes('repartitioned')", timeout=LIVE_WITHIN_S)
    assert "run started" in page.inner_text("#faults")
    page.wait_for_function(
        "() => document.getElementById('gantt').data"
        ".some(t => t.name === 'fault / control event' && t.x.length === 1)",
        timeout=LIVE_WITHIN_S)
    # many deltas, few redraws: at most one every 250 ms
    redraws = page.evaluate("EdgePipe.runPage.renders") - renders
    assert redraws <= (time.monotonic() - posted_at) / 0.25 + 1
    visit.screenshot("run-live")
    # the page's state, brought forward by the deltas, equals a fresh snapshot
    fresh = page.evaluate(
        """path => new Promise((resolve, reject) => {
             const ws = new WebSocket('ws://' + location.host + path);
             ws.onmessage = m => { ws.close(); resolve(JSON.parse(m.data)); };
             ws.onerror = reject;
           })""", f"/ws/runs/{run['id']}/")
    page.wait_for_function(
        """fresh => {
             const state = EdgePipe.runPage.state();
             return state.timeline.length === fresh.timeline.length &&
               JSON.stringify(state.idle) === JSON.stringify(fresh.idle);
           }""", arg=fresh, timeout=LIVE_WITHIN_S)
    state = page.evaluate("EdgePipe.runPage.state()")
    for key in ("run", "plans", "timeline", "metrics", "faults", "idle", "window_s"):
        assert state[key] == fresh[key], key
    assert state["timeline"] and len(state["idle"]["devices"]) == len(rows)
    # a lost connection comes back by itself, with a fresh snapshot
    snapshots = page.evaluate("EdgePipe.runPage.snapshots")
    page.evaluate("EdgePipe.runPage.socket.ws.close()")
    page.wait_for_function(f"EdgePipe.runPage.snapshots > {snapshots}", timeout=LIVE_WITHIN_S)
    page.wait_for_selector("#conn.live")
    # the downloads: a trace Perfetto opens, the metrics, the plan
    with page.expect_download() as download:
        page.click("text=Timeline trace")
    trace = json.loads(Path(download.value.path()).read_text())
    processes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
                 if e["name"] == "process_name"}
    assert processes.pop(0) == f"run {run['id']}: live"  # run-wide metrics and events
    assert sorted(processes) == [1, 2, 3]
    assert all(uid in processes[k + 1] for k, uid in enumerate(rows))
    assert {e["ph"] for e in trace["traceEvents"]} >= {"X", "M", "i", "C"}
    with page.expect_download() as download:
        page.click("text=Metrics CSV")
    lines = Path(download.value.path()).read_text().splitlines()
    assert lines[0] == "at_s,kind,device,value" and len(lines) == 1 + 16
    with page.expect_download() as download:
        page.click("#export-plan")
    plan = json.loads(Path(download.value.path()).read_text())
    assert [s["devices"] for s in plan["stages"]] and plan["algorithm"] in ("ftpipehd",
                                                                            "uniform")


def test_every_page_renders_and_loads_only_from_the_server(visit: Visit, server: Server,
                                                          lab):
    page = visit.page
    _, devices = lab
    visit.login(server.password)
    visit.screenshot("overview")
    for path, name in [("/runs/", "runs"), ("/devices/", "devices"), ("/runs/new/", "run-new")]:
        visit.go(path)
        page.wait_for_load_state("networkidle")
        visit.screenshot(name)
    visit.go(f"/devices/{devices[0]['id']}/")
    page.wait_for_selector("#profile-chart .main-svg")
    visit.screenshot("device-detail")
    assert f"{server.base}/static/vendor/plotly.min.js" in visit.requests
    # two runs ticked on the Runs page, compared side by side
    user = server.api()
    spec, _ = lab
    for name in ("compare me", "and me"):
        user.post("/api/runs/", {"name": name, "model_spec": spec, "devices": [
            d["id"] for d in devices], "algorithms": ["uniform"]}, expect=201)
    visit.go("/runs/")
    boxes = page.locator('input[name="runs"]')
    boxes.nth(0).check()
    boxes.nth(1).check()
    page.click("text=Compare selected")
    page.wait_for_url(re.compile(r".*/runs/compare/\?runs=\d+&runs=\d+$"))
    assert page.locator("#compare thead th").count() == 3  # the labels, then two runs
    heads = page.inner_text("#compare thead").lower()  # shown in capitals
    assert "and me" in heads and "compare me" in heads
    visit.screenshot("runs-compare")


def test_the_page_trims_its_window_as_the_server_does(visit: Visit, server: Server):
    """EdgePipe.live.applyRun (the page) and webapp.runs.events.snapshot_apply (the server)
    bring one snapshot forward by the same deltas to the same window, the newest-events cap
    included: events out of order, ties on end, more than the cap."""
    import random

    from webapp.runs.events import snapshot_apply

    rng = random.Random(7)

    def event(m: int) -> dict[str, Any]:
        start = round(rng.uniform(0, 80), 1)
        return {"run": 1, "device": rng.choice(["a", "b", "c"]), "stage": rng.randrange(3),
                "kind": rng.choice(["forward", "backward", "send"]), "microbatch": m,
                "version": 0, "start": start, "end": round(start + rng.choice([0.1, 0.5]), 1),
                "bytes": 0}

    snapshot = {"type": "snapshot", "run": {}, "plans": [], "window_s": 60.0,
                "timeline_limit": 12, "timeline": [], "metrics": [], "faults": [], "idle": {}}
    deltas = [{"type": "timeline",
               "events": [event(10 * k + i) for i in range(rng.randrange(1, 9))]}
              for k in range(12)]
    expected = snapshot
    for delta in deltas:
        expected = snapshot_apply(expected, delta)
    visit.login(server.password)
    visit.go("/devices/")  # a page with the live script
    got = visit.page.evaluate(
        """([snapshot, deltas]) => deltas.reduce(
             (s, d) => EdgePipe.live.applyRun(s, d), snapshot).timeline""", [snapshot, deltas])
    assert len(expected["timeline"]) == 12
    assert got == expected["timeline"]
