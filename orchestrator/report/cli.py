"""``python -m orchestrator report``: a run's report as one HTML file that opens offline, from
the files its run page exports (timeline trace, metrics CSV, plan JSON). Bad input raises
:class:`~orchestrator.errors.FormatError` naming the file, which the main CLI prints as one
``error:`` line with exit code 2. plotly is imported only when a report is made, so the other
subcommands run where it is not installed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from orchestrator.commands import positive_int
from orchestrator.errors import FormatError
from orchestrator.report.record import GANTT_MAX_EVENTS, load_run_record


def register(subparsers: Any) -> None:
    """Add the ``report`` subcommand to the main parser's subparsers."""
    parser = subparsers.add_parser(
        "report", help="write a run's report as one HTML file (plotly; opens offline)",
        description="Write a self-contained HTML report of a run: its plans compared, the "
                    "Gantt of every device's events (with the plan's predicted events "
                    "beneath, given --planned), idle time per device by cause, throughput "
                    "against the plan's prediction, loss and accuracy, and the fault and "
                    "control events with each recovery. Reads the files a run page exports "
                    "(Timeline trace, Metrics CSV, Plan JSON); plotly.js is embedded, so the "
                    "file needs no network.",
        epilog="Example: python -m orchestrator report --trace edgepipe-run-7-trace.json "
               "--metrics edgepipe-run-7-metrics.csv "
               "--plan edgepipe-run-7-plan-ftpipehd.json -o run-7.html")
    parser.add_argument("--trace", required=True, metavar="FILE",
                        help="the run's timeline: the run page's Timeline trace (Chrome trace "
                             "JSON, its metrics and faults included), or timeline events JSON "
                             "(a list, or {\"events\": [...]} as simulate prints)")
    parser.add_argument("--metrics", metavar="FILE",
                        help="the run page's Metrics CSV (at_s,kind,device,value); replaces "
                             "the metrics of the trace")
    parser.add_argument("--plan", action="append", default=[], metavar="FILE",
                        help="plan JSON; repeat to compare several: the first is the run's "
                             "plan (its predicted throughput is drawn against the measured)")
    parser.add_argument("--planned", metavar="FILE",
                        help="the plan's predicted timeline events JSON (python -m "
                             "orchestrator simulate), drawn beneath the measured events from "
                             "the run's first event on")
    parser.add_argument("--title", metavar="TEXT",
                        help="the report's title (default: the run's number and name)")
    parser.add_argument("--gantt-events", type=positive_int, default=GANTT_MAX_EVENTS,
                        metavar="N", help="draw at most the newest N events in the Gantt "
                                          "(default %(default)s; the other figures use all)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE",
                        help="the HTML file to write")
    parser.set_defaults(handler=_report)


def _report(args: argparse.Namespace) -> int:
    record = load_run_record(args.trace, metrics=args.metrics, plans=args.plan,
                             planned=args.planned, title=args.title)
    from orchestrator.report.document import report_html  # plotly: only here

    html = report_html(record, max_events=args.gantt_events)
    out = Path(args.output)
    try:
        out.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise FormatError(f"cannot be written: {exc.strerror or exc}", file=str(out)) from None
    devices = len(record.device_order())
    print(f"{out}: {record.title}, {devices} devices, {len(record.events):,} events, "
          f"{len(html) / 1e6:.1f} MB", file=sys.stderr)
    return 0
