"""Batch intake's fast paths (issue 18) give what the general paths give, for any input."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from leads.parsing import IntakeError, Limits, parse_json

# JSON values with keys drawn from a small alphabet, so that objects often repeat a key.
KEYS = st.text(alphabet="abAB é", max_size=3)
SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(st.tuples(KEYS, inner), max_size=5).map(lambda pairs: ("obj", pairs))
    ),
    max_leaves=12,
)


def _text(value: Any) -> str:
    """JSON text of a value whose objects are lists of (key, value) pairs, repeats kept."""
    if isinstance(value, tuple) and value[:1] == ("obj",):
        return "{" + ",".join(f"{json.dumps(k)}:{_text(v)}" for k, v in value[1]) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    return json.dumps(value)


def _reject_duplicates_by_the_loop(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The hook as it was written before (one key at a time), the oracle."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise IntakeError(400, "invalid_body", f"Duplicate key {key[:100]!r} in a JSON object.")
        obj[key] = value
    return obj


def _outcome(fn: Any) -> Any:
    try:
        return ("value", fn())
    except IntakeError as error:
        return ("error", error.status, error.code, error.message)


@settings(max_examples=400, deadline=None)
@given(VALUES)
def test_strict_json_refuses_and_accepts_as_the_key_by_key_hook(value: Any) -> None:
    text = _text(value)

    def by_the_loop() -> Any:
        return json.loads(text, object_pairs_hook=_reject_duplicates_by_the_loop)

    assert _outcome(lambda: parse_json(text.encode(), Limits(), check=False)) == _outcome(
        by_the_loop
    )
