"""Parallel split learning: client-helper assignment and forward/backward scheduling.

Tirana, Tsigkari, Iosifidis and Chatzopoulos, "Workflow Optimization for Parallel Split
Learning", IEEE INFOCOM 2024. Formats in :mod:`orchestrator.sl.formats`, the feasibility
checker in :mod:`orchestrator.sl.check`, the methods behind :func:`solve`.
"""

from orchestrator.sl.check import CONSTRAINTS, Violation, check_schedule, first_violation
from orchestrator.sl.formats import (
    Instance,
    Schedule,
    Segment,
    load_instance,
    load_schedule,
    parse_instance,
    parse_schedule,
    read_instances,
)
from orchestrator.sl.gantt import gantt
from orchestrator.sl.machine import Job, algorithm2, jackson
from orchestrator.sl.solve import METHODS, solve

__all__ = [
    "CONSTRAINTS",
    "METHODS",
    "Instance",
    "Job",
    "Schedule",
    "Segment",
    "Violation",
    "algorithm2",
    "check_schedule",
    "first_violation",
    "gantt",
    "jackson",
    "load_instance",
    "load_schedule",
    "parse_instance",
    "parse_schedule",
    "read_instances",
    "solve",
]
