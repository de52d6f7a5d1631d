"""Creating runs: a draft run of a model on devices, its settings checked."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from orchestrator.formats import SCHEDULES, synchronous
from orchestrator.partition import PLANNERS
from orchestrator.schedule import MAX_MICROBATCHES
from webapp.common.exceptions import InvalidInput, distinct_choices
from webapp.devices.models import Device, ModelSpec
from webapp.runs import events
from webapp.runs.models import (
    AGGREGATE_EVERY_MAX,
    LR_MAX,
    MOMENTUM_MAX,
    RECOVERY_POLICIES,
    RUN_DEFAULTS,
    Run,
    RunDevice,
)

log = logging.getLogger(__name__)


def check_algorithms(algorithms: Sequence[str], field: str = "algorithms") -> list[str]:
    return distinct_choices(algorithms, PLANNERS, field=field, what="algorithm")


@transaction.atomic
def run_create(*, name: str, model_spec: ModelSpec, devices: Sequence[Device],
               algorithms: Sequence[str], schedule: str = RUN_DEFAULTS["schedule"],
               microbatches: int = RUN_DEFAULTS["microbatches"],
               batches: int = RUN_DEFAULTS["batches"], epochs: int = RUN_DEFAULTS["epochs"],
               chain_every: int = RUN_DEFAULTS["chain_every"],
               global_every: int = RUN_DEFAULTS["global_every"],
               repartition_after: int = RUN_DEFAULTS["repartition_after"],
               repartition_every: int = RUN_DEFAULTS["repartition_every"],
               recovery_policy: str = RUN_DEFAULTS["recovery_policy"],
               lr: float = RUN_DEFAULTS["lr"], momentum: float = RUN_DEFAULTS["momentum"],
               vertical_sync: bool = RUN_DEFAULTS["vertical_sync"],
               aggregate_every: int = RUN_DEFAULTS["aggregate_every"],
               created_by: AbstractBaseUser | None = None) -> Run:
    """A draft run of ``model_spec`` on ``devices`` (in pipeline order); what is left out
    takes the Run model's default (RUN_DEFAULTS). ``chain_every``, ``global_every``
    (replication) and ``repartition_every`` count batches, 0 turning each off;
    ``repartition_after``, ``lr`` and ``momentum`` (every stage's SGD), ``vertical_sync`` and
    ``aggregate_every`` (asynchronous 1F1B's: kept but ignored under gpipe and 1f1b-sync, and
    0 there) are checked here
    too since services are called without the API's validation (the run form, benches)."""
    if not devices:
        raise InvalidInput("devices", "must name at least one device")
    for i, device in enumerate(devices):
        if device.status == Device.Status.RETIRED:
            raise InvalidInput(f"devices[{i}]", f"device {device.pk} ({device.uid}) is retired")
        if device in devices[:i]:
            raise InvalidInput(f"devices[{i}]", f"repeats device {device.pk}")
    if schedule not in SCHEDULES:
        raise InvalidInput("schedule", f"must be one of {', '.join(SCHEDULES)}")
    total = microbatches * batches * epochs
    if total > MAX_MICROBATCHES:
        raise InvalidInput("batches", f"{batches:,} batches of {microbatches} micro-batches"
                           + (f" over {epochs} epochs" if epochs > 1 else "")
                           + f" make {total:,} micro-batches; a run trains at most "
                           f"{MAX_MICROBATCHES:,}")
    fault_settings = {"chain_every": chain_every, "global_every": global_every,
                      "repartition_after": repartition_after,
                      "repartition_every": repartition_every}
    for field, value in fault_settings.items():
        least = 1 if field == "repartition_after" else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InvalidInput(field, f"must be an integer of at least {least} (batches)")
    if recovery_policy not in RECOVERY_POLICIES:
        raise InvalidInput("recovery_policy", f"must be {' or '.join(RECOVERY_POLICIES)}")
    if not _finite_number(lr) or not 0 < lr <= LR_MAX:
        raise InvalidInput("lr", f"must be a number above 0 and at most {LR_MAX:g}")
    if not _finite_number(momentum) or not 0 <= momentum <= MOMENTUM_MAX:
        raise InvalidInput("momentum", f"must be a number from 0 to {MOMENTUM_MAX}")
    if not isinstance(vertical_sync, bool):
        raise InvalidInput("vertical_sync", "must be true or false")
    if (isinstance(aggregate_every, bool) or not isinstance(aggregate_every, int)
            or not 0 <= aggregate_every <= AGGREGATE_EVERY_MAX):
        raise InvalidInput("aggregate_every", f"must be an integer from 0 to "
                                              f"{AGGREGATE_EVERY_MAX} (in-flight windows)")
    if aggregate_every and synchronous(schedule):
        raise InvalidInput("aggregate_every", f"must be 0 under {schedule}: weight aggregation "
                                              "is for the stale weight versions of "
                                              "asynchronous 1f1b")
    run = Run.objects.create(name=name, model_spec=model_spec,
                             algorithms=check_algorithms(algorithms), schedule=schedule,
                             microbatches=microbatches, batches=batches, epochs=epochs,
                             created_by=created_by, recovery_policy=recovery_policy,
                             lr=float(lr), momentum=float(momentum),
                             vertical_sync=vertical_sync, aggregate_every=aggregate_every,
                             **fault_settings)
    RunDevice.objects.bulk_create(RunDevice(run=run, device=d, position=k)
                                  for k, d in enumerate(devices))
    events.run_event_send(run.pk, events.event_run(run))
    return run


def _finite_number(value: object) -> bool:
    """Is ``value`` an int or a float (not a bool), and finite? (The run form's parser of
    typed numbers is webapp.dashboard.services.form_number.)"""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))
