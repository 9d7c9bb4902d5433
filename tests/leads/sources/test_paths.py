"""leads.sources.paths: field paths in a source's field map (issue 16 §2)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leads.sources.paths import (
    Index,
    Key,
    PathError,
    Select,
    field_map_errors,
    is_path,
    parse_path,
    resolve,
)

PAYLOAD = {
    "payload": {"data": {"Email": "ana@acme.de", "Company Name": "Acme"}},
    "contacts": [{"email": "first@acme.de"}, {"email": "second@acme.de"}],
    "field_data": [
        {"name": "full_name", "values": ["Ana Lima"]},
        {"name": "email", "values": ["ana@acme.de"]},
    ],
    "answers": [{"field": {"ref": "work_email"}, "email": "ana@work.de"}],
    "rawRequest": json.dumps({"q3_email": "jot@acme.de", "q4_name": {"first": "Jo"}}),
    "a.b": {"c": 1},
}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("payload.data.Email", "ana@acme.de"),
        ("payload.data.email", "ana@acme.de"),  # case-insensitive after an exact miss
        ('payload.data["Company Name"]', "Acme"),
        ("contacts.0.email", "first@acme.de"),
        ("contacts[1].email", "second@acme.de"),
        ("contacts.-1.email", "second@acme.de"),
        ("field_data[name=email].values.0", "ana@acme.de"),
        ("field_data[name=FULL_NAME].values[0]", "Ana Lima"),
        ("field_data[name='email'].values", ["ana@acme.de"]),
        ("answers[field.ref=work_email].email", "ana@work.de"),
        ("rawRequest.q3_email", "jot@acme.de"),  # a JSON string decoded in place
        ("rawRequest.q4_name.first", "Jo"),
        ('["a.b"].c', 1),
    ],
)
def test_a_path_finds_its_value(path: str, value: object) -> None:
    assert resolve(PAYLOAD, path) == (True, value)


@pytest.mark.parametrize(
    "path",
    [
        "payload.data.Phone",
        "contacts.5.email",
        "field_data[name=phone].values.0",
        "payload.data.Email.more",
        "contacts.email",
        "answers[field.ref=other].email",
    ],
)
def test_a_path_the_payload_lacks_is_not_found_and_not_an_error(path: str) -> None:
    assert resolve(PAYLOAD, path) == (False, None)


def test_steps() -> None:
    assert parse_path("field_data[name=email].values.0") == (
        Key("field_data"),
        Select(("name",), "email"),
        Key("values"),
        Index(0),
    )


@pytest.mark.parametrize(
    ("path", "position"),
    [
        ("", 0),
        (".a", 0),
        ("a..b", 2),
        ("a.", 1),
        ("a[", 1),
        ("a[=x]", 2),
        ("a]b", 1),
        ('a["x', 2),
        ("a[0]b", 4),
    ],
)
def test_a_bad_path_says_where(path: str, position: int) -> None:
    with pytest.raises(PathError) as caught:
        parse_path(path)
    assert caught.value.position == position
    assert f"character {position + 1}" in str(caught.value)


def test_field_map_errors_name_the_bad_paths_only() -> None:
    errors = field_map_errors({"Org": "company", "a..b": "email", "payload.data.Email": "email"})
    assert list(errors) == ["a..b"]
    assert "empty step" in errors["a..b"]


def test_a_form_fields_php_style_name_is_a_path_that_finds_it_flat_or_nested() -> None:
    # Mailchimp, Jotform, Gravity Forms, WPForms post form fields named data[merges][EMAIL],
    # q3_name[first], input_1[]: a field map must be able to name them (and saving must not
    # refuse them), whether the form reader kept the name flat or a tool nested it.
    names = {"data[merges][EMAIL]": "email", "q3_name[first]": "first_name", "tags[]": "x"}
    assert field_map_errors(names) == {}
    flat = {"data[merges][EMAIL]": "a@acme.de", "tags[]": ["a", "b"]}
    assert resolve(flat, "data[merges][EMAIL]") == (True, "a@acme.de")
    assert resolve(flat, "tags[]") == (True, ["a", "b"])
    nested = {"data": {"merges": {"EMAIL": "b@acme.de"}}, "tags": ["c"]}
    assert resolve(nested, "data[merges][EMAIL]") == (True, "b@acme.de")
    assert resolve(nested, "tags[]") == (True, ["c"])
    assert parse_path("data[merges][EMAIL]") == parse_path("data.merges.EMAIL")


def test_a_top_level_key_with_a_dot_is_found_as_it_is() -> None:
    # Unbounce posts a form field literally named "data.json"; a key like "e.mail" is a key.
    assert resolve({"e.mail": "a@acme.de"}, "e.mail") == (True, "a@acme.de")
    assert resolve({"e": {"mail": "b@acme.de"}}, "e.mail") == (True, "b@acme.de")
    # ... and so is a dotted key on the way: Unbounce's data.json field holds the answers.
    unbounce = {"page_id": "p1", "data.json": '{"email": ["m@weser.de"], "a.b": {"c": 1}}'}
    assert resolve(unbounce, "data.json.email.0") == (True, "m@weser.de")
    assert resolve(unbounce, "data.json.a.b.c") == (True, 1)
    assert resolve(unbounce, "data.json.nope") == (False, None)
    # The whole path as a key wins; else a key alone before a dotted one.
    assert resolve({"data": {"json": 1}, "data.json": 2, "x": 0}, "data.json") == (True, 2)
    assert resolve({"data": {"json": 1}, "data.jsonx": 2}, "data.json") == (True, 1)


def test_plain_keys_are_not_paths() -> None:
    assert not is_path("Email Address")
    assert is_path("payload.data.Email")
    assert is_path("answers[0]")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=30,
)


@given(record=_json, path=st.text(max_size=40))
def test_resolve_never_raises(record: object, path: str) -> None:
    found, value = resolve(record, path)
    assert found or value is None
