"""Errors raised by the planning core.

Every error names the file the bad input came from (or ``<input>``), the field as a JSON
path (``layers[3].forward_s``) and the offending value, so that the CLI, the REST API and the
agent can all turn it into one readable line.
"""

from __future__ import annotations

from typing import Any


class FormatError(ValueError):
    """Input that does not follow the shared formats (docs/architecture.md)."""

    def __init__(self, reason: str, *, file: str = "<input>", field: str = "", value: Any = None,
                 show_value: bool = True) -> None:
        self.reason = reason
        self.file = file
        self.field = field
        self.value = value
        where = f"{file}: {field}: " if field else f"{file}: "
        shown = f" (got {_short(value)})" if show_value and value is not None else ""
        super().__init__(f"{where}{reason}{shown}")


class PlanningError(ValueError):
    """A well-formed input for which the planner cannot produce a plan (for example no
    partition fits in the devices' memory)."""


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
