"""Reading JSON input strictly: every helper raises :class:`FormatError` naming the file, the
field as a JSON path (``layers[3].forward_s``) and the value. Shared by the formats of every
planner (pipelines, split learning, events), so every error reads the same."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import FormatError


@dataclass(frozen=True)
class At:
    """A position in an input document: its file and the JSON path of a value."""

    file: str
    path: str = ""

    def key(self, name: str) -> At:
        return At(self.file, f"{self.path}.{name}" if self.path else name)

    def index(self, i: int) -> At:
        return At(self.file, f"{self.path}[{i}]")

    def fail(self, reason: str, value: Any = None, *, show_value: bool = True) -> FormatError:
        return FormatError(reason, file=self.file, field=self.path, value=value,
                           show_value=show_value)


def expect_object(raw: Any, at: At, required: Sequence[str],
            optional: Sequence[str] = ()) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise at.fail(f"must be a JSON object, not {type(raw).__name__}", show_value=False)
    missing = [k for k in required if k not in raw]
    if missing:
        raise at.key(missing[0]).fail("is missing", show_value=False)
    known = set(required) | set(optional)
    unknown = sorted(k for k in raw if k not in known)
    if unknown:
        raise at.key(unknown[0]).fail(
            f"is not a known field (known: {', '.join(sorted(known))})", show_value=False)
    return raw


def expect_number(raw: Any, at: At, *, positive: bool = False, allow_zero: bool = True) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise at.fail("must be a number", raw)
    value = float(raw)
    if not math.isfinite(value):
        raise at.fail("must be finite", raw)
    if value < 0:
        raise at.fail("must not be negative", raw)
    if (positive or not allow_zero) and value == 0:
        raise at.fail("must be greater than zero", raw)
    return value


def expect_integer(raw: Any, at: At, *, minimum: int = 0) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise at.fail("must be an integer", raw)
    if isinstance(raw, float) and (not math.isfinite(raw) or not raw.is_integer()):
        raise at.fail("must be an integer", raw)
    value = int(raw)
    if value < minimum:
        raise at.fail(f"must be at least {minimum}", raw)
    return value


def expect_string(raw: Any, at: At) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise at.fail("must be a non-empty string", raw)
    return raw


def expect_list(raw: Any, at: At, *, nonempty: bool = True) -> list[Any]:
    if not isinstance(raw, list):
        raise at.fail(f"must be a JSON array, not {type(raw).__name__}", show_value=False)
    if nonempty and not raw:
        raise at.fail("must not be empty", show_value=False)
    return raw


def read_text(path: str | Path) -> str:
    """Read a UTF-8 text file, turning I/O problems into a FormatError naming the file."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FormatError("no such file", file=str(p)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FormatError(f"cannot be read: {exc}", file=str(p)) from None


def read_json(path: str | Path) -> Any:
    """Read a JSON file, turning I/O and syntax problems into a FormatError naming the file."""
    p = Path(path)
    text = read_text(p)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                          file=str(p)) from None
