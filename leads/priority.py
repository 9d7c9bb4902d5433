"""A lead's priority and tags as stored: their limits, and which priorities go first.

Tag rules name priorities and tags freely ("hot", "enterprise"); what is stored on the lead and
its assignment is bounded here. Plain Python, no Django, so that anything may import it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

__all__ = [
    "MAX_TAGS",
    "PRIORITY_MAX_LENGTH",
    "TAG_MAX_LENGTH",
    "priority_clean",
    "priority_is_high",
    "tags_clean",
]

PRIORITY_MAX_LENGTH = 50
TAG_MAX_LENGTH = 100
MAX_TAGS = 50


def priority_clean(priority: str | None) -> str:
    """The priority as stored: stripped and cut to its column; "" for none."""
    return (priority or "").strip()[:PRIORITY_MAX_LENGTH].rstrip()


def tags_clean(tags: Iterable[str]) -> list[str]:
    """The tags as stored: stripped, cut to the column, no empties, no repeats, in order."""
    kept: list[str] = []
    for tag in tags:
        if not isinstance(tag, str):
            continue
        value = tag.strip()[:TAG_MAX_LENGTH].rstrip()
        if value and value not in kept:
            kept.append(value)
        if len(kept) >= MAX_TAGS:
            break
    return kept


def priority_is_high(priority: str | None, high: Collection[str]) -> bool:
    """Whether a lead of this priority is taken first (``HIGH_PRIORITIES``, any case)."""
    value = priority_clean(priority).casefold()
    return bool(value) and value in {name.strip().casefold() for name in high}
