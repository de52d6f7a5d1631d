"""The data the run page fetches: each plan's planned timeline, and the chosen plan's planned
events over a span of run time (the live Gantt's ghosts), repeated from a three-batch
simulation."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from orchestrator.cost import build_cost_model
from orchestrator.planformat import parse_plan
from orchestrator.simulator import simulate
from tests.webapp.factories import PlanFactory, RunFactory
from webapp.dashboard import planned, selectors
from webapp.runs.models import Plan, Run, TimelineEvent
from webapp.runs.selectors import run_planning_inputs

pytestmark = pytest.mark.django_db

KEY = ("device", "stage", "kind", "microbatch", "version")


def simulated(run: Run, plan: Plan, batches: int) -> list[dict]:
    profile, devices = run_planning_inputs(run=run)
    parsed = parse_plan(plan.document, profile=profile, devices=devices)
    result = simulate(build_cost_model(profile, devices), parsed, run=run.pk,
                      microbatches=run.microbatches * batches, schedule=run.schedule,
                      flush_every=run.microbatches)
    return [e.to_json() for e in result.events]


def best(run: Run) -> Plan:
    return run.plans.filter(status=Plan.Status.DONE).order_by("period_s").first()


def test_a_plans_planned_timeline(api: APIClient, gpipe_run: Run):
    plan = best(gpipe_run)
    answer = api.get(f"/api/dashboard/runs/{gpipe_run.pk}/plans/{plan.pk}/timeline/?batches=3")
    assert answer.status_code == 200
    got = answer.json()
    assert got["batches"] == 3 and got["microbatches"] == 9 and got["schedule"] == "gpipe"
    stages = plan.document["stages"]
    assert [(r["device"], r["stage"]) for r in got["rows"]] == [
        (d, k) for k, s in enumerate(stages) for d in s["devices"]]
    assert got["events"] == simulated(gpipe_run, plan, 3)
    assert {e["kind"] for e in got["events"]} >= {"forward", "backward", "send", "recv"}


@pytest.mark.parametrize(("query", "status", "detail"), [
    ("?batches=0", 400, "batches: Ensure this value is greater than or equal to 1."),
    ("?batches=99", 400, "batches: Ensure this value is less than or equal to 8."),
])
def test_a_bad_planned_timeline_query_is_a_400(api: APIClient, gpipe_run: Run, query, status,
                                               detail):
    answer = api.get(f"/api/dashboard/runs/{gpipe_run.pk}/plans/{best(gpipe_run).pk}"
                     f"/timeline/{query}")
    assert answer.status_code == status and answer.json()["detail"] == detail


def test_a_plan_not_computed_has_no_planned_timeline(api: APIClient):
    plan = PlanFactory(status=Plan.Status.RUNNING, document=None)
    answer = api.get(f"/api/dashboard/runs/{plan.run_id}/plans/{plan.pk}/timeline/")
    assert answer.status_code == 409
    assert answer.json()["detail"] == (f"plan {plan.pk} (ftpipehd) is running: only a "
                                       "computed plan has a planned timeline")


def test_a_plan_whose_devices_lost_their_profiles_says_so(api: APIClient, gpipe_run: Run):
    from webapp.devices.models import LayerProfile

    plan = best(gpipe_run)
    LayerProfile.objects.filter(device=gpipe_run.run_devices.first().device).delete()
    answer = api.get(f"/api/dashboard/runs/{gpipe_run.pk}/plans/{plan.pk}/timeline/")
    assert answer.status_code == 409
    assert "cannot be simulated: no profile of mlp" in answer.json()["detail"]


def test_another_runs_plan_is_a_404(api: APIClient, gpipe_run: Run):
    other = PlanFactory()
    answer = api.get(f"/api/dashboard/runs/{gpipe_run.pk}/plans/{other.pk}/timeline/")
    assert answer.status_code == 404


def test_the_page_data_needs_a_session(anon: APIClient, gpipe_run: Run):
    assert anon.get(f"/api/dashboard/runs/{gpipe_run.pk}/planned/?start=0&end=1"
                    ).status_code == 401


# --------------------------------------------------------------------------- ghosts


def test_gpipe_ghosts_are_the_simulation_of_the_whole_run(gpipe_run: Run):
    # GPipe flushes every batch, so batch after batch repeats exactly
    plan = best(gpipe_run)
    ghosts = planned.plan_ghost_timeline(run=gpipe_run, plan=plan, start_s=0.0, end_s=1e4)
    assert not ghosts["truncated"]
    direct = simulated(gpipe_run, plan, gpipe_run.batches)
    assert [tuple(e[k] for k in KEY) for e in ghosts["events"]] == [
        tuple(e[k] for k in KEY) for e in direct]
    assert [e["start"] for e in ghosts["events"]] == pytest.approx([e["start"] for e in direct])
    assert [e["end"] for e in ghosts["events"]] == pytest.approx([e["end"] for e in direct])


def test_ghosts_start_at_the_first_measured_event_and_cover_only_the_span(gpipe_run: Run):
    plan = best(gpipe_run)
    device = gpipe_run.run_devices.first().device.uid
    TimelineEvent.objects.create(run=gpipe_run, device=device, stage=0, kind="forward",
                                 microbatch=0, version=0, start=3.0, end=3.5)
    whole = planned.plan_ghost_timeline(run=gpipe_run, plan=plan, start_s=0.0, end_s=1e4)
    assert whole["anchor_s"] == 3.0 and whole["events"][0]["start"] == pytest.approx(3.0)
    span = planned.plan_ghost_timeline(run=gpipe_run, plan=plan, start_s=10.0, end_s=12.0)
    assert span["events"] == [e for e in whole["events"]
                              if e["end"] >= 10.0 and e["start"] <= 12.0]


def test_1f1b_ghosts_number_the_microbatches_on_at_the_planned_pace(onef1b_run: Run):
    plan = best(onef1b_run)
    ghosts = planned.plan_ghost_timeline(run=onef1b_run, plan=plan, start_s=0.0, end_s=1e4)
    first_stage = plan.document["stages"][0]["devices"]
    forwards = [e for e in ghosts["events"] if e["kind"] == "forward" and e["stage"] == 0]
    total = onef1b_run.microbatches * onef1b_run.batches
    assert sorted(e["microbatch"] for e in forwards) == list(range(total))
    assert {e["device"] for e in forwards} <= set(first_stage)
    # the steady state repeats: the planned makespan within one batch of a full simulation
    direct = simulated(onef1b_run, plan, onef1b_run.batches)
    makespan = max(e["end"] for e in direct)
    assert max(e["end"] for e in ghosts["events"]) == pytest.approx(makespan, rel=0.05)


def test_ghosts_through_the_api(api: APIClient, gpipe_run: Run):
    url = f"/api/dashboard/runs/{gpipe_run.pk}/planned/"
    none = api.get(url + "?start=0&end=5")
    assert none.status_code == 409
    assert none.json()["detail"] == f"run {gpipe_run.pk} is planned and has no chosen plan yet"
    Run.objects.filter(pk=gpipe_run.pk).update(chosen_plan=best(gpipe_run))
    answer = api.get(url + "?start=1.5&end=4")
    assert answer.status_code == 200 and answer.json()["plan"] == best(gpipe_run).pk
    assert all(e["end"] >= 1.5 and e["start"] <= 4 for e in answer.json()["events"])
    assert api.get(url + "?start=5&end=4").json()["detail"] == "end: must not be before start (5)"
    assert api.get(url + "?start=0&end=601").json()["detail"] == (
        "end: must be at most 600 s after start")
    assert api.get(url + "?start=x&end=4").json()["detail"] == "start: A valid number is required."


def test_run_progress_by_state(db: None):
    planning = RunFactory(state=Run.State.PLANNING)
    PlanFactory(run=planning, algorithm="uniform")
    PlanFactory(run=planning, algorithm="bsp", status=Plan.Status.PENDING)
    running = RunFactory(state=Run.State.RUNNING, microbatches=4, batches=10)
    device = running.run_devices.first().device.uid
    for m, kind in ((6, "backward"), (7, "forward")):
        TimelineEvent.objects.create(run=running, device=device, stage=0, kind=kind,
                                     microbatch=m, version=0, start=m, end=m + 0.5)
    draft = RunFactory()
    progress = selectors.run_progress([planning, running, draft])
    assert progress[planning.pk].label == "1/2 plans"
    assert (progress[running.pk].done, progress[running.pk].total) == (7, 40)
    assert progress[running.pk].percent == pytest.approx(17.5)
    assert draft.pk not in progress
