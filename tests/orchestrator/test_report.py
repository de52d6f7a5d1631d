"""The run report's figures, asserted on the plotly figure objects: one Gantt trace per device
(and one of the plan's predicted events beneath each), the idle bars by cause, throughput
against the plan, loss and accuracy, faults with their recoveries, the plans table; and the
HTML document that holds them with plotly.js inside."""

from __future__ import annotations

import re
from pathlib import Path
from types import MappingProxyType

import plotly
import pytest

from orchestrator.events import FaultEvent, TimelineEvent, idle_breakdown
from orchestrator.report.document import report_html
from orchestrator.report.figures import (
    IDLE_PARTS,
    KIND_COLORS,
    faults_figure,
    gantt_figure,
    gantt_window,
    idle_by_device,
    idle_figure,
    plans_figure,
    recovery_spans,
    report_figures,
    throughput_figure,
    training_figure,
)
from orchestrator.report.record import Metric, PlanSummary, RunRecord

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
DEVICES = ("pi-1", "pi-2", "jetson")
LABELS = MappingProxyType({"pi-1": "pi one", "pi-2": "pi two", "jetson": "jetson <b>nano</b>"})


def pipeline_events(microbatches: int = 4, *, slow: float = 1.0, run: int = 7
                    ) -> tuple[TimelineEvent, ...]:
    """A GPipe-like timeline on three stages: forwards down, backwards up, a send after each
    forward."""
    events = []
    for m in range(microbatches):
        for k, device in enumerate(DEVICES):
            t = (0.3 * m + 0.3 * k) * slow
            events += [
                TimelineEvent(run, device, k, "forward", m, 0, t, t + 0.2 * slow),
                TimelineEvent(run, device, k, "send", m, 0, t + 0.2 * slow, t + 0.25 * slow,
                              bytes=4096)]
        for k, device in reversed(list(enumerate(DEVICES))):
            t = (2.0 + 0.4 * m + 0.4 * (2 - k)) * slow
            events.append(TimelineEvent(run, device, k, "backward", m, 0, t, t + 0.35 * slow))
    return tuple(events)


PLANS = (
    PlanSummary(algorithm="uniform", layout="layers 0–1 on pi one; ...", stages=3, period_s=0.5,
                throughput_sps=128.0, bottleneck="stage 2 compute", memory_ok=True,
                planner_s=0.001),
    PlanSummary(algorithm="ftpipehd", layout="layers 0–3 on pi one; ...", stages=3,
                period_s=0.4, throughput_sps=160.0, simulated_throughput_sps=150.0,
                bottleneck="stage 1 compute", memory_ok=True, planner_s=0.01, chosen=True),
    PlanSummary(algorithm="tapp", status="failed", error="no partition fits in memory"),
)
FAULTS = (
    FaultEvent(7, 0.0, "run_started", None, {"plan": 2}),
    FaultEvent(7, 1.5, "device_lost", "pi-2", {"reason": "heartbeat timeout"}),
    FaultEvent(7, 1.6, "recovery_started", None, {}),
    FaultEvent(7, 2.1, "repartitioned", None, {"reason": "device lost"}),
    FaultEvent(7, 2.6, "recovered", None, {"resumed_at": 3}),
)
METRICS = (
    Metric(1.0, "throughput_sps", "", 100.0), Metric(2.0, "throughput_sps", "", 120.0),
    Metric(3.0, "throughput_sps", "", 140.0), Metric(2.0, "throughput_sps", "pi-1", 1.0),
    Metric(1.0, "loss", "jetson", 2.3), Metric(3.0, "loss", "jetson", 1.7),
    Metric(3.0, "accuracy", "jetson", 0.4), Metric(3.0, "network_bps", "pi-1", 2e6),
)


@pytest.fixture
def record() -> RunRecord:
    events = pipeline_events()
    return RunRecord(title="run 7: live", schedule="gpipe", events=events, faults=FAULTS,
                     metrics=METRICS, plans=PLANS, devices=DEVICES, labels=LABELS,
                     planned=pipeline_events(slow=0.9), batch_size=32)


def traces(fig, role: str) -> list:
    return [t for t in fig.data if (t.meta or {}).get("role") == role]


# --------------------------------------------------------------------------- Gantt


def test_the_gantt_has_one_trace_per_device_in_pipeline_order(record: RunRecord):
    fig = gantt_figure(record)
    measured = traces(fig, "measured")
    assert [t.meta["device"] for t in measured] == list(DEVICES)
    # names are shown as written: plotly would read tags in them
    assert [t.name for t in measured] == ["pi one", "pi two", "jetson &lt;b&gt;nano&lt;/b&gt;"]
    assert [t.y[0] for t in measured] == ["stage 0 · pi one", "stage 1 · pi two",
                                          "stage 2 · jetson &lt;b&gt;nano&lt;/b&gt;"]
    for t in measured:
        mine = sorted((e for e in record.events if e.device == t.meta["device"]),
                      key=lambda e: e.start)
        assert t.orientation == "h" and len(t.x) == len(mine) == 12
        assert list(t.base) == [e.start for e in mine]
        assert list(t.x) == pytest.approx([e.end - e.start for e in mine])
        assert list(t.marker.color) == [KIND_COLORS[e.kind] for e in mine]
    # the rows top to bottom in pipeline order
    assert list(fig.layout.yaxis.categoryarray) == [t.y[0] for t in measured]
    assert fig.layout.yaxis.autorange == "reversed"


def test_the_gantt_draws_the_plans_prediction_beneath_each_device(record: RunRecord):
    fig = gantt_figure(record)
    planned = traces(fig, "planned")
    assert [t.meta["device"] for t in planned] == list(DEVICES)
    assert [t.name for t in planned] == [f"planned · {t.name}" for t in traces(fig, "measured")]
    measured = traces(fig, "measured")
    for ghost, bars in zip(planned, measured, strict=True):
        assert ghost.y[0] == bars.y[0]  # the same row, a thinner bar below
        assert ghost.offset >= bars.offset + bars.width
    assert len(fig.data) == 2 * len(DEVICES)


def test_the_gantt_marks_every_fault_and_control_event(record: RunRecord):
    fig = gantt_figure(record)
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert sorted(s.x0 for s in lines) == [f.at for f in FAULTS]
    assert {s.line.dash for s in lines} == {"dash"}


def test_a_long_run_s_gantt_draws_its_newest_events(record: RunRecord):
    window = gantt_window(record.events, max_events=10)
    newest = sorted(record.events, key=lambda e: e.end)[-10:]
    assert (window.shown, window.total) == (10, 36)
    assert window.start_s == min(e.start for e in newest)
    assert window.end_s == max(e.end for e in record.events)
    fig = gantt_figure(record, max_events=10)
    assert sum(len(t.x) for t in traces(fig, "measured")) == 10
    assert "the newest 10 of 36 events" in fig.layout.title.text
    assert list(fig.layout.xaxis.range) == [window.start_s, window.end_s]
    with pytest.raises(ValueError, match="max_events must be at least 1, got 0"):
        gantt_window(record.events, max_events=0)


# --------------------------------------------------------------------------- idle


def test_the_idle_bars_split_each_device_s_time_by_cause(record: RunRecord):
    fig = idle_figure(record)
    assert [t.name for t in fig.data] == [name for _, name, _ in IDLE_PARTS]
    assert fig.layout.barmode == "stack"
    makespan = record.makespan_s
    for k, device in enumerate(DEVICES):
        expected = idle_breakdown([e for e in record.events if e.device == device],
                                  window=(0.0, makespan), schedule="gpipe")
        assert [t.x[k] for t in fig.data] == [LABELS[device].replace("<", "&lt;")
                                              .replace(">", "&gt;")] * 5
        assert [t.y[k] for t in fig.data] == pytest.approx([
            expected.busy_s, expected.upstream_s, expected.downstream_s, expected.sync_s,
            expected.bubble_s])
        assert sum(t.y[k] for t in fig.data) == pytest.approx(makespan)
        assert idle_by_device(record)[device] == expected


# --------------------------------------------------------------------------- metrics


def test_throughput_is_drawn_against_the_chosen_plan_s_prediction(record: RunRecord):
    fig = throughput_figure(record)
    measured, planned = fig.data
    assert list(measured.x) == [1.0, 2.0, 3.0] and list(measured.y) == [100.0, 120.0, 140.0]
    assert planned.name == "planned (ftpipehd)" and list(planned.y) == [160.0, 160.0]
    assert sorted(s.x0 for s in fig.layout.shapes) == [1.5, 1.6, 2.1, 2.6]  # loss to resumption


def test_loss_and_accuracy_share_the_time_axis_on_two_scales(record: RunRecord):
    loss, accuracy = training_figure(record).data
    assert (list(loss.x), list(loss.y)) == ([1.0, 3.0], [2.3, 1.7])
    assert (list(accuracy.y), accuracy.yaxis) == ([0.4], "y2")


# --------------------------------------------------------------------------- faults, plans


def test_faults_are_shown_with_each_recovery_s_span(record: RunRecord):
    assert recovery_spans(record) == [(1.5, 2.6, "recovered")]
    fig = faults_figure(record)
    (events,) = fig.data
    assert list(events.x) == [f.at for f in FAULTS]
    assert list(events.y) == ["run started", "device lost", "recovery started", "repartitioned",
                              "recovered"]
    assert list(events.text) == ["run", "pi two", "run", "run", "run"]
    (span,) = [s for s in fig.layout.shapes if s.type == "rect"]
    assert (span.x0, span.x1) == (1.5, 2.6)


def test_a_recovery_still_open_ends_with_the_run(record: RunRecord):
    from dataclasses import replace

    open_ended = replace(record, faults=FAULTS[:3])
    assert recovery_spans(open_ended) == [(1.5, record.makespan_s, "unfinished")]


def test_the_plans_table_ranks_the_plans_and_marks_the_chosen_one(record: RunRecord):
    (table,) = plans_figure(record).data
    columns = dict(zip([h.replace("<b>", "").replace("</b>", "") for h in table.header.values],
                       table.cells.values, strict=True))
    assert list(columns["plan"]) == ["ftpipehd (chosen)", "uniform", "tapp (failed)"]
    assert list(columns["vs best"]) == ["1.00x", "1.25x", "–"]
    assert columns["stages"][2] == "no partition fits in memory"
    assert list(columns["simulated samples/s"]) == ["150", "–", "–"]
    assert list(table.cells.fill.color[0]) == ["#eff6ff", "#ffffff", "#ffffff"]


def test_every_figure_of_an_empty_run_says_what_is_missing():
    figures = report_figures(RunRecord(title="run 1: new"))
    texts = {name: " ".join(a.text for a in fig.layout.annotations)
             for name, fig in figures.items()}
    assert texts == {"plans": "no plan", "gantt": "no timeline events",
                     "idle": "no timeline events",
                     "system": "no device reported its CPU or memory",
                     "throughput": "no throughput reported",
                     "training": "no loss or accuracy reported",
                     "faults": "no fault or control event"}


# --------------------------------------------------------------------------- the document


def test_the_report_is_one_html_file_with_plotly_inside(record: RunRecord):
    html = report_html(record)
    bundle = PLOTLY_JS.read_text()
    assert html.count(bundle) == 1  # embedded once, for every figure
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    for name in ("plans", "gantt", "idle", "system", "throughput", "training", "faults"):
        assert html.count(f'id="report-{name}"') == 1
    assert "<h1>EdgePipe run report: run 7: live</h1>" in html
    # names from the devices are text, never markup
    page = html.replace(bundle, "")
    assert "jetson &lt;b&gt;nano&lt;/b&gt;" in page and "<b>nano</b>" not in page
    assert "heartbeat timeout" in page  # the events' table
    assert not re.search(r"(src|href)=[\"']?(https?:)?//", page)


def test_the_report_is_the_same_for_the_same_run(record: RunRecord):
    assert report_html(record) == report_html(record)
