"""A text Gantt chart of a split-learning schedule, one block of rows per helper.

Each client of a helper gets a row over the slots 0..makespan: ``>`` where the helper runs the
client's forward task, ``<`` its backward task, ``|`` where the client completes. Wide
schedules are scaled so that a column covers several slots (a column shows a task if any of
its slots does).
"""

from __future__ import annotations

import math

from orchestrator.sl.formats import Instance, Schedule

MAX_COLUMNS = 100


def gantt(*, instance: Instance, schedule: Schedule, max_columns: int = MAX_COLUMNS) -> str:
    """The chart as text, ending with a newline."""
    if max_columns < 10:
        raise ValueError(f"max_columns must be at least 10, got {max_columns}")
    span = max(schedule.makespan, 1)
    per_column = max(1, math.ceil(span / max_columns))
    columns = math.ceil(span / per_column)
    label = max(len(f"client {instance.clients - 1}"), len("slot"))
    lines = [f"{instance.name}: {schedule.method}, makespan {schedule.makespan} slots "
             f"({schedule.makespan * instance.slot_ms / 1000:.2f} s); 1 column = {per_column} "
             f"slot{'s' if per_column > 1 else ''}; > forward, < backward, | completion",
             f"{'slot':>{label + 2}} {_ruler(columns, per_column)}"]
    for i in range(instance.helpers):
        clients = [j for j, a in enumerate(schedule.assignment) if a == i]
        busy = sum(s.slots for s in (*schedule.forward, *schedule.backward) if s.helper == i)
        lines.append(f"helper {i}: {len(clients)} clients, busy {busy} slots")
        for j in clients:
            row = [" "] * columns
            for mark, segments in ((">", schedule.forward), ("<", schedule.backward)):
                for seg in segments:
                    if seg.client == j:
                        for col in range(seg.start // per_column,
                                         math.ceil(seg.end / per_column)):
                            row[col] = mark
            done = min((schedule.completion[j] - 1) // per_column, columns - 1)
            row[done] = "|"
            lines.append(f"  {f'client {j}':>{label}} {''.join(row)} {schedule.completion[j]}")
    return "\n".join(lines) + "\n"


def _ruler(columns: int, per_column: int) -> str:
    """Tick labels every ten columns."""
    out = ""
    for col in range(0, columns, 10):
        out += f"{col * per_column:<10}"
    return out[:columns + 6].rstrip()
