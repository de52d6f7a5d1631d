"""A run's report download: one HTML file with plotly.js inside, built by
:mod:`orchestrator.report` from the run in the database, the same as ``python -m orchestrator
report`` builds from the run page's other downloads; readable by every logged-in user."""

from __future__ import annotations

from pathlib import Path

import plotly
import pytest
from django.test import Client

from orchestrator.report.figures import gantt_figure
from orchestrator.report.record import load_run_record
from tests.webapp.factories import RunFactory
from webapp.dashboard.reports import run_report_record
from webapp.runs import services
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def body(answer) -> bytes:
    return b"".join(answer.streaming_content) if answer.streaming else answer.content


def test_the_report_downloads_as_one_html_file(browser: Client, reported: Run):
    answer = browser.get(f"/runs/{reported.pk}/export/report.html")
    assert answer.status_code == 200
    assert answer["Content-Type"] == "text/html; charset=utf-8"
    assert answer["Content-Disposition"] == (
        f'attachment; filename="edgepipe-run-{reported.pk}-report.html"')
    html = answer.content.decode()
    assert html.count(PLOTLY_JS.read_text()) == 1
    assert f"EdgePipe run report: run {reported.pk}: {reported.name}" in html
    for name in ("pi one", "pi two", "pi three", "heartbeat timeout"):
        assert name in html


def test_every_logged_in_user_reads_a_report_and_nobody_else(viewer: Client, client: Client,
                                                             reported: Run):
    assert viewer.get(f"/runs/{reported.pk}/export/report.html").status_code == 200
    answer = client.get(f"/runs/{reported.pk}/export/report.html")
    assert answer.status_code == 302 and answer["Location"].startswith("/login/")


def test_an_unknown_run_has_no_report(browser: Client):
    assert browser.get("/runs/999999/export/report.html").status_code == 404


def test_a_new_run_s_report_says_what_it_lacks(browser: Client):
    run = RunFactory()
    html = browser.get(f"/runs/{run.pk}/export/report.html").content.decode()
    assert "no timeline events" in html and "no throughput reported" in html


def test_the_run_page_offers_the_report(browser: Client, reported: Run):
    html = browser.get(f"/runs/{reported.pk}/").content.decode()
    assert f'id="export-report" href="/runs/{reported.pk}/export/report.html" download' in html


def test_the_dashboard_and_the_command_line_read_the_same_run(browser: Client, reported: Run,
                                                              tmp_path: Path):
    files = {}
    for name in ("trace.json", "metrics.csv"):
        files[name] = tmp_path / name
        files[name].write_bytes(body(browser.get(f"/runs/{reported.pk}/export/{name}")))
    cli = load_run_record(files["trace.json"], metrics=files["metrics.csv"])
    web = run_report_record(run=reported)
    assert (cli.title, cli.schedule, cli.batch_size) == (web.title, web.schedule,
                                                          web.batch_size)
    assert (cli.devices, dict(cli.labels)) == (web.devices, dict(web.labels))

    def timeline(record):
        return sorted((e.device, e.stage, e.kind, e.microbatch, e.version, round(e.start, 6),
                       round(e.end, 6), e.bytes) for e in record.events)

    assert timeline(cli) == timeline(web) and len(web.events) == 60
    assert [(f.at, f.kind, f.device, dict(f.detail or {})) for f in cli.faults] == [
        (f.at, f.kind, f.device, dict(f.detail or {})) for f in web.faults]
    assert cli.metrics == web.metrics
    # so the trace alone (its counters) gives the metrics too
    assert sorted(load_run_record(files["trace.json"]).metrics, key=lambda m: (m.at, m.kind)) \
        == sorted(web.metrics, key=lambda m: (m.at, m.kind))


def test_a_started_run_s_report_draws_its_plan_beneath_the_measured_events(
        browser: Client, gpipe_run: Run):
    best = gpipe_run.plans.order_by("period_s").first()
    Run.objects.filter(pk=gpipe_run.pk).update(state=Run.State.RUNNING, chosen_plan=best)
    gpipe_run.refresh_from_db()
    devices = [rd.device for rd in gpipe_run.run_devices.select_related("device")]
    for k, device in enumerate(devices):
        services.run_events_store(run=gpipe_run, device=device, timeline=[
            {"run": gpipe_run.pk, "device": device.uid, "stage": k, "kind": kind,
             "microbatch": m, "version": 0, "start": 1.0 + m + 0.3 * k + 0.1 * j,
             "end": 1.05 + m + 0.3 * k + 0.1 * j}
            for m in range(3) for j, kind in enumerate(("forward", "backward"))])
    record = run_report_record(run=gpipe_run)
    assert [p.chosen for p in record.plans].count(True) == 1
    assert record.chosen_plan.algorithm == best.algorithm
    assert record.planned and min(e.start for e in record.planned) >= 1.0  # from the first event
    fig = gantt_figure(record)
    planned = [t for t in fig.data if t.meta["role"] == "planned"]
    assert {t.meta["device"] for t in planned} <= {d.uid for d in devices} and planned
    html = browser.get(f"/runs/{gpipe_run.pk}/export/report.html").content.decode()
    assert f"{best.algorithm} (chosen)" in html
