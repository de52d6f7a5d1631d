"""Comparing runs side by side: the Runs page's selection and the comparison page."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.webapp.factories import RunFactory
from webapp.runs import services
from webapp.runs.models import Device, Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def reported_on():
    """Train a planned run on paper: its best plan chosen, six micro-batches through every
    stage reported by the stages' devices, three throughput points; the run finished."""

    def report(run: Run, every_s: float) -> None:
        plan = run.plans.order_by("period_s").first()
        Run.objects.filter(pk=run.pk).update(chosen_plan=plan, state=Run.State.RUNNING)
        run.refresh_from_db()
        for k, stage in enumerate(plan.document["stages"]):
            for uid in stage["devices"]:
                timeline = []
                for m in range(6):
                    t = every_s * m + 0.1 * k
                    timeline += [
                        {"run": run.pk, "device": uid, "stage": k, "kind": "forward",
                         "microbatch": m, "version": 0, "start": t, "end": t + 0.1},
                        {"run": run.pk, "device": uid, "stage": k, "kind": "backward",
                         "microbatch": m, "version": 0, "start": t + 0.2, "end": t + 0.4}]
                services.run_events_store(run=run, device=Device.objects.get(uid=uid),
                                          timeline=timeline)
        first = Device.objects.get(uid=plan.document["stages"][0]["devices"][0])
        services.run_events_store(run=run, device=first, metrics=[
            {"at": float(at), "kind": "throughput_sps", "value": 50.0 + at} for at in (1, 2, 3)])
        Run.objects.filter(pk=run.pk).update(state=Run.State.FINISHED)

    return report


def test_two_trained_runs_side_by_side(browser: Client, gpipe_run: Run, onef1b_run: Run,
                                       reported_on) -> None:
    reported_on(gpipe_run, every_s=0.5)
    reported_on(onef1b_run, every_s=0.8)  # slower
    answer = browser.get(f"/runs/compare/?runs={gpipe_run.pk}&runs={onef1b_run.pk}")
    assert answer.status_code == 200
    page = answer.content.decode()
    for run in (gpipe_run, onef1b_run):
        assert f"#{run.pk} {run.name}" in page
    rows = answer.context["rows"]
    assert [r["run"].pk for r in rows] == [gpipe_run.pk, onef1b_run.pk]  # in the order asked
    for r in rows:
        assert r["summary"]["microbatches"] == 6 and r["summary"]["throughput_steady_sps"] > 0
        assert r["ratio"] is not None and r["ratio"] > 0
    assert [r["best"] for r in rows] == [True, False]
    assert [len(s["x"]) for s in answer.context["series"]] == [3, 3]
    assert "fastest" in page


def test_the_schedule_row_says_what_each_1f1b_run_does_about_stale_weights(
        browser: Client) -> None:
    runs = [RunFactory(schedule="1f1b", vertical_sync=False, aggregate_every=2),
            RunFactory(schedule="1f1b"), RunFactory(schedule="gpipe", microbatches=3)]
    page = browser.get(f"/runs/compare/?runs={','.join(str(r.pk) for r in runs)}"
                       ).content.decode()
    cells = re.search(r"<tr><th>Schedule</th>(.*?)</tr>", page).group(1)
    assert re.findall(r"<td>(.*?)</td>", cells) == [
        "1f1b, no vertical sync, weight aggregation every 2 in-flight windows · 4 micro-batches",
        "1f1b, vertical sync · 4 micro-batches", "gpipe · 3 micro-batches"]


def test_comma_separated_and_repeated_ids_work(browser: Client) -> None:
    runs = [RunFactory(), RunFactory()]
    answer = browser.get(f"/runs/compare/?runs={runs[0].pk},{runs[1].pk}&runs={runs[0].pk}")
    assert answer.status_code == 200 and len(answer.context["rows"]) == 2


@pytest.mark.parametrize("query, reason", [
    ("", "choose between 2 and 6 runs to compare, got 0"),
    ("runs=1", "choose between 2 and 6 runs to compare, got 1"),
    ("runs=1,2,3,4,5,6,7", "got 7"),
    ("runs=1&runs=x", "is not a run number"),
])
def test_a_bad_selection_says_what_is_wrong(browser: Client, query: str, reason: str) -> None:
    answer = browser.get(f"/runs/compare/?{query}")
    assert answer.status_code == 400 and reason in answer.content.decode()


def test_an_unknown_run_is_404_and_a_login_is_needed(browser: Client, client: Client) -> None:
    run = RunFactory()
    assert browser.get(f"/runs/compare/?runs={run.pk},999999").status_code == 404
    assert client.get(f"/runs/compare/?runs={run.pk},{run.pk + 1}").status_code == 302


def test_the_runs_page_lets_runs_be_ticked_for_comparison(browser: Client) -> None:
    run = RunFactory()
    page = browser.get("/runs/").content.decode()
    assert 'id="compare-form"' in page and "/runs/compare/" in page
    assert f'name="runs" value="{run.pk}" form="compare-form"' in page
    assert 'form="compare-form"' not in browser.get("/").content.decode()  # only there


def test_runs_with_rounds_show_their_held_out_accuracy_by_round(browser: Client) -> None:
    # PipeLearn and FL on the same devices, each epoch's averaged model measured
    from webapp.runs.services import metric_points_store

    runs = [RunFactory(kind="pipelearn", state=Run.State.FINISHED, name=name)
            for name in ("pipelearn", "fl")]
    for run, values in zip(runs, ((0.3, 0.6, 0.8), (0.2, 0.4)), strict=True):
        metric_points_store(run=run, points=[
            {"at": float(k), "kind": "test_accuracy", "device": "", "value": v}
            for k, v in enumerate(values)])
    answer = browser.get(f"/runs/compare/?runs={runs[0].pk},{runs[1].pk}")
    assert answer.status_code == 200
    assert [s["held_out"] for s in answer.context["series"]] == [[0.3, 0.6, 0.8], [0.2, 0.4]]
    assert "Held-out accuracy by round" in answer.content.decode()
