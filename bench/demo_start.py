"""How long ``manage.py demo`` takes to reach a live Gantt: the seconds from launching it to the
dashboard's address being printed, to the devices being online, and to the run's first
training event, on a first start (a new var dir: agents enrol, every device profiles the
model) and on a second start with the same var dir (enrolments, profiles and the agents'
stored probes reused).

    python bench/demo_start.py --runs 3
    python bench/demo_start.py --runs 3 --tree before=/tmp/edgepipe-before --tree after=.

Each run is a headless demo of a few batches (``--batches``) on the embedded default (SQLite,
no Redis), in a var dir of its own under /tmp; with several ``--tree``s the trees take turns,
so that a busy machine's noise falls on all of them alike. The first training event is read
from the run's stored timeline (its ``started_at`` plus its earliest event's start, on the
server's clock), not from the demo's output.
"""

from __future__ import annotations

import argparse
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.testbed import ROOT, free_port

MARKS = {"url_s": re.compile(r"EdgePipe dashboard on "),
         "online_s": re.compile(r"devices online"),
         "planning_s": re.compile(r"planning with "),
         "training_s": re.compile(r"training: open ")}


def first_event_at(var_dir: Path) -> float | None:
    """The wall-clock time of the newest run's first timeline event (server's clock)."""
    with sqlite3.connect(var_dir / "db.sqlite3") as db:
        row = db.execute("SELECT r.started_at, MIN(e.start) FROM runs_run r JOIN "
                         "runs_timelineevent e ON e.run_id = r.id GROUP BY r.id "
                         "ORDER BY r.id DESC LIMIT 1").fetchone()
    if row is None or row[0] is None:
        return None
    started = datetime.fromisoformat(str(row[0]))
    if started.tzinfo is None:
        started = started.replace(tzinfo=UTC)
    return started.timestamp() + float(row[1])


def one_start(tree: Path, var_dir: Path, *, batches: int, log: Path) -> dict[str, float]:
    """Launch one headless demo in ``tree`` with ``var_dir``; the seconds to each mark."""
    env = dict(os.environ, EDGEPIPE_VAR_DIR=str(var_dir), DEBUG="false",
               DJANGO_SETTINGS_MODULE="webapp.settings.local", PYTHONUNBUFFERED="1")
    for name in ("REDIS_URL", "DATABASE_URL"):
        env.pop(name, None)
    command = [sys.executable, "manage.py", "demo", "--headless", "--batches", str(batches),
               "--port", str(free_port())]
    launched_wall, launched = time.time(), time.monotonic()
    marks: dict[str, float] = {}
    with log.open("a") as out, subprocess.Popen(
            command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True) as demo:
        assert demo.stdout is not None
        for line in demo.stdout:
            at = time.monotonic() - launched
            out.write(f"{at:7.2f} {line}")
            for name, pattern in MARKS.items():
                if name not in marks and pattern.search(line):
                    marks[name] = at
    if demo.returncode != 0:
        raise RuntimeError(f"the demo in {tree} exited with {demo.returncode}; see {log}")
    first = first_event_at(var_dir)
    if first is not None:
        marks["first_event_s"] = first - launched_wall
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR",
                        help="a checkout to run manage.py demo in (default: this one)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=3)
    args = parser.parse_args()
    trees = [(label, Path(path).resolve()) for label, _, path in
             (t.partition("=") for t in args.tree)] or [("this", ROOT)]
    scratch = Path(tempfile.mkdtemp(prefix="edgepipe-demo-start-"))
    print(f"logs and var dirs in {scratch}")
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for run in range(args.runs):
        for label, tree in trees:
            var_dir = scratch / f"{label}-{run}"
            for start in ("first", "second"):
                marks = one_start(tree, var_dir, batches=args.batches,
                                  log=scratch / f"{label}-{run}-{start}.log")
                results.setdefault((label, start), []).append(marks)
                print(f"{label} run {run} {start} start (load {os.getloadavg()[0]:.1f}): "
                      + ", ".join(
                    f"{k} {v:.1f}" for k, v in marks.items()), flush=True)
    names = ("url_s", "online_s", "planning_s", "training_s", "first_event_s")
    print("\n| tree | start | " + " | ".join(names) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in names) + " |")
    for (label, start), rows in results.items():
        cells = []
        for name in names:
            values = [r[name] for r in rows if name in r]
            cells.append(f"{statistics.median(values):.1f} ("
                         + ", ".join(f"{v:.1f}" for v in values) + ")" if values else "-")
        print(f"| {label} | {start} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
