"""The figures of a run report, each a pure function of a :class:`RunRecord` returning a plotly
figure: the plans compared, the Gantt (one trace per device, the chosen plan's predicted
events as ghosts beneath), idle time per device by cause, each device's CPU, memory and
temperature, throughput over time against the plan's prediction, loss and accuracy, and the
fault and control events with each recovery's span. Colours and idle causes are the
dashboard's (static/dashboard/js/charts.js), so a report reads like the run page.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from orchestrator.events import IdleBreakdown, TimelineEvent, idle_breakdown
from orchestrator.protocol import SYSTEM_METRICS
from orchestrator.report.record import GANTT_MAX_EVENTS, Metric, RunRecord

KIND_COLORS = {"forward": "#3b82f6", "backward": "#f59e0b", "update": "#dc2626",
               "aggregate": "#c026d3", "send": "#10b981", "recv": "#8b5cf6",
               "replicate": "#0d9488", "load": "#94a3b8"}
# (IdleBreakdown field, legend label, colour)
IDLE_PARTS = (("busy_s", "busy", "#3b82f6"), ("upstream_s", "waiting upstream", "#f97316"),
              ("downstream_s", "waiting downstream", "#a855f7"),
              ("sync_s", "sync (replicas)", "#c026d3"), ("bubble_s", "bubble (fill/drain)",
                                                        "#cbd5e1"))
FAULT_COLORS = {"device_lost": "#dc2626", "run_failed": "#dc2626", "recovered": "#16a34a",
                "device_joined": "#16a34a", "run_finished": "#16a34a"}
# a recovery's span: from the loss (or its start) to the end of the recovery
RECOVERY_OPENS = ("device_lost", "recovery_started")
RECOVERY_CLOSES = ("recovered", "run_failed")
LAYOUT = {"template": "plotly_white", "margin": {"l": 70, "r": 30, "t": 50, "b": 50},
          "font": {"size": 12}, "title_font": {"size": 17}}


def _label(record: RunRecord, device: str) -> str:
    """A device's name as plotly text: shown as written (plotly reads tags in text)."""
    return escape(record.label(device), quote=False)


def _empty(fig: go.Figure, text: str) -> go.Figure:
    fig.update_layout(height=200)
    fig.add_annotation(text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                       font={"color": "#64748b"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def _number(value: float | None, digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


# --------------------------------------------------------------------------- plans


def plans_figure(record: RunRecord) -> go.Figure:
    """The plans side by side, best predicted period first (the run page's table)."""
    rows = sorted(record.plans, key=lambda p: (p.period_s is None, p.memory_ok is False,
                                               p.period_s or 0.0))
    best = min((p.period_s for p in rows if p.period_s and p.memory_ok is not False),
               default=None)
    columns: dict[str, list[str]] = {"plan": [], "stages": [], "period (s)": [], "samples/s": [],
               "simulated samples/s": [], "vs best": [], "memory": [], "bottleneck": [],
               "planner (s)": []}
    for p in rows:
        columns["plan"].append(p.algorithm + (" (chosen)" if p.chosen else "")
                               + ("" if p.status == "done" else f" ({p.status})"))
        columns["stages"].append(escape(p.error or p.layout, quote=False) or _number(p.stages))
        columns["period (s)"].append(_number(p.period_s))
        columns["samples/s"].append(_number(p.throughput_sps))
        columns["simulated samples/s"].append(_number(p.simulated_throughput_sps))
        columns["vs best"].append(f"{p.period_s / best:.2f}x" if best and p.period_s else "–")
        columns["memory"].append({True: "fits", False: "too big", None: "–"}[p.memory_ok])
        columns["bottleneck"].append(escape(p.bottleneck, quote=False) or "–")
        columns["planner (s)"].append(_number(p.planner_s, 3))
    fill = ["#eff6ff" if p.chosen else "#ffffff" for p in rows]
    # a cell wraps its text: about 55 characters a line in the stages column
    lines = sum(max(1, math.ceil(len(text) / 55)) for text in columns["stages"])
    fig = go.Figure(go.Table(
        columnwidth=[1.2, 3.2, 0.9, 0.9, 1, 0.7, 0.7, 1.6, 0.8],
        header={"values": [f"<b>{c}</b>" for c in columns], "fill_color": "#f1f5f9",
                "align": "left"},
        cells={"values": list(columns.values()), "align": "left", "fill_color": [fill]}))
    fig.update_layout(**LAYOUT, title="Plans", height=110 + 20 * max(2, lines + len(rows)))
    if not rows:
        fig.add_annotation(text="no plan", showarrow=False, xref="paper", yref="paper",
                           x=0.5, y=0.4, font={"color": "#64748b"})
    return fig


# --------------------------------------------------------------------------- Gantt


@dataclass(frozen=True)
class GanttWindow:
    """The part of the timeline a Gantt draws: the newest events up to a count."""

    start_s: float
    end_s: float
    shown: int
    total: int


def _newest(events: Sequence[TimelineEvent], max_events: int) -> list[TimelineEvent]:
    if max_events < 1:
        raise ValueError(f"max_events must be at least 1, got {max_events}")
    return sorted(events, key=lambda e: e.end)[-max_events:]


def gantt_window(events: Sequence[TimelineEvent], *, max_events: int = GANTT_MAX_EVENTS
                 ) -> GanttWindow:
    """The whole run when it has at most ``max_events`` events, else the ``max_events``
    that end last: from the earliest start among them to the last end."""
    kept = _newest(events, max_events)
    if not kept:
        return GanttWindow(0.0, 0.0, 0, 0)
    return GanttWindow(min(e.start for e in kept), kept[-1].end, len(kept), len(events))


def _row_labels(record: RunRecord, devices: Sequence[str],
                events: Sequence[TimelineEvent]) -> dict[str, str]:
    """A row's label: ``stage k · name`` when the device served one stage, else its name."""
    stages: dict[str, set[int]] = {}
    for e in events:
        stages.setdefault(e.device, set()).add(e.stage)
    out = {}
    for d in devices:
        served = stages.get(d, set())
        out[d] = (f"stage {next(iter(served))} · {_label(record, d)}" if len(served) == 1
                  else _label(record, d))
    return out


def _bars(events: Sequence[TimelineEvent], row: str, **style: object) -> go.Bar:
    return go.Bar(
        orientation="h", y=[row] * len(events), base=[e.start for e in events],
        x=[e.end - e.start for e in events],
        customdata=[[e.kind, e.stage, e.microbatch, e.version, e.bytes, e.end]
                    for e in events],
        hovertemplate=("%{customdata[0]} mb %{customdata[2]} (stage %{customdata[1]}, "
                       "version %{customdata[3]})<br>%{base:.4f}–%{customdata[5]:.4f} s"
                       "<br>%{customdata[4]} bytes<extra>%{fullData.name}</extra>"),
        **style)


def gantt_figure(record: RunRecord, *, max_events: int = GANTT_MAX_EVENTS) -> go.Figure:
    """Every device's events on a row of its own, in pipeline order, coloured by kind: one
    trace per device, and one per device of the chosen plan's predicted events (a thinner bar
    beneath); a dashed line at each fault and control event."""
    window = gantt_window(record.events, max_events=max_events)
    fig = go.Figure()
    if not window.total:
        fig.update_layout(**LAYOUT, title="Timeline", height=260)
        return _empty(fig, "no timeline events")
    lo, hi = window.start_s, window.end_s
    shown = _newest(record.events, max_events)
    planned = [e for e in record.planned if e.end >= lo and e.start <= hi]
    devices = [d for d in record.device_order()
               if any(e.device == d for e in (*shown, *planned))]
    rows = _row_labels(record, devices, shown)
    for d in devices:
        mine = sorted((e for e in shown if e.device == d), key=lambda e: e.start)
        fig.add_trace(_bars(mine, rows[d], name=_label(record, d), showlegend=False,
                            width=0.55, offset=-0.4,
                            marker={"color": [KIND_COLORS.get(e.kind, "#64748b")
                                              for e in mine], "line": {"width": 0}},
                            meta={"role": "measured", "device": d}))
    for d in devices:
        ghosts = sorted((e for e in planned if e.device == d), key=lambda e: e.start)
        if ghosts:
            fig.add_trace(_bars(ghosts, rows[d], name=f"planned · {_label(record, d)}",
                                showlegend=False, width=0.22, offset=0.18, opacity=0.45,
                                marker={"color": [KIND_COLORS.get(e.kind, "#64748b")
                                                  for e in ghosts], "line": {"width": 0}},
                                meta={"role": "planned", "device": d}))
    for f in record.faults:
        if lo <= f.at <= hi:
            fig.add_vline(x=f.at, line={"color": FAULT_COLORS.get(f.kind, "#64748b"),
                                        "dash": "dash", "width": 1})
    kinds = [k for k in KIND_COLORS if any(e.kind == k for e in shown)]
    key = "   ".join(f'<span style="color:{KIND_COLORS[k]}">■</span> {k}' for k in kinds)
    if planned:
        key += "   thin bars beneath: the plan's prediction"
    title = "Timeline"
    if window.shown < window.total:
        title += (f" (the newest {window.shown:,} of {window.total:,} events: "
                  f"{lo:.1f}–{hi:.1f} s)")
    fig.update_layout(**LAYOUT, title=title, barmode="overlay", bargap=0.1,
                      height=max(280, 120 + 48 * len(devices)))
    fig.update_layout(margin={"t": 80})
    fig.add_annotation(text=key, showarrow=False, xref="paper", yref="paper", x=0, y=1.02,
                       xanchor="left", yanchor="bottom", align="left")
    fig.update_xaxes(title="run time (s)", range=[lo, hi])
    fig.update_yaxes(categoryorder="array", categoryarray=[rows[d] for d in devices],
                     autorange="reversed", automargin=True)
    return fig


# --------------------------------------------------------------------------- idle time


def idle_by_device(record: RunRecord) -> dict[str, IdleBreakdown]:
    """Each device's busy and idle time from the run's start to its last event, idle split by
    cause (:func:`orchestrator.events.idle_breakdown`), in pipeline order."""
    window = (0.0, record.makespan_s)
    by_device: dict[str, list[TimelineEvent]] = {}
    for e in record.events:
        by_device.setdefault(e.device, []).append(e)
    return {d: idle_breakdown(by_device[d], window=window, schedule=record.schedule)
            for d in record.device_order() if d in by_device}


def idle_figure(record: RunRecord) -> go.Figure:
    """Busy and idle seconds per device, stacked by cause: one trace per cause."""
    idle = idle_by_device(record)
    fig = go.Figure()
    labels = [_label(record, d) for d in idle]
    for part, name, color in IDLE_PARTS:
        seconds = [getattr(b, part) for b in idle.values()]
        shares = [100 * s / (b.busy_s + b.idle_s) if b.busy_s + b.idle_s > 0 else 0.0
                  for s, b in zip(seconds, idle.values(), strict=True)]
        fig.add_trace(go.Bar(x=labels, y=seconds, name=name, marker={"color": color},
                             customdata=shares,
                             hovertemplate=f"{name}: %{{y:.3f}} s (%{{customdata:.1f}}%)"
                                           "<extra>%{x}</extra>"))
    fig.update_layout(**LAYOUT, title="Idle time per device, by cause", barmode="stack",
                      height=380, legend={"orientation": "h", "y": -0.2,
                                          "traceorder": "normal"})
    fig.update_yaxes(title="seconds")
    if not idle:
        _empty(fig, "no timeline events")
    return fig


# --------------------------------------------------------------------------- metrics


def _series(metrics: Sequence[Metric], kind: str, device: str | None = None) -> list[Metric]:
    return sorted((m for m in metrics if m.kind == kind
                   and (device is None or m.device == device)), key=lambda m: m.at)


def throughput_figure(record: RunRecord) -> go.Figure:
    """The run's measured throughput over time against the chosen plan's prediction."""
    points = _series(record.metrics, "throughput_sps", "") or _series(record.metrics,
                                                                     "throughput_sps")
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[m.at for m in points], y=[m.value for m in points],
                             mode="lines+markers", name="measured",
                             line={"color": "#2563eb"}))
    chosen = record.chosen_plan
    if chosen is not None and chosen.throughput_sps is not None and points:
        fig.add_trace(go.Scatter(x=[points[0].at, points[-1].at],
                                 y=[chosen.throughput_sps] * 2, mode="lines",
                                 name=f"planned ({chosen.algorithm})",
                                 line={"color": "#94a3b8", "dash": "dash"}))
    for f in record.faults:
        if f.kind in (*RECOVERY_OPENS, "repartitioned", "recovered"):
            fig.add_vline(x=f.at, line={"color": FAULT_COLORS.get(f.kind, "#64748b"),
                                        "dash": "dot", "width": 1})
    fig.update_layout(**LAYOUT, title="Throughput", height=340)
    fig.update_xaxes(title="run time (s)")
    fig.update_yaxes(title="samples/s", rangemode="tozero")
    return _empty(fig, "no throughput reported") if not points else fig


def training_figure(record: RunRecord) -> go.Figure:
    """Loss (left axis) and accuracy (right axis, 0 to 1) over time."""
    loss = _series(record.metrics, "loss")
    accuracy = _series(record.metrics, "accuracy")
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[m.at for m in loss], y=[m.value for m in loss], name="loss",
                             mode="lines+markers", line={"color": "#dc2626"}))
    fig.add_trace(go.Scatter(x=[m.at for m in accuracy], y=[m.value for m in accuracy],
                             name="accuracy", mode="lines+markers", yaxis="y2",
                             line={"color": "#16a34a"}))
    fig.update_layout(**LAYOUT, title="Loss and accuracy", height=340,
                      yaxis={"title": "loss", "rangemode": "tozero"},
                      yaxis2={"title": "accuracy", "overlaying": "y", "side": "right",
                              "range": [0, 1], "showgrid": False, "tickmode": "linear",
                              "tick0": 0, "dtick": 0.2, "tickformat": ".0%"},
                      legend={"orientation": "h", "y": -0.2})
    fig.update_xaxes(title="run time (s)")
    return _empty(fig, "no loss or accuracy reported") if not loss and not accuracy else fig


# --------------------------------------------------------------------------- devices' system

# a device's colour in the system figure, by its place in pipeline order
DEVICE_COLORS = ("#2563eb", "#ea580c", "#16a34a", "#9333ea", "#0891b2", "#db2777", "#ca8a04",
                 "#475569")
GIB = 2.0**30


def system_figure(record: RunRecord) -> go.Figure:
    """Each device's CPU use (percent of its cores; dotted: the agent process's share) and
    memory (GiB used, dashed: the device's total, dotted: the agent's resident memory) over
    time, and the temperature where a device reports one: one colour per device, in pipeline
    order."""
    devices = [d for d in record.device_order()
               if any(m.device == d and m.kind in SYSTEM_METRICS for m in record.metrics)]
    devices += sorted({m.device for m in record.metrics if m.kind in SYSTEM_METRICS}
                      - set(devices))
    if not devices:
        empty = go.Figure()
        empty.update_layout(**LAYOUT, title="Devices' system")
        return _empty(empty, "no device reported its CPU or memory")
    # (panel title, unit, scale, its kinds and each one's line: the device's solid, its total
    # dashed, the agent process's dotted)
    panels = [("CPU", "%", 1.0, (("cpu_pct", "solid"), ("proc_cpu_pct", "dot"))),
              ("memory", "GiB", 1 / GIB, (("mem_used_bytes", "solid"),
                                          ("mem_total_bytes", "dash"),
                                          ("proc_rss_bytes", "dot")))]
    if any(m.kind == "temp_c" for m in record.metrics):
        panels.append(("temperature", "°C", 1.0, (("temp_c", "solid"),)))
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[f"{title} ({unit})" for title, unit, _, _ in panels])
    for k, d in enumerate(devices):
        color = DEVICE_COLORS[k % len(DEVICE_COLORS)]
        legend = True  # the device's first trace names it in the legend
        for row, (_, unit, scale, kinds) in enumerate(panels, start=1):
            for kind, dash in kinds:
                points = _series(record.metrics, kind, d)
                if not points:
                    continue
                fig.add_trace(go.Scatter(
                    x=[m.at for m in points], y=[m.value * scale for m in points],
                    mode="lines", name=_label(record, d), legendgroup=d,
                    showlegend=legend,
                    line={"color": color, "dash": dash, "width": 1 if dash == "dash" else 1.6},
                    meta={"device": d, "kind": kind},
                    hovertemplate=f"{kind}: %{{y:.3g}} {unit}<br>%{{x:.1f}} s"
                                  "<extra>%{fullData.name}</extra>"),
                    row=row, col=1)
                legend = False
    fig.update_layout(**LAYOUT, title="Devices' system (dotted: the agent process; dashed: "
                                      "the device's memory in all)",
                      height=140 + 200 * len(panels), legend={"orientation": "h", "y": -0.12})
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(range=[0, 100], row=1, col=1)
    fig.update_xaxes(title="run time (s)", row=len(panels), col=1)
    return fig


# --------------------------------------------------------------------------- faults


def recovery_spans(record: RunRecord) -> list[tuple[float, float, str]]:
    """Each recovery as (start, end, how it ended): from a device loss (or the recovery's
    start) to the next recovered or run_failed event; one still open ends with the run."""
    spans: list[tuple[float, float, str]] = []
    opened: float | None = None
    for f in sorted(record.faults, key=lambda f: f.at):
        if f.kind in RECOVERY_OPENS and opened is None:
            opened = f.at
        elif f.kind in RECOVERY_CLOSES and opened is not None:
            spans.append((opened, f.at, f.kind))
            opened = None
    if opened is not None:
        spans.append((opened, max(opened, record.makespan_s), "unfinished"))
    return spans


def faults_figure(record: RunRecord) -> go.Figure:
    """The fault and control events on a time line, one row per kind, with each recovery
    shaded from the loss to the resumption."""
    faults = sorted(record.faults, key=lambda f: f.at)
    fig = go.Figure()
    if not faults:
        fig.update_layout(**LAYOUT, title="Faults and recoveries", height=220)
        return _empty(fig, "no fault or control event")
    fig.add_trace(go.Scatter(
        x=[f.at for f in faults], y=[f.kind.replace("_", " ") for f in faults],
        mode="markers", name="events",
        marker={"size": 11, "color": [FAULT_COLORS.get(f.kind, "#64748b") for f in faults]},
        text=[_label(record, f.device) if f.device else "run" for f in faults],
        customdata=[json.dumps(dict(f.detail or {}), sort_keys=True)[:200] for f in faults],
        hovertemplate="%{y} · %{text}<br>%{x:.3f} s<br>%{customdata}<extra></extra>"))
    for start, end, how in recovery_spans(record):
        fig.add_vrect(x0=start, x1=end, fillcolor="#dcfce7" if how == "recovered" else "#fee2e2",
                      opacity=0.5, line={"width": 0}, layer="below",
                      annotation_text=f"recovery {end - start:.1f} s",
                      annotation_position="top left")
    kinds = list(dict.fromkeys(f.kind.replace("_", " ") for f in faults))
    fig.update_layout(**LAYOUT, title="Faults and recoveries",
                      height=max(240, 140 + 30 * len(kinds)), showlegend=False)
    fig.update_xaxes(title="run time (s)")
    fig.update_yaxes(categoryorder="array", categoryarray=kinds, autorange="reversed",
                     automargin=True)
    return fig


def report_figures(record: RunRecord, *, max_events: int = GANTT_MAX_EVENTS
                   ) -> dict[str, go.Figure]:
    """Every figure of the report, by name, in the report's order."""
    return {"plans": plans_figure(record),
            "gantt": gantt_figure(record, max_events=max_events),
            "idle": idle_figure(record), "system": system_figure(record),
            "throughput": throughput_figure(record),
            "training": training_figure(record), "faults": faults_figure(record)}

