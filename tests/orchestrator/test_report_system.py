"""The run report's "Devices' system" figure: per device, in pipeline order and one colour
each, its CPU use and memory over time (the agent process's dotted, the device's memory in
all dashed), and a temperature panel only when a device reported one."""

from __future__ import annotations

from types import MappingProxyType

from orchestrator.report.document import report_html
from orchestrator.report.figures import DEVICE_COLORS, GIB, system_figure
from orchestrator.report.record import Metric, RunRecord

LABELS = MappingProxyType({"pi-1": "pi one", "jetson": "jetson <b>nano</b>"})


def readings(device: str, *, cpu: float, temp: float | None = None) -> list[Metric]:
    out = []
    for t in (2.0, 4.0, 6.0):
        out += [Metric(t, "cpu_pct", device, cpu), Metric(t, "proc_cpu_pct", device, cpu / 4),
                Metric(t, "mem_used_bytes", device, 2 * GIB),
                Metric(t, "mem_total_bytes", device, 8 * GIB),
                Metric(t, "proc_rss_bytes", device, 0.5 * GIB)]
        if temp is not None:
            out.append(Metric(t, "temp_c", device, temp))
    return out


def record(*metrics: Metric) -> RunRecord:
    return RunRecord(title="run 3", metrics=(Metric(1.0, "loss", "jetson", 2.0), *metrics),
                     devices=("pi-1", "jetson"), labels=LABELS)


def test_each_device_has_its_cpu_and_memory_traces_in_pipeline_order():
    fig = system_figure(record(*readings("jetson", cpu=80.0), *readings("pi-1", cpu=40.0)))

    drawn = [(t.meta["device"], t.meta["kind"]) for t in fig.data]
    kinds = ["cpu_pct", "proc_cpu_pct", "mem_used_bytes", "mem_total_bytes", "proc_rss_bytes"]
    assert drawn == [("pi-1", k) for k in kinds] + [("jetson", k) for k in kinds]
    by = {(t.meta["device"], t.meta["kind"]): t for t in fig.data}
    assert list(by["pi-1", "cpu_pct"].y) == [40.0] * 3
    assert list(by["jetson", "proc_cpu_pct"].x) == [2.0, 4.0, 6.0]
    assert list(by["jetson", "mem_used_bytes"].y) == [2.0] * 3  # GiB
    assert by["pi-1", "proc_cpu_pct"].line.dash == "dot"
    assert by["pi-1", "mem_total_bytes"].line.dash == "dash"
    assert {t.line.color for t in fig.data if t.meta["device"] == "pi-1"} == {DEVICE_COLORS[0]}
    assert {t.line.color for t in fig.data if t.meta["device"] == "jetson"} == {DEVICE_COLORS[1]}
    # one legend entry per device, its name as text
    assert [t.name for t in fig.data if t.showlegend] == ["pi one",
                                                          "jetson &lt;b&gt;nano&lt;/b&gt;"]
    assert by["pi-1", "cpu_pct"].yaxis == "y" and by["pi-1", "mem_used_bytes"].yaxis == "y2"
    assert list(fig.layout.yaxis.range) == [0, 100]
    assert [a.text for a in fig.layout.annotations] == ["CPU (%)", "memory (GiB)"]


def test_a_temperature_panel_only_when_a_device_reports_one():
    fig = system_figure(record(*readings("pi-1", cpu=40.0, temp=61.5),
                               *readings("jetson", cpu=80.0)))

    temps = [t for t in fig.data if t.meta["kind"] == "temp_c"]
    assert [(t.meta["device"], list(t.y), t.yaxis) for t in temps] == [
        ("pi-1", [61.5] * 3, "y3")]
    assert [a.text for a in fig.layout.annotations] == ["CPU (%)", "memory (GiB)",
                                                         "temperature (°C)"]


def test_the_report_holds_the_figure():
    html = report_html(record(*readings("pi-1", cpu=40.0)))
    assert html.count('id="report-system"') == 1
    assert html.index('id="report-idle"') < html.index('id="report-system"')
