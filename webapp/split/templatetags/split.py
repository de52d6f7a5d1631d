"""Template filters of the split-learning pages: a gap as a signed percentage."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def gap(value: float | None) -> str:
    """``0.079`` -> ``+7.9%``, ``0`` -> ``0%``, None -> ``–`` (the page's script writes the
    same)."""
    if value is None:
        return "–"
    percent = float(value) * 100
    if percent == 0:
        return "0%"
    return f"+{percent:.0f}%" if percent >= 10 else f"+{percent:.1f}%"
