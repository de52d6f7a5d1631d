"""Template filters of the dashboard's pages: a mapping's item, the units EdgePipe measures
in (seconds, bytes, bytes per second) written for people, and a run's schedule with its
settings."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

from orchestrator.formats import synchronous
from webapp.dashboard.selectors import plural as plural_words

register = template.Library()


@register.filter
def get(mapping: Any, key: Any) -> Any:
    return mapping.get(key) if hasattr(mapping, "get") else None


def _short(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


@register.filter
def seconds(value: float | None) -> str:
    if value is None:
        return "–"
    s = float(value)
    if s == 0:
        return "0 s"
    for limit, scale, unit in ((1e-3, 1e6, "µs"), (1.0, 1e3, "ms"), (120.0, 1.0, "s"),
                               (7200.0, 1 / 60, "min")):
        if abs(s) < limit:
            return f"{_short(s * scale)} {unit}"
    return f"{_short(s / 3600)} h"


@register.filter(name="bytes")
def bytes_(value: float | None) -> str:
    if value is None:
        return "–"
    v = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(v) < 1024:
            return f"{_short(v)} {unit}"
        v /= 1024
    return f"{_short(v)} TiB"


@register.filter
def rate(value: float | None) -> str:
    """Bytes per second."""
    if value is None:
        return "–"
    v = float(value)
    for limit, unit in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
        if abs(v) >= limit:
            return f"{_short(v / limit)} {unit}"
    return f"{_short(v)} B/s"


@register.filter
def ago(value: Any) -> str:
    """"just now", "3 minutes ago", or "never"."""
    if value is None:
        return "never"
    if (timezone.now() - value).total_seconds() < 60:
        return "just now"
    return f"{timesince(value)} ago"


@register.filter
def label(key: str) -> str:
    """A hardware field's name as a label: ``os`` -> ``OS``, ``total_memory`` -> ``Total
    memory``."""
    words = str(key).replace("_", " ")
    return words.upper() if len(words) <= 3 else words[:1].upper() + words[1:]


@register.filter
def plural(count: Any, words: str) -> str:
    """A count in words: ``{{ n|plural:"stage" }}`` is ``1 stage`` or ``2 stages``,
    ``{{ n|plural:"batch,batches" }}`` names the plural."""
    word, _, many = words.partition(",")
    return plural_words(count, word, many or None)


@register.filter
def schedule(run: Any) -> str:
    """A run's schedule with what it does against stale weights: ``1f1b, vertical sync,
    weight aggregation every 4 in-flight windows``; ``gpipe`` or ``1f1b-sync`` alone (they
    flush every batch and have no stale weights, so neither setting applies)."""
    if synchronous(run.schedule):
        return str(run.schedule)
    parts = [run.schedule, "vertical sync" if run.vertical_sync else "no vertical sync"]
    if run.aggregate_every:
        windows = "window" if run.aggregate_every == 1 else "windows"
        parts.append(f"weight aggregation every {run.aggregate_every} in-flight {windows}")
    return ", ".join(parts)
