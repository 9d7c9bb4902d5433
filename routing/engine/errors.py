"""The engine's one error type: a rule (or ruleset) that cannot be compiled, with its path."""

from __future__ import annotations

from collections.abc import Sequence


class RuleError(Exception):
    """A rule that cannot be compiled; ``str()`` is ``path: message``."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(path, message)
        self.path = path
        self.message = message

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class RuleErrors(RuleError):
    """Every error found in one ruleset, so an import can report them all at once."""

    def __init__(self, errors: Sequence[RuleError]) -> None:
        if not errors:
            raise ValueError("RuleErrors needs at least one error")
        self.errors: tuple[RuleError, ...] = tuple(errors)
        first = self.errors[0]
        super().__init__(first.path, first.message)

    def __str__(self) -> str:
        return "\n".join(str(error) for error in self.errors)
