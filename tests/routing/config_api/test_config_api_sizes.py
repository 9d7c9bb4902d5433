"""The configuration API carries a big configuration (issue 19: "Big CSV imports land in a
draft", a 20,000-row territories CSV; docs/revops.md's CI recipe PUTs the whole file). Its bodies
have their own limits (CONFIG_API_MAX_BODY_BYTES, CONFIG_API_MAX_STRING_CHARS,
CONFIG_API_MAX_ITEMS), not the intake's 64 KiB strings and 1,000 items; past them the answer is
a JSON 413/400 naming the limit, and nothing is written."""

from __future__ import annotations

import json
from typing import Any

import pytest

from routing.drafts.models import ConfigDraft
from tests.routing.config_api.test_config_jobs import (  # noqa: F401 (the fixture)
    BASE,
    _call,
    _draft,
    _token,
    published,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("published")]

ROWS = 20_000
HEADER = "territory,country,region,postal_prefix,team,rep\n"


@pytest.fixture
def ci() -> str:
    return _token("read,draft,publish", "ci")


def _csv(rows: int) -> str:
    return HEADER + "".join(f"Territory {i:05d},DE,,{i:05d},EMEA SDR,\n" for i in range(rows))


def _territories(count: int) -> list[dict[str, Any]]:
    return [
        {
            "name": f"T{i:05d}",
            "countries": ["DE"],
            "regions": [],
            "postal_prefixes": [f"{i:05d}"],
            "team": "EMEA SDR",
        }
        for i in range(count)
    ]


def test_a_20000_row_territory_csv_lands_in_a_draft_as_a_json_string(client, ci):
    draft_id = _draft(client, ci)
    body = {"table": "territories", "csv": _csv(ROWS)}
    response = _call(client, "post", f"{BASE}drafts/{draft_id}/tables/", ci, body)
    assert response.status_code == 200, response.content[:300]
    assert response.json()["rows"] == ROWS
    assert len(ConfigDraft.objects.get(pk=draft_id).document["territories"]) >= ROWS


def test_a_20000_row_territory_csv_lands_in_a_draft_as_a_text_csv_body(client, ci):
    draft_id = _draft(client, ci)
    response = client.post(
        f"{BASE}drafts/{draft_id}/tables/?table=territories",
        _csv(ROWS).encode(),
        content_type="text/csv",
        HTTP_AUTHORIZATION=f"Bearer {ci}",
    )
    assert response.status_code == 200, response.content[:300]
    assert response.json()["rows"] == ROWS


def test_a_text_csv_body_needs_its_table_and_refuses_unknown_query_parameters(client, ci):
    draft_id = _draft(client, ci)
    url = f"{BASE}drafts/{draft_id}/tables/"
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ci}", "content_type": "text/csv"}
    before = ConfigDraft.objects.get(pk=draft_id).document
    missing = client.post(url, _csv(3).encode(), **auth)
    assert missing.status_code == 400
    assert "table" in missing.json()["error"]["fields"]
    unknown = client.post(f"{url}?table=territories&tabel=x", _csv(3).encode(), **auth)
    assert unknown.status_code == 400
    assert "tabel" in unknown.json()["error"]["fields"]
    not_utf8 = client.post(f"{url}?table=territories", b"territory\n\xff\xfe\n", **auth)
    assert not_utf8.status_code == 400
    assert not_utf8.json()["error"]["code"] == "invalid_body"
    assert ConfigDraft.objects.get(pk=draft_id).document == before


def test_a_draft_with_20000_territories_can_be_put_back_as_read(client, ci):
    draft_id = _draft(client, ci)
    document = dict(ConfigDraft.objects.get(pk=draft_id).document)
    document["territories"] = _territories(ROWS)
    put = _call(client, "put", f"{BASE}drafts/{draft_id}/", ci, document)
    assert put.status_code == 200, put.content[:300]
    read = _call(client, "get", f"{BASE}drafts/{draft_id}/", ci).json()["document"]
    assert len(read["territories"]) == ROWS
    again = _call(client, "put", f"{BASE}drafts/{draft_id}/", ci, read)
    assert again.status_code == 200, again.content[:300]


def test_a_body_over_the_byte_limit_is_a_json_413_naming_it(client, ci, settings):
    draft_id = _draft(client, ci)
    before = ConfigDraft.objects.get(pk=draft_id).document
    settings.CONFIG_API_MAX_BODY_BYTES = 10_000
    body = {"table": "territories", "csv": _csv(400)}
    response = _call(client, "post", f"{BASE}drafts/{draft_id}/tables/", ci, body)
    assert response.status_code == 413, response.content[:300]
    error = response.json()["error"]
    assert error["code"] == "body_too_large"
    assert "CONFIG_API_MAX_BODY_BYTES" in error["message"]
    assert ConfigDraft.objects.get(pk=draft_id).document == before


def test_a_body_over_the_item_or_string_limit_is_a_json_400_naming_it(client, ci, settings):
    draft_id = _draft(client, ci)
    document = dict(ConfigDraft.objects.get(pk=draft_id).document)
    settings.CONFIG_API_MAX_ITEMS = 50
    document["territories"] = _territories(51)
    items = _call(client, "put", f"{BASE}drafts/{draft_id}/", ci, document)
    assert items.status_code == 400, items.content[:300]
    assert items.json()["error"]["code"] == "invalid_body"
    assert "more than 50 items" in items.json()["error"]["message"]
    settings.CONFIG_API_MAX_STRING_CHARS = 100
    body = {"table": "territories", "csv": _csv(5)}
    text = _call(client, "post", f"{BASE}drafts/{draft_id}/tables/", ci, body)
    assert text.status_code == 400, text.content[:300]
    assert "longer than 100 characters" in text.json()["error"]["message"]


def test_nesting_stays_bounded_by_the_intakes_depth(client, ci):
    draft_id = _draft(client, ci)
    deep: Any = "x"
    for _ in range(40):
        deep = [deep]
    response = client.put(
        f"{BASE}drafts/{draft_id}/",
        json.dumps({"territories": deep}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {ci}",
    )
    assert response.status_code == 400
    assert "nested deeper than 32 levels" in response.json()["error"]["message"]


def test_a_json_body_that_is_a_string_is_not_taken_for_a_csv_file(client, ci):
    draft_id = _draft(client, ci)
    response = client.post(
        f"{BASE}drafts/{draft_id}/tables/?table=territories",
        json.dumps(_csv(3)),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {ci}",
    )
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "The body must be a JSON object."
