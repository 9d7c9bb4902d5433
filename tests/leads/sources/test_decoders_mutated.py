"""Property: no decoder raises on its own vendor's payloads with any part replaced by arbitrary
JSON (a missing answer, a list where an object was, a number for a string...). Arbitrary JSON
objects alone rarely reach a decoder's own keys (``form_response``, ``field_data``); a vendor's
documented body with one node changed does."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leads.normalize import normalize
from leads.sources import FLAG_DECODER_FAILED, flatten, kind_get
from tests.leads.sources.kindtest import SOURCES_DIR

FIXTURES = sorted(
    (path.parents[1].name, path)
    for path in SOURCES_DIR.glob("*/fixtures/*.json")
    if isinstance(json.loads(path.read_text(encoding="utf-8")), dict)
)

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.just("")
    | st.just("{not json"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*prefix, index))
    return found


def _replaced(record: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(record)
    node = out
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return out


@pytest.mark.parametrize(("kind", "path"), FIXTURES, ids=[f"{k}/{p.name}" for k, p in FIXTURES])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_decoder_raises_on_its_fixture_with_a_part_replaced(
    kind: str, path: Path, data: st.DataObject
) -> None:
    record = json.loads(path.read_text(encoding="utf-8"))
    where = data.draw(st.sampled_from(_paths(record)[1:] or [()]), label="path")
    value = data.draw(_json, label="value")
    mutated = _replaced(record, where, value)
    if not isinstance(mutated, dict):
        return
    source_kind = kind_get(kind)
    options: dict[str, Any] = {"page_access_token": "EAAG-x"} if kind == "meta_lead_ads" else {}
    flat = source_kind.decode(mutated, options)  # the decoder itself, not flatten's fallback
    assert isinstance(flat, dict)
    flattened = flatten(mutated, kind=kind, options=options)
    assert FLAG_DECODER_FAILED not in flattened.flags, flattened.decoder_error
    normalize(flattened.record)
    if source_kind.split is not None:
        assert isinstance(source_kind.split(mutated, options), list)
    if source_kind.awaits_fetch is not None:
        source_kind.awaits_fetch(mutated, options)
