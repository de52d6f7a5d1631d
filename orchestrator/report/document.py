"""A run report as one self-contained HTML file: a summary, the figures of
:mod:`orchestrator.report.figures` and the fault and control events listed. plotly.js is
embedded once (``plotly.io.to_html(include_plotlyjs=True)``, the pinned plotly package's own
bundle), so the file opens offline and loads nothing from anywhere.
"""

from __future__ import annotations

import json
from html import escape

import plotly.io as pio

from orchestrator.events import steady_throughput_sps
from orchestrator.report.figures import recovery_spans, report_figures
from orchestrator.report.record import GANTT_MAX_EVENTS, RunRecord

# the figures' tool bars: no plotly logo (a link out)
PLOT_CONFIG = {"displaylogo": False, "responsive": True}
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #0f172a; margin: 24px auto;
       max-width: 1280px; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } section { margin-top: 24px; }
.muted { color: #64748b; } dl { display: grid; grid-template-columns: max-content 1fr;
gap: 4px 16px; } dt { color: #64748b; } dd { margin: 0; }
table.events { border-collapse: collapse; font-size: 13px; }
table.events td, table.events th { border-bottom: 1px solid #e2e8f0; padding: 3px 10px;
text-align: left; vertical-align: top; }
"""


def _summary(record: RunRecord) -> list[tuple[str, str]]:
    devices = record.device_order()
    rows = [("schedule", record.schedule),
            ("devices", ", ".join(record.label(d) for d in devices) or "none"),
            ("timeline events", f"{len(record.events):,}"),
            ("last event", f"{record.makespan_s:.3f} s of run time")]
    if record.batch_size:
        steady = steady_throughput_sps(record.events, samples_per_microbatch=record.batch_size)
        rows.append(("steady throughput", f"{steady:.4g} samples/s measured" if steady
                     else "too few micro-batches to tell"))
    chosen = record.chosen_plan
    if chosen is not None:
        predicted = ("" if chosen.throughput_sps is None
                     else f", predicted {chosen.throughput_sps:.4g} samples/s")
        rows.append(("plan", f"{chosen.algorithm}{predicted}"))
    spans = recovery_spans(record)
    rows.append(("faults and control events",
                 f"{len(record.faults)}; {len(spans)} recoveries"
                 + "".join(f"; {end - start:.1f} s ({how})" for start, end, how in spans)))
    if record.source:
        rows.append(("made from", record.source))
    return rows


def _events_table(record: RunRecord) -> str:
    if not record.faults:
        return ""
    lines = ["<table class=\"events\"><thead><tr><th>time (s)</th><th>event</th>"
             "<th>device</th><th>detail</th></tr></thead><tbody>"]
    for f in sorted(record.faults, key=lambda f: f.at):
        detail = json.dumps(dict(f.detail or {}), sort_keys=True)
        lines.append(f"<tr><td>{f.at:.3f}</td><td>{escape(f.kind.replace('_', ' '))}</td>"
                     f"<td>{escape(record.label(f.device) if f.device else 'run')}</td>"
                     f"<td><code>{escape(detail)}</code></td></tr>")
    lines.append("</tbody></table>")
    return "\n".join(lines)


def report_html(record: RunRecord, *, max_events: int = GANTT_MAX_EVENTS) -> str:
    """The report of ``record`` as a complete HTML document (plotly.js included)."""
    sections = []
    for k, (name, fig) in enumerate(report_figures(record, max_events=max_events).items()):
        div = pio.to_html(fig, full_html=False, include_plotlyjs=k == 0,
                          div_id=f"report-{name}", config=PLOT_CONFIG,
                          default_height=f"{fig.layout.height or 400}px")
        extra = _events_table(record) if name == "faults" else ""
        sections.append(f'<section id="{name}">\n{div}\n{extra}</section>')
    summary = "\n".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>"
                        for k, v in _summary(record))
    title = escape(record.title)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>EdgePipe report: {title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        f"<h1>EdgePipe run report: {title}</h1>\n<p class=\"muted\">Times are seconds since "
        "the run started. Every figure can be zoomed; the file needs no network.</p>\n"
        f"<dl>{summary}</dl>\n" + "\n".join(sections) + "\n</body>\n</html>\n")
