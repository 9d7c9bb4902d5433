"""Fixtures of the fault tests (the harness itself is tests/reliability/harness.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.reliability.harness import Stack


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """``stack(**env)``: a Stack whose every process is ended after the test, pass or fail."""
    made: list[Stack] = []

    def make(**extra: str) -> Stack:
        made.append(Stack(tmp_path, **extra))
        return made[-1]

    yield make
    for s in made:
        s.close()
