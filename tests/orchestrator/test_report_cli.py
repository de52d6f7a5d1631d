"""``python -m orchestrator report``: reading a run back from its run page's downloads (the
Chrome trace, the metrics CSV, the plan JSON), the file it writes, and one ``error:`` line
naming the bad file with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import plotly
import pytest

from orchestrator.cli import main
from orchestrator.errors import FormatError
from orchestrator.report.record import (
    load_run_record,
    parse_metrics_csv,
    plan_summary,
    read_trace,
)
from tests.conftest import ROOT

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
PLAN = {"algorithm": "ftpipehd", "schedule": "gpipe", "microbatches": 4,
        "stages": [{"layers": [0, 3], "devices": ["a1"]}, {"layers": [4, 9], "devices": ["b2"]}],
        "predicted": {"period_s": 0.5, "bottleneck": "stage 1 compute",
                      "throughput_sps": 64.0, "memory_ok": True}, "planner_s": 0.002}


def chrome_trace() -> dict:
    """A trace as the run page exports it: two devices, a run-wide process, timeline events,
    a fault, counters."""
    events = []
    for m in range(3):
        for pid, stage in ((1, 0), (2, 1)):
            t = 1e6 * (m + 0.5 * stage)
            events += [
                {"name": f"forward {m}", "cat": "forward", "ph": "X", "ts": t, "dur": 2e5,
                 "pid": pid, "tid": 100, "args": {"stage": stage, "microbatch": m,
                                                  "version": 0, "bytes": 0}},
                {"name": f"send {m}", "cat": "send", "ph": "X", "ts": t + 2e5, "dur": 5e4,
                 "pid": pid, "tid": 500, "args": {"stage": stage, "microbatch": m,
                                                  "version": 0, "bytes": 4096}}]
    events += [
        {"name": "device_lost", "cat": "fault", "ph": "i", "ts": 2.5e6, "pid": 2, "tid": 0,
         "s": "p", "args": {"reason": "heartbeat timeout"}},
        {"name": "recovered", "cat": "fault", "ph": "i", "ts": 3.5e6, "pid": 0, "tid": 0,
         "s": "g", "args": {}},
        {"name": "throughput_sps", "cat": "metric", "ph": "C", "ts": 2e6, "pid": 0,
         "args": {"throughput_sps": 42.0}},
        {"name": "network_bps", "cat": "metric", "ph": "C", "ts": 2e6, "pid": 1,
         "args": {"network_bps": 1e6}},
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "run 7: live"}},
        {"name": "process_name", "ph": "M", "pid": 1,
         "args": {"name": "pi one (a1)", "device": "a1"}},
        {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "jetson (b2)"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 100, "args": {"name": "forward"}}]
    return {"displayTimeUnit": "ms", "otherData": {"run": 7, "name": "live",
                                                   "schedule": "gpipe", "batch_size": 32},
            "traceEvents": events}


def write(path: Path, document: object) -> str:
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return str(path)


# --------------------------------------------------------------------------- reading


def test_a_chrome_trace_reads_back_as_the_run_s_events_faults_and_metrics():
    record = read_trace(chrome_trace(), file="t.json")
    assert record.title == "run 7: live" and record.schedule == "gpipe"
    assert record.batch_size == 32
    assert record.devices == ("a1", "b2")  # a process name without its device id: parsed
    assert dict(record.labels) == {"a1": "pi one", "b2": "jetson"}
    assert len(record.events) == 12
    first = min(record.events, key=lambda e: (e.device, e.start))
    assert (first.run, first.device, first.stage, first.kind, first.microbatch) == (
        7, "a1", 0, "forward", 0)
    assert (first.start, first.end) == pytest.approx((0.0, 0.2))
    assert [(f.at, f.kind, f.device) for f in record.faults] == [
        (2.5, "device_lost", "b2"), (3.5, "recovered", None)]
    assert record.faults[0].detail == {"reason": "heartbeat timeout"}
    assert [(m.at, m.kind, m.device, m.value) for m in record.metrics] == [
        (2.0, "throughput_sps", "", 42.0), (2.0, "network_bps", "a1", 1e6)]


def test_timeline_events_json_reads_as_a_record_too():
    events = [{"run": 1, "device": "x", "stage": 0, "kind": "forward", "microbatch": 0,
               "version": 0, "start": 0.0, "end": 0.5}]
    assert len(read_trace(events, file="e.json").events) == 1
    assert read_trace({"summary": {}, "events": events}, file="e.json").events[0].end == 0.5
    with pytest.raises(FormatError, match=r"^e\.json: events\[0\]\.kind: must be one of"):
        read_trace({"events": [{**events[0], "kind": "nap"}]}, file="e.json")


@pytest.mark.parametrize(("text", "message"), [
    ("", r"^m\.csv: line 1: must be the header at_s,kind,device,value$"),
    ("at,kind\n", r"^m\.csv: line 1: must be the header at_s,kind,device,value \(got 'at,kind'\)"),
    ("at_s,kind,device,value\n1.0,loss,,x\n", r"^m\.csv: line 2\.value: must be a number"),
    ("at_s,kind,device,value\n1.0,loss\n", r"^m\.csv: line 2: must have 4 fields"),
    ("at_s,kind,device,value\nnan,loss,,1\n", r"^m\.csv: line 2\.at_s: must be finite"),
])
def test_a_bad_metrics_csv_names_its_line(text: str, message: str):
    with pytest.raises(FormatError, match=message):
        parse_metrics_csv(text, file="m.csv")


def test_the_metrics_csv_reads_as_metric_points():
    points = parse_metrics_csv("at_s,kind,device,value\n4.0,loss,,1.75\n5.0,network_bps,a1,"
                               "1000000.0\n", file="m.csv")
    assert [(p.at, p.kind, p.device, p.value) for p in points] == [
        (4.0, "loss", "", 1.75), (5.0, "network_bps", "a1", 1e6)]


def test_a_plan_reads_as_a_row_of_the_comparison():
    row = plan_summary(PLAN, file="p.json", labels={"a1": "pi one"}, chosen=True)
    assert row.layout == "layers 0–3 on pi one; layers 4–9 on b2"
    assert (row.stages, row.period_s, row.throughput_sps, row.memory_ok, row.chosen) == (
        2, 0.5, 64.0, True, True)
    with pytest.raises(FormatError, match=r"^p\.json: stages\[1\]\.layers: must be \[first, "
                                          r"last\]"):
        plan_summary({**PLAN, "stages": [PLAN["stages"][0], {"layers": [4], "devices": []}]},
                     file="p.json")
    with pytest.raises(FormatError, match=r"^p\.json: algorithm: is missing"):
        plan_summary({"stages": []}, file="p.json")


def test_a_planned_timeline_starts_with_the_run_s_first_event(tmp_path: Path):
    trace = chrome_trace()
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            e["ts"] += 10e6  # the pipeline began 10 s into the run
    planned = [{"run": 0, "device": "a1", "stage": 0, "kind": "forward", "microbatch": 0,
                "version": 0, "start": 0.0, "end": 0.18}]
    record = load_run_record(write(tmp_path / "t.json", trace),
                             planned=write(tmp_path / "s.json", {"events": planned}),
                             plans=[write(tmp_path / "p.json", PLAN)])
    (ghost,) = record.planned
    assert (ghost.start, ghost.end) == pytest.approx((10.0, 10.18))
    assert record.chosen_plan is not None and record.chosen_plan.algorithm == "ftpipehd"
    assert record.source == "t.json, p.json, s.json"


# --------------------------------------------------------------------------- the command


def test_report_writes_one_html_file_with_plotly_and_the_run_s_devices(tmp_path: Path,
                                                                      capsys):
    out = tmp_path / "report.html"
    code = main(["report", "--trace", write(tmp_path / "t.json", chrome_trace()),
                 "--metrics", write(tmp_path / "m.csv", "at_s,kind,device,value\n"
                                                        "1.0,loss,,2.0\n2.0,accuracy,,0.5\n"),
                 "--plan", write(tmp_path / "p.json", PLAN), "-o", str(out)])
    assert code == 0
    html = out.read_text()
    assert PLOTLY_JS.read_text() in html
    for shown in ("pi one", "jetson", "run 7: live", "ftpipehd", "heartbeat timeout"):
        assert shown in html, shown
    assert f"{out}: run 7: live, 2 devices, 12 events" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "content", "message"), [
    ("missing.json", None, "no such file"),
    ("t.json", "{not json", "is not valid JSON: Expecting property name"),
    ("t.json", {"traceEvents": [{"ph": "X", "cat": "forward", "pid": 1, "ts": "soon"}]},
     "traceEvents[0].ts: must be a number (got 'soon')"),
    ("t.json", {"name": "not a trace"},
     "must be a Chrome trace (traceEvents) or timeline events (events)"),
])
def test_a_bad_trace_exits_2_naming_the_file(tmp_path: Path, capsys, name, content, message):
    trace = tmp_path / name
    if content is not None:
        write(trace, content)
    code = main(["report", "--trace", str(trace), "-o", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"error: {trace}: {message}") and err.count("\n") == 1
    assert not (tmp_path / "r.html").exists()


def test_a_bad_plan_or_metrics_file_or_output_exits_2_naming_it(tmp_path: Path, capsys):
    trace = write(tmp_path / "t.json", chrome_trace())
    plan = write(tmp_path / "p.json", {"algorithm": "x"})
    html = str(tmp_path / "r.html")
    assert main(["report", "--trace", trace, "--plan", plan, "-o", html]) == 2
    assert capsys.readouterr().err == f"error: {plan}: stages: is missing\n"
    metrics = write(tmp_path / "m.csv", "when,what\n")
    assert main(["report", "--trace", trace, "--metrics", metrics, "-o", html]) == 2
    assert capsys.readouterr().err.startswith(f"error: {metrics}: line 1: must be the header")
    assert not Path(html).exists()
    out = tmp_path / "no" / "such" / "dir" / "r.html"
    assert main(["report", "--trace", trace, "-o", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"error: {out}: cannot be written: No such file or directory\n")


def test_the_command_line_help_and_a_subprocess_run(tmp_path: Path):
    helped = subprocess.run([sys.executable, "-m", "orchestrator", "report", "--help"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0
    for option in ("--trace FILE", "--metrics FILE", "--plan FILE", "--planned FILE",
                   "-o FILE, --output FILE", "Example: python -m orchestrator report"):
        assert option in helped.stdout
    bad = subprocess.run([sys.executable, "-m", "orchestrator", "report", "--trace",
                          str(tmp_path / "none.json"), "-o", str(tmp_path / "r.html")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (bad.returncode, bad.stderr) == (2, f"error: {tmp_path / 'none.json'}: no such file\n")
