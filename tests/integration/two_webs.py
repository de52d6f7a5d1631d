"""Run by tests/webapp/integration/test_shared_topology.py in a process of its own, with the
shared topology's settings in its environment (PostgreSQL, Redis): two web processes and two
Celery workers, the demo's three agents spread over both web processes, an MLP run planned by
FTPipeHD whose middle stage's agent is killed (SIGKILL) mid-run. Prints the run's summary, its
fault events, the web process each agent was connected to, and the micro-batches whose update
some device applied, as one JSON line.

    python tests/integration/two_webs.py VAR_DIR PORT PORT
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MICROBATCHES, BATCHES = 8, 100


def main(var_dir: str, port: int, other_port: int) -> None:
    os.environ["EDGEPIPE_VAR_DIR"] = var_dir
    os.chdir(ROOT)
    import django

    django.setup()
    from webapp.demo.client import wait_for
    from webapp.demo.scenario import LocalTestbed, chosen_plan
    from webapp.devices.models import Device
    from webapp.runs.models import FaultEvent, Run, TimelineEvent

    with LocalTestbed(port=port, more_web_ports=(other_port,), workers=2,
                      say=lambda line: print(line, file=sys.stderr)) as bed:
        bed.measure_links()
        spec = bed.model_spec(model="mlp", dataset="digits", batch_size=32)
        compared = bed.plan(spec, devices=bed.devices, name="two web processes",
                            algorithms=["ftpipehd"], schedule="1f1b",
                            microbatches=MICROBATCHES, batches=BATCHES, repartition_every=0)
        row = chosen_plan(compared, "ftpipehd")
        run_id = compared["run"]
        victim = bed.agent_of_stage(run_id, row["plan"])
        # a connection's channel name starts with its web process's own prefix
        processes = {d.name: d.control_channel.split("!")[0]
                     for d in Device.objects.filter(uid__in=[d["uid"] for d in bed.devices])}
        bed.start(run_id, row["plan"])
        wait_for(lambda: TimelineEvent.objects.filter(run_id=run_id, kind="update").count()
                 >= 40, timeout_s=120, what="the run to train before the kill", every_s=0.2)
        bed.processes.kill(bed.agent_process(victim))
        summary = bed.finish(run_id, timeout_s=600)
        run = Run.objects.get(pk=run_id)
        print(json.dumps({
            "summary": summary, "victim": victim.name, "processes": processes,
            "faults": [[f.kind, f.device, f.detail] for f in FaultEvent.objects.filter(run=run)],
            "updated": sorted(set(TimelineEvent.objects.filter(run=run, kind="update")
                                  .values_list("microbatch", flat=True))),
            "total": MICROBATCHES * BATCHES}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
