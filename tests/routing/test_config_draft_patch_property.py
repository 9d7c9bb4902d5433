"""A draft patch by natural key (``routing.drafts.services._patched``) finds each key's row from
an index built once per section (it scanned the whole section per key: a 20,000-row patch
outlasted a web worker). Property: it gives exactly what the scan gave, for any document
(duplicate keys, rows without a key, reps' keys in any case) and any patch (set, rename,
remove, add, keys not in the draft)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.drafts.services import _patched
from routing.rules_io import RulesFileErrors

KEYS = ["a", "A", "b", "c", "B"]


def _reference(entries: list[Any], rows: Mapping[str, Any], key_field: str, fold: Any) -> Any:
    """The scan the index replaced: each key's first row, looked up in the section as it is."""
    entries = list(entries)
    errors: list[str] = []

    def position(key: str) -> int:
        for i, entry in enumerate(entries):
            if isinstance(entry, Mapping) and fold(str(entry.get(key_field))) == fold(key):
                return i
        return -1

    for key, entry in rows.items():
        at = position(key)
        if entry is None:
            if at < 0:
                errors.append(key)
            else:
                del entries[at]
            continue
        row = {key_field: key, **entry}
        if at < 0:
            entries.append(row)
        else:
            entries[at] = row
    return errors or entries


rows_in_document = st.lists(
    st.one_of(
        st.builds(lambda k, v: {"name": k, "v": v}, st.sampled_from(KEYS), st.integers(0, 9)),
        st.builds(lambda k, v: {"email": k, "v": v}, st.sampled_from(KEYS), st.integers(0, 9)),
        st.just({"v": -1}),  # a row without its key
    ),
    max_size=12,
)
patch_entry = st.one_of(
    st.none(),
    st.builds(lambda v: {"v": v}, st.integers(10, 19)),
    st.builds(
        lambda k, v: {"name": k, "email": k, "v": v}, st.sampled_from(KEYS), st.integers(20, 29)
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    section=st.sampled_from(["teams", "reps"]),
    entries=rows_in_document,
    rows=st.dictionaries(st.sampled_from(KEYS), patch_entry, min_size=1, max_size=5),
)
def test_a_patch_sets_and_removes_the_rows_the_scan_did(
    section: str, entries: list[Any], rows: dict[str, Any]
) -> None:
    key_field = "email" if section == "reps" else "name"
    fold = str.lower if section == "reps" else str
    expected = _reference(entries, rows, key_field, fold)
    if isinstance(expected, list) and expected and isinstance(expected[0], str):
        with pytest.raises(RulesFileErrors) as refused:
            _patched({section: entries}, {section: rows})
        paths = sorted(error.path for error in refused.value.errors)
        assert paths == sorted(f"{section}.{key}" for key in expected)
        return
    assert _patched({section: entries}, {section: rows})[section] == expected
