"""Fault tolerance on the server: a lost device's run recovers instead of failing
(docs/architecture.md, "Fault tolerance and dynamic re-partition").

Thin over the planning core: `orchestrator.capacity` re-estimates the devices from what they
measured, the run's planner plans the devices still there, `orchestrator.recovery` chooses the
resume point and where each device's weights come from. This package keeps the state machine:

    running --device lost--> recovering: survivors halt and report their holdings
    all halted --> re-plan, resume point, deploy the next generation with its restore lists
    all ready (the commit barrier) --> start at the resume point: running again

A run still starting (its stages deploying) recovers the same way, but nothing has been trained
yet: the survivors' new stages are built from the run's seed, as the first deployment did, and
the run starts at micro-batch 0 when they are ready. A paused run recovers the same way and
ends paused: its next generation is started paused, and resuming the run resumes it. A pause
asked for during a recovery is kept until the recovery ends, then takes effect the same way
(the recovery's halts and deployments are not paused stages, and a run moved to paused
mid-recovery waited for them for ever).

Re-planning runs here, in the web process that received the agent's message, not on a Celery
worker: it takes milliseconds for the non-learned planners, and a worker's queue would add its
polling to a recovery that must take seconds (the embedded broker polls once a second).

The package's modules: ``inputs`` (what a re-plan plans with), ``replan`` (loss, halts,
re-plan, deployment), ``commit``, ``repartition`` (the dynamic re-partition) and ``probes``.
"""

from webapp.runs.recovery.commit import recovery_ready
from webapp.runs.recovery.inputs import measured_period_s, measured_stage_s, planning_devices
from webapp.runs.recovery.probes import probe_verdict, run_probe_answered, run_suspect
from webapp.runs.recovery.repartition import run_repartition_check
from webapp.runs.recovery.replan import run_device_back, run_device_lost, run_stage_halted

__all__ = [
    "measured_period_s", "measured_stage_s", "planning_devices", "probe_verdict",
    "recovery_ready", "run_device_back", "run_device_lost",
    "run_probe_answered", "run_repartition_check", "run_stage_halted", "run_suspect",
]
