"""leads.sources.flatten: kind, paths and the look below the top level (issue 16 §2, §4, §5)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from leads.normalize import FLAG_STRUCTURED_VALUE, is_a_lead, map_fields, normalize
from leads.sources import (
    FLAG_DECODER_FAILED,
    FLAG_FOUND_BELOW,
    flatten,
    kind_get,
    kinds,
)


def lead(record: dict, field_map: dict | None = None, kind: str = "generic"):
    flat = flatten(record, kind=kind, field_map=field_map)
    return flat, normalize(flat.record, field_map)


def test_hubspot_like_values_one_level_down_are_found() -> None:
    flat, result = lead(
        {
            "vid": 51,
            "properties": {
                "email": {"value": "ana@acme.de", "versions": []},
                "firstname": {"value": "Ana"},
                "company": {"value": "Acme GmbH"},
            },
        }
    )
    assert result.fields == {
        "email": "ana@acme.de",
        "email_domain": "acme.de",
        "first_name": "Ana",
        "company": "Acme GmbH",
        "domain": "acme.de",
    }
    assert FLAG_FOUND_BELOW in flat.flags
    assert result.custom["vid"] == 51  # unknown fields kept
    assert "properties" in result.custom


def test_name_value_arrays_and_json_strings_are_read() -> None:
    _, result = lead(
        {
            "form": {"name": "Demo request", "email": "forms@vendor.example"},  # not the lead
            "submission": json.dumps(
                {"fields": [{"name": "Work Email", "value": "li@acme.de"}, {"name": "Phone"}]}
            ),
        }
    )
    assert result.fields["email"] == "li@acme.de"


def test_the_shallowest_value_wins_and_other_parties_are_skipped() -> None:
    _, result = lead(
        {
            "owner": {"email": "rep@us.example"},
            "data": {"email": "lead@acme.de", "deeper": {"email": "other@acme.de"}},
        }
    )
    assert result.fields["email"] == "lead@acme.de"


def test_a_nested_name_counts_only_beside_an_email_or_phone() -> None:
    _, alone = lead({"company": "Acme", "meta": {"name": "Webhook test"}})
    assert "first_name" not in alone.fields
    _, beside = lead({"data": {"name": "Ana Lima", "email": "ana@acme.de"}})
    assert (beside.fields["first_name"], beside.fields["last_name"]) == ("Ana", "Lima")


def test_a_top_level_lead_is_not_looked_into() -> None:
    flat, _ = lead({"email": "top@acme.de", "extra": {"email": "nested@acme.de"}})
    assert flat.record == {"email": "top@acme.de", "extra": {"email": "nested@acme.de"}}
    assert flat.flags == ()


def test_a_field_map_path_wins_over_what_is_found() -> None:
    field_map = {"payload.data.Work": "email"}
    flat, result = lead(
        {"payload": {"data": {"Email": "home@gmail.com", "Work": "ana@acme.de"}}}, field_map
    )
    assert result.fields["email"] == "ana@acme.de"
    assert flat.record["payload.data.Work"] == "ana@acme.de"


def test_a_json_object_never_becomes_a_text_field() -> None:
    # The junk lead of issue 16: an object as the company, a sentence as the name.
    record = {"company": {"id": 7, "portal": 1}, "name": "webhook for Web Form Fill-out\n"}
    flat = flatten(record)
    canonical, _ = map_fields(flat.record)
    assert not is_a_lead(canonical)
    result = normalize({"email": "a@acme.de", "company": {"id": 7}})
    assert "company" not in result.fields
    assert result.custom["company"] == {"id": 7}
    assert FLAG_STRUCTURED_VALUE in result.flags


def test_a_sentence_is_no_name_for_the_kickoff() -> None:
    assert not is_a_lead({"company": "Acme", "first_name": "Please call me back about our prices"})
    assert not is_a_lead({"company": "Acme", "last_name": "Weber\nGeschäftsführer"})
    assert is_a_lead({"company": "Acme", "first_name": "Ana"})
    assert is_a_lead({"company": "Acme", "first_name": "María de los Ángeles García López"})
    # A full name is checked before it is split (review finding: only its first word was).
    canonical, custom = map_fields({"company": "Acme", "name": "webhook for Web Form Fill-out\n"})
    assert not is_a_lead(canonical)
    assert custom == {"name": "webhook for Web Form Fill-out\n"}


def test_the_look_below_skips_keys_about_other_parties() -> None:
    for key in ("contact_owner", "assigned_user", "notification_recipient", "reply_to", "host"):
        flat = flatten({"company": "Acme", key: {"email": "rep@ourcompany.example"}})
        assert "email" not in flat.record, key


def test_a_failing_decoder_falls_back_to_the_generic_reading() -> None:
    from leads.sources import base

    broken = base.SourceKind(
        name="broken",
        label="Broken",
        docs="",
        decode=lambda r, o: 1 / 0,  # type: ignore[misc]
    )
    kinds()["broken"] = broken
    try:
        flat = flatten({"email": "a@acme.de"}, kind="broken")
    finally:
        del kinds()["broken"]
    assert flat.record == {"email": "a@acme.de"}
    assert FLAG_DECODER_FAILED in flat.flags
    assert "ZeroDivisionError" in flat.decoder_error


def test_an_unknown_kind_reads_generically() -> None:
    assert kind_get("no-such-kind").name == "generic"
    assert kind_get(None).name == "generic"


def test_every_registered_kind_has_a_label_and_docs() -> None:
    for name, kind in kinds().items():
        assert kind.name == name
        assert kind.label
        assert kind.docs


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=40,
)


@given(record=st.dictionaries(st.text(max_size=10), _json, max_size=8))
def test_no_decoder_raises_on_any_json_object(record: dict) -> None:
    # Each kind's decode itself (flatten would hide a raise behind its generic fallback).
    for name, kind in kinds().items():
        flat = kind.decode(record, {})
        assert isinstance(flat, dict), name
        flattened = flatten(record, kind=name)
        assert FLAG_DECODER_FAILED not in flattened.flags, (name, flattened.decoder_error)
        normalize(flattened.record)
