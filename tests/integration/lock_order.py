"""Run by tests/webapp/integration/test_shared_topology.py in a process of its own, with the
shared topology's settings in its environment (a throwaway PostgreSQL database): an agent's
events batch stored while another writer holds the run's row and then wants the device's
membership of the run (a stage report does that: the run, then the membership). Prints the
errors either writer met and the timeline events stored, as one JSON line.

    python tests/integration/lock_order.py
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

WAIT_S = 30.0


def main() -> None:
    os.chdir(ROOT)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, connections, transaction

    from tests.webapp.factories import DeviceFactory, RunFactory
    from webapp.runs import services
    from webapp.runs.models import Run, RunDevice, TimelineEvent

    call_command("migrate", verbosity=0, interactive=False)
    device = DeviceFactory()
    run = RunFactory(state=Run.State.RUNNING, devices=[device])
    event = {"run": run.pk, "device": device.uid, "stage": 0, "kind": "forward",
             "microbatch": 1, "version": 0, "start": 1.0, "end": 1.5}
    errors: list[str] = []
    run_locked = threading.Event()
    store_pid: list[int] = []

    def waiting_on_a_lock(pid: int) -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
            row = cursor.fetchone()
        return row is not None and row[0] == "Lock"

    def report() -> None:  # the run's row, then the device's membership
        try:
            with transaction.atomic():
                Run.objects.select_for_update().get(pk=run.pk)
                run_locked.set()
                deadline = time.monotonic() + WAIT_S
                while not (store_pid and waiting_on_a_lock(store_pid[0])):
                    if time.monotonic() > deadline:
                        raise TimeoutError("the events batch never waited for the run's row")
                    time.sleep(0.02)
                RunDevice.objects.select_for_update().get(run=run, device=device)
        except Exception as exc:
            errors.append(f"report: {type(exc).__name__}: {exc}")
        finally:
            connections.close_all()

    def store() -> None:  # an agent's events batch
        try:
            run_locked.wait(WAIT_S)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                store_pid.append(cursor.fetchone()[0])
            services.run_events_store(run=run, device=device, timeline=[event], stream="s",
                                      seq=1)
        except Exception as exc:
            errors.append(f"store: {type(exc).__name__}: {exc}")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=report), threading.Thread(target=store)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * WAIT_S)
    print(json.dumps({"errors": errors,
                      "stored": TimelineEvent.objects.filter(run=run).count()}))


if __name__ == "__main__":
    main()
