"""Faults on the run page in a real Chromium against a real server: a recovery reported by the
agents fills the "Faults and recoveries" panel phase by phase and marks the live Gantt; the
page groups fault events into recoveries exactly as the server's selector does; and "Stop
agent" sends the device's agent its exit command (or says why it cannot). Screenshots in
tests/artifacts/."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import ARTIFACTS, Server, Visit
from tests.browser.test_dashboard import LIVE_WITHIN_S, agent_client
from tests.webapp.integration.stack import enrol, generated_testbed

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def fault_lab(server: Server) -> tuple[int, list[dict[str, Any]]]:
    """Three generated devices (their own model spec), enrolled and profiled through the agent
    API as their agents would; the model spec id and the enrolment answers."""
    spec, devices = generated_testbed(seed=11, layers=9, devices=3)
    return enrol(server.api(), spec, devices)


def starting_run(server: Server, spec: int, devices: list[dict[str, Any]], name: str
                 ) -> tuple[int, list[str]]:
    """A run planned by ftpipehd (every device, in order: three stages) and moved to starting
    with that plan through the state machine (the agents' deployment is not these tests'
    subject); its id and the uids of its stages' devices."""
    user = server.api()
    run = user.post("/api/runs/", {"name": name, "model_spec": spec, "devices": [
        d["id"] for d in devices], "algorithms": ["ftpipehd"], "microbatches": 4}, expect=201)
    user.post(f"/api/runs/{run['id']}/plan/", {}, expect=202)
    user.wait_run(run["id"], ("planned",), timeout=60)
    [plan] = user.get(f"/api/runs/{run['id']}/plans/")
    server.manage_shell(
        "from webapp.runs import services; from webapp.runs.models import Run, Plan; "
        f"services.run_transition(run=Run.objects.get(pk={run['id']}), target='starting', "
        f"chosen_plan=Plan.objects.get(pk={plan['id']}))")
    return run["id"], [s["devices"][0] for s in plan["document"]["stages"]]


def fault(run: int, at: float, kind: str, device: str | None = None, **detail: Any
          ) -> dict[str, Any]:
    out: dict[str, Any] = {"run": run, "at": at, "kind": kind, "detail": detail}
    if device is not None:
        out["device"] = device
    return out


def trained(run: int, uid: str, stage: int, starts: list[float]) -> list[dict[str, Any]]:
    return [{"run": run, "device": uid, "stage": stage, "kind": kind, "microbatch": m,
             "version": 0, "start": t + (0.2 if kind == "backward" else 0.0),
             "end": t + (0.4 if kind == "backward" else 0.15), "bytes": 0}
            for m, t in enumerate(starts) for kind in ("forward", "backward")]


def test_a_recovery_fills_the_faults_panel_live_and_marks_the_gantt(
        visit: Visit, server: Server, fault_lab):
    page = visit.page
    spec, devices = fault_lab
    run, (a, b, c) = starting_run(server, spec, devices, "recovers")
    keys = {d["uid"]: d["authorization"] for d in devices}
    labels = {d["uid"]: d["name"] for d in devices}
    agent = agent_client(server)

    def report(uid: str, **body: Any) -> None:
        answer = agent.post(f"/api/agent/runs/{run}/events/", json=body,
                            headers={"Authorization": keys[uid]})
        assert answer.status_code == 201, answer.text

    visit.login(server.password)
    visit.go(f"/runs/{run}/")
    page.wait_for_selector("#conn.live")
    assert page.is_visible("#recoveries-empty")
    # three stages train until b is lost at 20 s
    before = [0.5 * k for k in range(40)]
    for k, uid in enumerate((a, b, c)):
        report(uid, timeline=trained(run, uid, k, before))
    report(a, faults=[fault(run, 20.0, "device_lost", b, reason="control connection closed",
                            detected_by="disconnect"),
                      fault(run, 20.0, "recovery_started", generation=1, lost=[b])])
    # under way: the phase reached so far, and the device marked lost
    page.wait_for_selector('#recoveries-table tbody[data-phase="detected"]',
                           timeout=LIVE_WITHIN_S)
    assert page.is_hidden("#recoveries-empty")
    lost = page.inner_text(f'[data-lost-for="{b}"]')
    assert "lost at 20.0 s (disconnect)" in lost and "recovering" in lost
    # re-planned on a and c, weights moved, resumed at micro-batch 48
    stages = [{"devices": [a], "layers": [0, 4]}, {"devices": [c], "layers": [5, 8]}]
    report(a, faults=[
        fault(run, 20.5, "repartitioned", generation=1, cause="failure", planner="ftpipehd",
              stages=stages, predicted_throughput_sps=80.0, resume_microbatch=48),
        fault(run, 22.0, "weights_redistributed", generation=1, bytes_moved=4 * 2**20,
              transfers=3, duration_s=1.2),
        fault(run, 22.25, "recovered", generation=1, recovery_s=2.25, resume_microbatch=48,
              microbatches_redone=6)])
    after = [22.25 + 0.5 * k for k in range(56)]  # up to 50 s
    report(a, timeline=trained(run, a, 0, after))
    report(c, timeline=trained(run, c, 1, after))
    row = page.locator('#recoveries-table tbody[data-phase="resumed"]')
    row.wait_for(timeout=LIVE_WITHIN_S)
    text = row.inner_text()
    for part in ("lost device", f"{labels[b]} (disconnect)", "20.000 s", "20.500 s (+500 ms)",
                 "22.000 s (+1.5 s)", "4 MiB in 3 transfers", "22.250 s (+250 ms)", "2.25 s",
                 "micro-batch 48", "new plan: ftpipehd", f"{labels[a]} [0–4] → {labels[c]} [5–8]",
                 "80 samples/s predicted"):
        assert part in text, (part, text)
    assert "resumed without it at 22.3 s" in page.inner_text(f'[data-lost-for="{b}"]')
    # dynamic re-partitions: one not worth it, one made; each with its break-even
    report(c, faults=[
        fault(run, 30.0, "repartition_skipped", saved_s=0.8, cost_s=3.0,
              predicted_throughput_sps=82.0, measured_throughput_sps=78.0),
        fault(run, 39.6, "recovery_started", generation=2, lost=[]),
        fault(run, 40.0, "repartitioned", generation=2, cause="dynamic", planner="ftpipehd",
              stages=stages, predicted_throughput_sps=90.0, resume_microbatch=120,
              saved_s=25.0, cost_s=4.0),
        fault(run, 41.0, "weights_redistributed", generation=2, bytes_moved=2**20,
              transfers=1),
        fault(run, 41.5, "recovered", generation=2, recovery_s=1.5, microbatches_redone=2)])
    page.wait_for_function("document.querySelectorAll('#recoveries-table tbody[data-recovery]')"
                           ".length === 3", timeout=LIVE_WITHIN_S)
    skipped = page.inner_text('#recoveries-table tbody[data-phase="skipped"]')
    assert "dynamic check" in skipped and "saves 800 ms ≤ costs 3 s: skipped" in skipped
    assert "a new plan predicted 82 samples/s against 78 measured" in skipped
    moved = page.inner_text('#recoveries-table tbody[data-cause="dynamic"][data-phase="resumed"]')
    assert "saves 25 s > costs 4 s: moved" in moved
    assert "1 recovery · 1 dynamic re-partition · 1 skipped" in page.inner_text(
        "#recoveries-hint")
    # the timeline chart: each phase a bar per recovery, the skipped check a point
    chart = page.evaluate("""() => document.getElementById('recoveries-chart').data.map(
        t => ({name: t.name, type: t.type, x: t.x, base: t.base || null}))""")
    bars = {t["name"]: t for t in chart if t["type"] == "bar"}
    assert bars["lost (or decided) → re-planned"]["base"] == [20.0, 39.6]
    assert bars["lost (or decided) → re-planned"]["x"] == pytest.approx([0.5, 0.4])
    assert bars["re-planned → weights moved"]["base"] == [20.5, 40.0]
    assert bars["weights moved → resumed"]["x"] == pytest.approx([0.25, 0.5])
    assert [t["x"] for t in chart if t["type"] == "scatter"] == [[30.0]]
    # the live Gantt: a dashed line and a label at each loss, re-plan and resumption
    page.wait_for_function(
        """() => ((document.getElementById('gantt').layout || {}).annotations || [])
                   .some(a => a.text.startsWith('resumed · gen 2'))""", timeout=LIVE_WITHIN_S)
    notes = page.evaluate(
        "document.getElementById('gantt').layout.annotations.map(a => [a.x, a.text])")
    assert [20.0, f"lost {labels[b]}"] in notes
    assert [20.5, "re-planned · gen 1"] in notes and [22.25, "resumed · gen 1"] in notes
    assert [40.0, "re-planned (dynamic) · gen 2"] in notes
    dashed = page.evaluate("""() => document.getElementById('gantt').layout.shapes
        .filter(s => s.line.dash === 'dash').map(s => s.x0)""")
    assert sorted(dashed) == [20.0, 20.5, 22.25, 40.0, 41.5]
    visit.screenshot("run-faults")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#recoveries-card").screenshot(path=str(ARTIFACTS / "run-recoveries.png"))
    page.locator("#gantt-card").screenshot(path=str(ARTIFACTS / "run-gantt-faults.png"))
    # a long run checks often: the table keeps the newest five checks, the chart every one
    report(c, faults=[fault(run, 42.0 + k, "repartition_skipped", saved_s=0.1 * k, cost_s=2.0)
                      for k in range(6)])
    page.wait_for_selector("#recoveries-table tbody.more", timeout=LIVE_WITHIN_S)
    assert page.inner_text("#recoveries-table tbody.more").strip() == (
        "2 earlier checks kept the plan (each on the chart above)")
    assert page.locator('#recoveries-table tbody[data-phase="skipped"]').count() == 5
    assert page.locator('#recoveries-table tbody[data-phase="resumed"]').count() == 2
    assert page.evaluate("""() => document.getElementById('recoveries-chart').data
        .find(t => t.type === 'scatter').x.length""") == 7
    # what the page shows is the server's grouping of the run's faults
    from webapp.runs.summaries import fault_recoveries

    fresh = page.evaluate(
        """path => new Promise((resolve, reject) => {
             const ws = new WebSocket('ws://' + location.host + path);
             ws.onmessage = m => { ws.close(); resolve(JSON.parse(m.data)); };
             ws.onerror = reject;
           })""", f"/ws/runs/{run}/")
    assert page.evaluate("EdgePipe.runPage.recoveries") == fault_recoveries(fresh["faults"])


def test_the_page_groups_faults_into_recoveries_as_the_server_does(
        visit: Visit, server: Server, fault_lab):
    """EdgePipe.faults.recoveries (the page) and webapp.runs.summaries.fault_recoveries (the
    server) on the same events: out of order, a loss during a recovery, a run failing while
    recovering, dynamic re-partitions made and skipped, missing figures."""
    import random

    from tests.webapp.dashboard import test_recoveries as cases
    from webapp.runs.summaries import fault_recoveries

    spec, devices = fault_lab
    run, _ = starting_run(server, spec, devices, "groups")
    f = cases.fault
    scenarios = [
        cases.one_recovery(),
        cases.restarted(),
        cases.restarted()[:5],
        cases.one_recovery()[:4],
        [*cases.one_recovery()[:3], f(10.2, "run_failed", reason="layer 4 has no copy")],
        [f(10.0, "device_lost", "b", detected_by="heartbeat"),
         f(10.1, "recovery_started", generation=1, lost=["b"]),
         f(10.4, "device_lost", "c", detected_by="probe"),
         f(10.4, "recovery_started", generation=1, lost=["b", "c"]),
         f(11.0, "repartitioned", generation=1, cause="failure", stages=[
             {"devices": ["a"], "layers": [0, 8]}], resume_microbatch=16),
         f(11.5, "recovered", generation=1)],
        [*cases.one_recovery(),
         f(30.0, "repartition_skipped", saved_s=0.8, cost_s=3.0),
         f(60.0, "repartitioned", generation=2, cause="dynamic", planner="ftpipehd",
           stages=cases.STAGES_3, saved_s=25.0, cost_s=4.0, resume_microbatch=400),
         f(61.0, "weights_redistributed", generation=2, bytes_moved=10, transfers=1),
         f(61.5, "recovered", generation=2, microbatches_redone=4),
         f(70.0, "device_lost", "a", detected_by="killed"),
         f(70.0, "run_failed", error="no device left")],
        [f(0.0, "run_started"), f(3.0, "device_joined", "d"), f(5.0, "run_paused")],
        [f(59.5, "recovery_started", generation=2, lost=[]),
         f(60.0, "repartitioned", generation=2, cause="dynamic", saved_s=25.0, cost_s=4.0),
         f(60.5, "device_lost", "b", detected_by="disconnect"),
         f(60.5, "recovery_started", generation=3, lost=["b"]),
         f(61.0, "repartitioned", generation=3, cause="failure", resume_microbatch=380),
         f(62.0, "recovered", generation=3, recovery_s=2.5)],
        [f(5.0, "repartitioned", generation=1, stages="not a list", resume_microbatch="x"),
         f(6.0, "recovered", generation=True, microbatches_redone=None)],
    ]
    rng = random.Random(3)
    shuffled = []
    for events in scenarios:
        copy = list(events)
        rng.shuffle(copy)
        shuffled.append(copy)
    visit.login(server.password)
    visit.go(f"/runs/{run}/")
    page = visit.page
    page.wait_for_selector("#conn.live")
    got = page.evaluate("all => all.map(events => EdgePipe.faults.recoveries(events))",
                        [*scenarios, *shuffled])
    assert got == [fault_recoveries(events) for events in [*scenarios, *shuffled]]
    assert [len(g) for g in got[:len(scenarios)]] == [1, 1, 1, 1, 1, 1, 4, 0, 1, 1]


def test_stop_agent_from_the_run_page(visit: Visit, server: Server, fault_lab):
    page = visit.page
    spec, devices = fault_lab
    run, _ = starting_run(server, spec, devices, "stop an agent")
    connected, unreachable = devices[0], devices[1]
    # the first device's agent is connected (its control connection, as the gateway records
    # it); the second has none
    server.manage_shell(
        "from django.utils import timezone; from webapp.devices.models import Device; "
        f"Device.objects.filter(uid='{connected['uid']}').update(control_channel='test.x!1', "
        "status='online', last_heartbeat_at=timezone.now()); "
        f"Device.objects.filter(uid='{unreachable['uid']}').update(control_channel='')")
    visit.login(server.password)
    visit.go(f"/runs/{run}/")
    page.wait_for_selector("#conn.live")
    assert page.locator("#run-devices [data-stop-agent]").count() == 3
    with page.expect_response(lambda r: r.url.endswith(
            f"/api/devices/{connected['id']}/stop-agent/")) as answer:
        page.click(f'[data-stop-agent="{connected["id"]}"]')  # the confirm is accepted
    assert answer.value.status == 202
    sent = answer.value.json()
    assert sent["device"] == connected["uid"] and sent["sent"] == "exit"
    notice = page.locator("#device-notice")
    notice.wait_for(state="visible")
    assert notice.inner_text() == (f"Sent exit to {connected['name']}'s agent (command "
                                   f"{sent['command']}): it stops at once.")
    assert "error" not in (notice.get_attribute("class") or "")
    visit.screenshot("run-stop-agent")
    # a device without an agent: the server's reason, as an error
    with page.expect_response(lambda r: r.url.endswith(
            f"/api/devices/{unreachable['id']}/stop-agent/")) as answer:
        page.click(f'[data-stop-agent="{unreachable["id"]}"]')
    assert answer.value.status == 409
    page.wait_for_selector("#device-notice.error")
    assert "has no agent connected" in page.inner_text("#device-notice")
    server.manage_shell(
        "from webapp.devices.models import Device; "
        f"Device.objects.filter(uid='{connected['uid']}').update(control_channel='')")
