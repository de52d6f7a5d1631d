"""Run by test_fault_tolerance.py in a process of its own (Django on a var dir of its own): the
demo's three agents train an MLP run planned by FTPipeHD while the web server is killed
(SIGKILL) and started again after an outage of a few seconds. Prints the run's summary, its
fault events and, per stage, the micro-batches with forward and backward events as one JSON
line.

    python tests/integration/web_restart.py VAR_DIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.testbed import free_port, setup_django  # noqa: E402  (the path above)

OUTAGE_S = 5.0  # how long the web server stays down (the scenario, not a wait)


def main(var_dir: str) -> None:
    setup_django(var_dir)
    from webapp.demo.client import wait_for
    from webapp.demo.scenario import LocalTestbed, chosen_plan
    from webapp.runs.models import FaultEvent, Run, TimelineEvent

    with LocalTestbed(port=free_port(), say=lambda line: print(line, file=sys.stderr)) as bed:
        bed.measure_links()
        spec = bed.model_spec(model="mlp", dataset="digits", batch_size=32)
        compared = bed.plan(spec, devices=bed.devices, name="the web server restarts",
                            algorithms=["ftpipehd"], schedule="1f1b", microbatches=8,
                            batches=120, repartition_every=0)
        row = chosen_plan(compared, "ftpipehd")
        run_id = compared["run"]
        bed.start(run_id, row["plan"])
        wait_for(lambda: TimelineEvent.objects.filter(run_id=run_id, kind="update").count()
                 >= 50, timeout_s=120, what="the run to train before the restart", every_s=0.2)
        web = bed.processes.children["web"]
        bed.processes.kill("web")
        print(f"web server killed; down for {OUTAGE_S} s", file=sys.stderr)
        time.sleep(OUTAGE_S)
        bed.processes.start("web", web.command)
        bed.api.wait_until_up()
        summary = bed.finish(run_id, timeout_s=600)
        run = Run.objects.get(pk=run_id)
        stages: dict[str, dict[str, list[int]]] = {}
        for stage, kind, microbatch in TimelineEvent.objects.filter(
                run=run, kind__in=("forward", "backward")).values_list(
                    "stage", "kind", "microbatch"):
            stages.setdefault(str(stage), {}).setdefault(kind, []).append(microbatch)
        print(json.dumps({
            "summary": summary,
            "faults": [[f.kind, f.device] for f in FaultEvent.objects.filter(run=run)],
            "stages": stages}))


if __name__ == "__main__":
    main(sys.argv[1])
