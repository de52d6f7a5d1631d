"""Run by test_demo_restart.py in a process of its own (Django on a var dir of its own): the
demo's testbed, an MLP run with dynamic re-partition checks, the middle stage's agent stopped
through the API as *Stop agent* does, then started again through the API as *Restart agent*
does. The testbed must survive the stop (it used to end the demo) and the run must finish.
Prints what happened as one JSON line.

    python tests/integration/stop_restart.py VAR_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.testbed import free_port, setup_django  # noqa: E402  (the path above)


def main(var_dir: str) -> None:
    setup_django(var_dir)
    from webapp.demo.client import wait_for
    from webapp.demo.scenario import LocalTestbed, chosen_plan
    from webapp.runs.models import FaultEvent, Generation, Run

    with LocalTestbed(port=free_port(), say=lambda line: print(line, file=sys.stderr)) as bed:
        bed.measure_links()
        spec = bed.model_spec(model="mlp", dataset="digits", batch_size=32)
        compared = bed.plan(spec, devices=bed.devices, name="stopped and restarted",
                            algorithms=["ftpipehd"], schedule="1f1b", microbatches=8,
                            batches=3000, repartition_every=50, repartition_after=2)
        row = chosen_plan(compared, "ftpipehd")
        run_id = compared["run"]
        victim = bed.agent_of_stage(run_id, row["plan"])
        device = next(d for d in bed.devices if d["name"] == victim.name)
        bed.start(run_id, row["plan"])

        def trained(at_least: int) -> bool:
            bed.check_children()  # a stopped agent must not end the testbed
            return Run.objects.get(pk=run_id).timeline_events.filter(
                kind="update").count() >= at_least

        wait_for(lambda: trained(20), timeout_s=120, what="the run to train a little")
        stop = bed.api.post(f"/api/devices/{device['id']}/stop-agent/")
        lost = wait_for(lambda: bed.check_children() or FaultEvent.objects.filter(
            run_id=run_id, kind="device_lost", device=device["uid"]).first(), timeout_s=120,
            what="the stopped agent's device to be lost")
        recovered = wait_for(lambda: bed.check_children() or FaultEvent.objects.filter(
            run_id=run_id, kind="recovered", pk__gt=lost.pk).exists(), timeout_s=120,
            what="the run to recover without the stopped agent")
        restart = bed.api.post(f"/api/devices/{device['id']}/restart-agent/")
        joined = wait_for(lambda: bed.check_children() or FaultEvent.objects.filter(
            run_id=run_id, kind="device_joined", device=device["uid"]).exists(),
            timeout_s=120, what="the restarted agent's device to rejoin the run")
        summary = bed.finish(run_id, timeout_s=600)
        run = Run.objects.get(pk=run_id)
        print(json.dumps({
            "summary": summary, "victim": victim.name, "uid": device["uid"],
            "stop": stop, "restart": restart, "recovered": recovered, "joined": joined,
            "restarted": bed.processes.running(bed.agent_process(victim)),
            "faults": [[f.kind, f.at, f.device] for f in FaultEvent.objects.filter(run=run)],
            "generations": [[g.number, g.cause, g.plan["stages"]]
                            for g in Generation.objects.filter(run=run).order_by("number")]}))


if __name__ == "__main__":
    main(sys.argv[1])
