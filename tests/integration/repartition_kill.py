"""Run by test_fault_tolerance.py in a process of its own (Django on a var dir of its own): the
demo's three agents train an MLP run; the run re-partitions, and a device of the new layout is
killed (SIGKILL) the moment the server has moved it there, before any replica of the new layout
can exist (issue 28: "recovery 2 failed: layer 3 has no copy anywhere"). Prints the run's
summary, fault events, generations and the devices killed as one JSON line.

    python tests/integration/repartition_kill.py VAR_DIR SCENARIO

SCENARIO says how the run re-partitions and when the second device goes:

- ``failure``: an FTPipeHD run loses its middle stage's device; the recovery re-partitions
  on the two others, and one of the new plan's devices is killed as training resumes on it
  (the server's ``recovered``: it has just sent every device its start);
- ``deploying``: as ``failure``, the new plan's device killed as soon as the server has
  re-planned (``repartitioned``), while the new layout deploys;
- ``dynamic``: nobody fails: the plan's middle device slows down 200x and the dynamic
  re-partition moves layers away from it; a device of the new plan is killed as training
  resumes on it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.testbed import free_port, setup_django  # noqa: E402  (the path above)

SCENARIOS = ("failure", "deploying", "dynamic")
# seconds, generous: two cores shared by the web server, the worker and three agents
DEADLINE_S = 300.0


def main(var_dir: str, scenario: str) -> None:
    if scenario not in SCENARIOS:
        raise SystemExit(f"scenario must be one of {', '.join(SCENARIOS)}, not {scenario!r}")
    setup_django(var_dir)
    from webapp.demo.client import wait_for
    from webapp.demo.scenario import LocalTestbed, chosen_plan
    from webapp.runs.models import FaultEvent, Generation, Run, TimelineEvent

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with LocalTestbed(port=free_port(), say=say) as bed:
        bed.measure_links()
        spec = bed.model_spec(model="mlp", dataset="digits", batch_size=32)
        dynamic = scenario == "dynamic"
        # the dynamic re-partition re-runs the run's planner: FTPipeHD's keeps every device
        # and cannot take anything from a device it gave one layer (test_dynamic_repartition)
        algorithm = "optimal" if dynamic else "ftpipehd"
        # a dynamic re-partition checked after the first batch, then every other one
        run_id = bed.api.post("/api/runs/", {
            "name": f"re-partitioned, then a loss ({scenario})", "model_spec": spec,
            "devices": [d["id"] for d in bed.devices], "algorithms": [algorithm],
            "schedule": "1f1b", "microbatches": 8, "batches": 150, "epochs": 1,
            "repartition_after": 1, "repartition_every": 2 if dynamic else 0})["id"]
        bed.api.post(f"/api/runs/{run_id}/plan/")
        planned = bed.wait_state(run_id, (Run.State.PLANNED, Run.State.FAILED), DEADLINE_S)
        assert planned["state"] == Run.State.PLANNED, planned
        row = chosen_plan(bed.api.get(f"/api/runs/{run_id}/plans/compare/"), algorithm)
        by_uid = {d["uid"]: a for d, a in zip(bed.devices, bed.agents, strict=True)}
        first_victim = bed.agent_of_stage(run_id, row["plan"])
        bed.start(run_id, row["plan"])

        def trained(updates: int) -> bool:
            bed.check_children()
            return TimelineEvent.objects.filter(run_id=run_id, kind="update").count() >= updates

        # some training first, so that there is something to lose (and to restore)
        wait_for(lambda: trained(40), timeout_s=DEADLINE_S, what="the run to train",
                 every_s=0.05)
        killed = []
        if dynamic:
            bed.slow_agent_at(run_id, first_victim, 0.0, 200.0)
        else:
            bed.processes.kill(bed.agent_process(first_victim))
            killed.append(first_victim.name)
            say(f"killed {first_victim.name}")

        marker = "repartitioned" if scenario == "deploying" else "recovered"

        def moved() -> dict[str, Any] | None:
            bed.check_children()
            event = FaultEvent.objects.filter(run_id=run_id, kind=marker).order_by("id").first()
            return None if event is None else dict(event.detail)

        detail = wait_for(moved, timeout_s=DEADLINE_S, what=f"the run's first {marker}",
                          every_s=0.02)
        generation = Generation.objects.get(run_id=run_id, number=detail["generation"])
        staged = [d for stage in generation.plan["stages"] for d in stage["devices"]]
        # a device the new layout gave layers, the one of its last stage (whose weights go to
        # the first stage's device only when it replicates them: not yet)
        victim = by_uid[next(d for d in reversed(staged) if by_uid[d].name not in killed)]
        bed.processes.kill(bed.agent_process(victim))
        killed.append(victim.name)
        say(f"killed {victim.name} at the run's {marker} of generation {generation.number}")
        summary = bed.finish(run_id, timeout_s=2 * DEADLINE_S)
        run = Run.objects.get(pk=run_id)
        print(json.dumps({
            "summary": summary, "killed": killed,
            "devices": {d["name"]: d["uid"] for d in bed.devices},
            "faults": [[f.kind, f.at, f.device, f.detail]
                       for f in FaultEvent.objects.filter(run=run).order_by("at", "id")],
            "generations": [{"number": g.number, "cause": g.cause, "lost": g.lost,
                             "resume": g.resume_microbatch, "stages": g.plan["stages"],
                             "transfers": g.transfers}
                            for g in Generation.objects.filter(run=run).order_by("number")]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
