"""Errors that services raise; the API turns each into one JSON answer (webapp.common.errors)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FieldError:
    field: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"field": self.field, "reason": self.reason}


class ApplicationError(Exception):
    """A request the domain refuses, with a message fit to show to the user."""

    status_code = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(ApplicationError):
    """Input that names a field and says what is wrong with it (400)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.errors = (FieldError(field, reason),)


class Conflict(ApplicationError):
    """The object's current state does not allow the request (409)."""

    status_code = 409

    def __init__(self, message: str, *, state: str, action: str) -> None:
        super().__init__(message)
        self.state = state
        self.action = action


class IllegalTransition(Conflict):
    """A state-machine transition that is not allowed from the current state."""

    def __init__(self, *, entity: str, state: str, target: str, action: str) -> None:
        super().__init__(f"{entity} is {state}: cannot {action} it (transition {state} -> "
                         f"{target} is not allowed)", state=state, action=action)
        self.target = target

    @property
    def transition(self) -> str:
        return f"{self.state} -> {self.target}"


def distinct_choices(values: Sequence[str], known: Collection[str], *, field: str,
                     what: str) -> list[str]:
    """``values`` when they name at least one of ``known`` and none twice; else InvalidInput
    naming the entry (``field[i]``) and saying what is wrong (``what``: "algorithm")."""
    if not values:
        raise InvalidInput(field, f"must name at least one {what}")
    for i, value in enumerate(values):
        if value not in known:
            raise InvalidInput(f"{field}[{i}]", f"unknown {what} {value!r}; known: "
                                                f"{', '.join(known)}")
        if value in values[:i]:
            raise InvalidInput(f"{field}[{i}]", f"repeats {value!r}")
    return list(values)
