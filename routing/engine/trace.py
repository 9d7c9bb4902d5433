"""The decision trace, built on first read: one entry per rule considered, in priority order.

``decide`` records words only for the rules whose condition matched (what their action did);
the words for every rule that did not match are recomputed from the lead's facts when someone
reads the trace. Matching is pure, so the result is the same as building it eagerly, but a
decision among thousands of rules stays cheap.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload

from routing.engine.operators import Facts
from routing.engine.ruleset import CompiledRule
from routing.engine.types import TraceEntry


class Trace(Sequence[TraceEntry]):
    """The rules considered for one decision, materialised lazily and then kept."""

    __slots__ = ("_count", "_decided", "_entries", "_facts", "_notes", "_rules")

    def __init__(
        self,
        rules: Sequence[CompiledRule],
        count: int,
        facts: Facts,
        notes: Mapping[int, str],
        decided: int | None,
    ) -> None:
        self._rules = rules
        self._count = count
        self._facts = facts
        self._notes = notes
        self._decided = decided
        self._entries: tuple[TraceEntry, ...] | None = None

    def _materialise(self) -> tuple[TraceEntry, ...]:
        entries = self._entries
        if entries is None:
            built: list[TraceEntry] = []
            for position in range(self._count):
                rule = self._rules[position]
                note = self._notes.get(position)
                if note is not None:
                    built.append(
                        TraceEntry(
                            rule.id,
                            rule.name,
                            rule.priority,
                            True,
                            note,
                            position == self._decided,
                        )
                    )
                else:
                    why = rule.condition.explain(self._facts) or "did not match"
                    built.append(TraceEntry(rule.id, rule.name, rule.priority, False, why))
            entries = self._entries = tuple(built)
        return entries

    def matched(self) -> tuple[TraceEntry, ...]:
        """Only the entries of rules that matched, without building words for the others.

        The others' words depend on nothing but the lead's facts and the ruleset version, so a
        caller may store just these and rebuild the full trace later.
        """
        if self._entries is not None:
            return tuple(entry for entry in self._entries if entry.matched)
        return tuple(
            TraceEntry(rule.id, rule.name, rule.priority, True, note, position == self._decided)
            for position, note in sorted(self._notes.items())
            for rule in (self._rules[position],)
        )

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> TraceEntry: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[TraceEntry]: ...

    def __getitem__(self, index: int | slice) -> TraceEntry | Sequence[TraceEntry]:
        return self._materialise()[index]

    def __iter__(self) -> Iterator[TraceEntry]:
        return iter(self._materialise())

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, Trace | tuple | list):
            return self._materialise() == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal by content, like a list

    def __repr__(self) -> str:
        return f"Trace({list(self._materialise())!r})"
