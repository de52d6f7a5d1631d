"""Run by test_fault_tolerance.py in a process of its own (Django on a var dir of its own): the
demo's three agents, an MLP run planned by FTPipeHD, started through the API, and the middle
stage's agent stopped (SIGSTOP) before the start and killed with SIGKILL right after it,
while the stages deploy. Prints the run's summary, fault events and generations as one JSON
line.

    python tests/integration/start_kill.py VAR_DIR
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.testbed import free_port, setup_django  # noqa: E402  (the path above)


def main(var_dir: str) -> None:
    setup_django(var_dir)
    from webapp.demo.scenario import LocalTestbed, chosen_plan
    from webapp.runs.models import FaultEvent, Generation, Run

    with LocalTestbed(port=free_port(), say=lambda line: print(line, file=sys.stderr)) as bed:
        bed.measure_links()
        spec = bed.model_spec(model="mlp", dataset="digits", batch_size=32)
        compared = bed.plan(spec, devices=bed.devices, name="killed while starting",
                            algorithms=["ftpipehd"], schedule="1f1b", microbatches=8,
                            batches=60, repartition_every=0)
        row = chosen_plan(compared, "ftpipehd")
        run_id = compared["run"]
        victim = bed.agent_of_stage(run_id, row["plan"])
        # stopped before the start, killed after it: its stage cannot be ready when it dies.
        # Killed right after the start (while it built its model) it once got its stage
        # ready first on a loaded machine, and the run started with it (CI at 26e9d66)
        stopped = bed.processes.children[bed.agent_process(victim)].process
        assert stopped is not None
        os.killpg(stopped.pid, signal.SIGSTOP)
        bed.api.post(f"/api/runs/{run_id}/start/", {"plan": row["plan"]})
        bed.processes.kill(bed.agent_process(victim))
        summary = bed.finish(run_id, timeout_s=300)
        run = Run.objects.get(pk=run_id)
        print(json.dumps({
            "summary": summary, "victim": victim.name,
            "faults": [[f.kind, f.at, f.device] for f in FaultEvent.objects.filter(run=run)],
            "generations": [[g.number, g.resume_microbatch, g.plan["stages"]]
                            for g in Generation.objects.filter(run=run).order_by("number")],
            "devices": {d["name"]: d["uid"] for d in bed.devices}}))


if __name__ == "__main__":
    main(sys.argv[1])
