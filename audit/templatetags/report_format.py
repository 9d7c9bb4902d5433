"""Filters of the report pages: durations and percentages as people read them."""

from __future__ import annotations

from datetime import timedelta

from django import template

register = template.Library()


@register.filter
def duration(value: timedelta | None) -> str:
    """``3 s``, ``4 min 5 s``, ``2 h 10 min``, ``3 d 4 h``; a dash for none."""
    if value is None:
        return "—"
    # Clamped at 0: a touch or assignment stamped a moment early by another host's clock is "0.0 s",
    # not "-0.3 s" (seconds alone was clamped, the text printed the raw value).
    exact = max(value.total_seconds(), 0.0)
    seconds = int(exact)
    if seconds < 60:
        return f"{exact:.1f} s" if seconds < 10 else f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


@register.filter
def percent(value: float | None) -> str:
    """``87.5 %``; a dash for none (nothing to judge)."""
    return "—" if value is None else f"{value:g} %"
