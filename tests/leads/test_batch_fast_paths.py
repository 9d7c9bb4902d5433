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


# Text that reaches the slow paths: controls, whitespace, NUL, a lone surrogate, the BOM.
ODD_TEXT = st.text(
    alphabet=st.sampled_from(["a", "Z", "7", "²", " ", "\t", "\x00", "\x85", "\ufeff", "\ud800"])
    | st.characters(),
    max_size=6,
)
PLAIN = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**25), max_value=10**25)
    | st.floats(allow_nan=True, allow_infinity=True)
    | ODD_TEXT
)
RECORDS = st.recursive(
    PLAIN,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ODD_TEXT, inner, max_size=4),
    max_leaves=10,
)
SMALL_LIMITS = st.builds(
    Limits,
    max_depth=st.integers(0, 3),
    max_keys=st.integers(0, 4),
    max_string=st.integers(0, 5),
    max_key=st.integers(0, 5),
)


@settings(max_examples=600, deadline=None)
@given(RECORDS, SMALL_LIMITS, st.integers(0, 2))
def test_the_flat_check_refuses_and_accepts_as_the_walk(
    value: Any, limits: Limits, depth: int
) -> None:
    from leads.parsing import _check_walk, check_value

    assert _outcome(lambda: check_value(value, limits, "record", depth)) == _outcome(
        lambda: _check_walk(value, limits, "record", depth)
    )


@settings(max_examples=600, deadline=None)
@given(PLAIN | st.lists(PLAIN, max_size=3) | st.dictionaries(ODD_TEXT, PLAIN, max_size=2))
def test_blank_fast_path_is_normalize_text(value: Any) -> None:
    from leads.normalize import _is_blank, normalize_text

    assert _is_blank(value) == (normalize_text(value) is None)


FIELD_MAPS = st.dictionaries(
    st.sampled_from(["Company", "E-mail", "Org", "name", "Vorname", "x.y", "email"]),
    st.sampled_from(["company", "email", "first_name", "full_name", "custom", "Firma", ""]),
    max_size=4,
)
FLAT = st.dictionaries(
    st.sampled_from(["Company", "E-mail", "Org", "name", "email", "Email Address", "phone", "k"]),
    PLAIN,
    max_size=6,
)


@settings(max_examples=400, deadline=None)
@given(FLAT, FIELD_MAPS, FIELD_MAPS)
def test_a_compiled_field_map_maps_as_a_fresh_one(record: Any, field_map: Any, edit: Any) -> None:
    from leads.normalize import map_fields

    # The same map object, compiled once, used again, then edited in place: each call maps
    # as a copy of the map would (a new object, never seen before).
    assert map_fields(record, field_map) == map_fields(record, dict(field_map))
    assert map_fields(record, field_map) == map_fields(record, dict(field_map))
    field_map.update(edit)
    assert map_fields(record, field_map) == map_fields(record, dict(field_map))


@settings(max_examples=400, deadline=None)
@given(RECORDS, st.sampled_from(["generic", "hubspot", "typeform", "meta_lead_ads", "zoom"]))
def test_flatten_says_lead_only_of_a_lead(record: Any, kind: str) -> None:
    from leads.normalize import is_a_lead, map_fields
    from leads.sources import flatten

    flat = flatten(record, kind=kind, field_map={"Org": "company"})
    if flat.lead is not None:
        assert flat.lead is True
        assert flat.canonical == map_fields(flat.record, {"Org": "company"})[0]
        assert is_a_lead(flat.canonical)
