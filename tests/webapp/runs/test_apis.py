import pytest

from tests.webapp.factories import DATA_KEY, DeviceFactory, PlanFactory, RunFactory
from webapp.gateway.services import agent_message
from webapp.runs.models import MetricPoint, Run, RunDevice, TimelineEvent

pytestmark = pytest.mark.django_db


def test_plan_a_run_on_the_testbed_compare_its_plans_and_start_the_best(
        api, resnet_testbed, django_capture_on_commit_callbacks):
    # Prepare
    created = api.post("/api/runs/", {
        "name": "resnet on the lab", "model_spec": resnet_testbed.spec,
        "devices": resnet_testbed.ids, "algorithms": ["ftpipehd", "optimal", "bsp"],
        "microbatches": 4}, format="json")
    assert created.status_code == 201, created.json()
    run = created.json()
    assert run["state"] == "draft"
    assert [d["uid"] for d in run["devices"]] == [d.uid for d in resnet_testbed.devices]
    # Execute
    with django_capture_on_commit_callbacks(execute=True):
        planning = api.post(f"/api/runs/{run['id']}/plan/", {}, format="json")
    # Assert
    assert planning.status_code == 202 and planning.json()["state"] == "planning"
    detail = api.get(f"/api/runs/{run['id']}/").json()
    assert detail["state"] == "planned" and len(detail["plans"]) == 3
    plans = api.get(f"/api/runs/{run['id']}/plans/").json()
    assert {p["algorithm"] for p in plans} == {"ftpipehd", "optimal", "bsp"}
    for plan in plans:
        assert plan["status"] == "done" and plan["period_s"] > 0
        assert plan["simulated_throughput_sps"] > 0 and plan["simulation"]["devices"]
        used = {d for s in plan["document"]["stages"] for d in s["devices"]}
        assert used <= {d.uid for d in resnet_testbed.devices}
        assert plan["training"] == {}  # only learned planners train
    compared = api.get(f"/api/runs/{run['id']}/plans/compare/").json()
    fitting = [p for p in plans if p["memory_ok"]]
    best = min(fitting, key=lambda p: p["period_s"])
    assert compared["best"] == best["id"] and compared["rows"][0]["plan"] == best["id"]
    assert best["algorithm"] in compared["reason"]
    # optimal is exact on five devices: nothing beats it
    optimal = next(p for p in plans if p["algorithm"] == "optimal")
    assert optimal["period_s"] == pytest.approx(best["period_s"])
    # the devices' agents connect (their hello names their data planes), then the run starts
    for k, device in enumerate(resnet_testbed.devices):
        agent_message(device_id=device.id, message={
            "type": "hello", "data_key": DATA_KEY, "data_address": f"tcp://127.0.0.1:{5600 + k}"})
    started = api.post(f"/api/runs/{run['id']}/start/", {}, format="json")
    assert started.status_code == 200
    assert started.json()["state"] == "starting" and started.json()["chosen_plan"] == best["id"]
    staged = RunDevice.objects.filter(run_id=run["id"], stage__isnull=False)
    assert staged.count() == len(best["document"]["stages"])
    assert {rd.stage_state for rd in staged} == {"deploying"}


def test_a_learned_plan_shows_its_training_curve(api):
    curve = {"episodes": [1, 2, 3], "best_reward": [None, -0.8, -0.7],
             "mean_reward": [None, -1.1, -0.9]}
    run = RunFactory(state=Run.State.PLANNING)
    PlanFactory(run=run, algorithm="tapp", status="running", training=curve)
    plans = api.get(f"/api/runs/{run.pk}/plans/").json()
    assert plans[0]["algorithm"] == "tapp" and plans[0]["training"] == curve


def test_start_with_a_chosen_plan(api):
    run = RunFactory(state=Run.State.PLANNED)
    PlanFactory(run=run, algorithm="ftpipehd", period_s=0.1)
    slower = PlanFactory(run=run, algorithm="uniform", period_s=0.5)
    answer = api.post(f"/api/runs/{run.pk}/start/", {"plan": slower.pk}, format="json")
    assert answer.status_code == 200 and answer.json()["chosen_plan"] == slower.pk


def test_pause_resume_stop(api):
    run = RunFactory(state=Run.State.RUNNING)
    assert api.post(f"/api/runs/{run.pk}/pause/").json()["state"] == "paused"
    assert api.post(f"/api/runs/{run.pk}/start/", {}, format="json").json()["state"] == "running"
    stopped = api.post(f"/api/runs/{run.pk}/stop/")
    assert stopped.json()["state"] == "cancelled" and stopped.json()["finished_at"]


@pytest.mark.parametrize(("state", "action", "target"), [
    ("running", "plan", "planning"),
    ("draft", "start", "starting"),
    ("planned", "pause", "paused"),
    ("finished", "stop", "cancelled"),
    ("cancelled", "plan", "planning"),
])
def test_an_illegal_transition_is_409_saying_the_state_and_the_transition(
        api, state, action, target):
    run = RunFactory(state=state)
    answer = api.post(f"/api/runs/{run.pk}/{action}/", {}, format="json")
    assert answer.status_code == 409
    body = answer.json()
    assert body["state"] == state and body["action"] == action
    assert body["transition"] == f"{state} -> {target}"
    assert body["detail"] == (f"run {run.pk} is {state}: cannot {action} it (transition "
                              f"{state} -> {target} is not allowed)")
    run.refresh_from_db()
    assert run.state == state


def test_runs_list_filters_by_state(api):
    planned = RunFactory(state=Run.State.PLANNED)
    RunFactory()
    assert [r["id"] for r in api.get("/api/runs/?state=planned").json()] == [planned.pk]
    assert len(api.get("/api/runs/").json()) == 2
    assert api.get("/api/runs/?state=sleeping").status_code == 400


def test_unknown_run_is_404(api):
    for url in ("/api/runs/77/", "/api/runs/77/plans/", "/api/runs/77/plans/compare/"):
        assert api.get(url).status_code == 404
    assert api.post("/api/runs/77/plan/", {}, format="json").json() == {
        "detail": "run 77 does not exist"}


# --------------------------------------------------------------------------- agents


def test_an_agent_sees_its_runs_with_the_chosen_plan(agent):
    device = DeviceFactory()
    run = RunFactory(state=Run.State.STARTING, devices=[device, DeviceFactory()])
    plan = PlanFactory(run=run, document={"algorithm": "ftpipehd", "stages": []})
    Run.objects.filter(pk=run.pk).update(chosen_plan=plan)
    RunFactory()  # not this device's
    client = agent(device)
    assert [r["id"] for r in client.get("/api/agent/runs/").json()] == [run.pk]
    detail = client.get(f"/api/agent/runs/{run.pk}/").json()
    assert detail["plan"]["id"] == plan.pk and detail["plan"]["document"]["algorithm"] == "ftpipehd"


def test_an_agent_cannot_read_or_report_for_another_devices_run(agent):
    mine = DeviceFactory()
    theirs = RunFactory(state=Run.State.RUNNING)
    client = agent(mine)
    assert client.get(f"/api/agent/runs/{theirs.pk}/").status_code == 403
    answer = client.post(f"/api/agent/runs/{theirs.pk}/events/", {"metrics": []}, format="json")
    assert answer.status_code == 403
    assert answer.json() == {"detail": f"device {mine.uid} is not a device of run {theirs.pk}"}


def test_an_agent_reports_events_for_its_run(agent):
    device = DeviceFactory()
    run = RunFactory(state=Run.State.RUNNING, devices=[device])
    event = {"run": run.pk, "device": device.uid, "stage": 0, "kind": "backward",
             "microbatch": 3, "version": 1, "start": 0.5, "end": 0.7}
    answer = agent(device).post(f"/api/agent/runs/{run.pk}/events/", {
        "timeline": [event] * 3, "metrics": [{"at": 1.0, "kind": "throughput_sps",
                                              "value": 120.5, "device": device.uid}]},
        format="json")
    assert answer.status_code == 201
    assert answer.json() == {"timeline": 3, "faults": 0, "metrics": 1, "refused": []}
    assert TimelineEvent.objects.filter(run=run, kind="backward").count() == 3
    assert MetricPoint.objects.get().device == device.uid


def test_events_for_a_run_that_is_not_active_are_409(agent):
    device = DeviceFactory()
    run = RunFactory(state=Run.State.FINISHED, devices=[device])
    answer = agent(device).post(f"/api/agent/runs/{run.pk}/events/", {}, format="json")
    assert answer.status_code == 409
    assert answer.json()["state"] == "finished" and answer.json()["action"] == "report events"
