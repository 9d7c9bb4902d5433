"""The try-it page and Meta's leadgen notification (issue 16 §1, §3): what the kickoff does with
it is what the page says — accepted and fetched from the Graph API when the source has a page
access token (one lead per leadgen_id), refused saying what to set when it has none."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from leads.models import Lead, RefusedPayload, Source
from leads.tryit import FORMAT_JSON, source_try
from tests.leads.conftest import auth
from tests.leads.factories import SourceFactory
from tests.leads.meta_fetch.conftest import notification

pytestmark = pytest.mark.django_db

TOKEN = "EAAG-page-token-" + "s" * 40


def _try(source: Source, payload: Any, **changes: Any) -> Any:
    args: dict[str, Any] = {
        "source": source,
        "text": json.dumps(payload),
        "fmt": FORMAT_JSON,
        "kind": source.kind,
        "kind_options": source.kind_options,
        "field_map": source.field_map,
    }
    return source_try(**{**args, **changes})


def _meta(**options: str) -> Source:
    return SourceFactory(
        slug="meta", kind="meta_lead_ads", kind_options={"verify_token": "v", **options}
    )


def test_with_a_page_token_a_notification_is_accepted_to_be_fetched() -> None:
    result = _try(_meta(page_access_token=TOKEN), notification("1300000000000042"))
    assert result.accepted
    assert result.fetched_later == 1
    assert "Accepted" in result.verdict
    assert "Graph API" in result.verdict
    assert "not_a_lead" not in result.verdict
    assert result.fields["external_id"] == "1300000000000042"
    assert TOKEN not in result.verdict


def test_a_batched_notification_is_one_lead_per_leadgen_id() -> None:
    result = _try(_meta(page_access_token=TOKEN), notification("111", "222", "333"))
    assert result.accepted
    assert result.fetched_later == 3
    assert "3 leads" in result.verdict


def test_without_a_page_token_it_says_what_to_set() -> None:
    result = _try(_meta(), notification("1300000000000042"))
    assert not result.accepted
    assert result.fetched_later == 0
    assert "not_a_lead" in result.verdict
    assert "page_access_token" in result.verdict


def test_a_token_typed_into_the_page_is_tried_without_saving() -> None:
    source = _meta()
    options = {"verify_token": "v", "page_access_token": TOKEN}
    result = _try(source, notification("1300000000000042"), kind_options=options)
    assert result.accepted
    assert result.changed == ("kind options",)
    source.refresh_from_db()
    assert "page_access_token" not in source.kind_options


def test_a_notification_without_a_usable_leadgen_id_is_refused_with_the_reason() -> None:
    body = notification("111")
    body["entry"][0]["changes"][0]["value"]["leadgen_id"] = "not-an-id"
    result = _try(_meta(page_access_token=TOKEN), body)
    assert not result.accepted
    assert "leadgen_id" in result.verdict


@pytest.mark.parametrize("token", [TOKEN, ""])
def test_the_page_says_what_the_kickoff_does(client: Client, admin_client: Client, token: str):
    """The same notification through the page and through the intake: the same answer."""
    source = _meta(**({"page_access_token": token} if token else {}))
    body = notification("1300000000000077")
    page = admin_client.post(
        reverse("admin:leads_source_try", args=[source.pk]),
        {
            "payload": json.dumps(body),
            "fmt": FORMAT_JSON,
            "kind": source.kind,
            # The page shows a secret option masked; posted back masked, the saved one is used.
            "kind_options": admin_client.get(reverse("admin:leads_source_try", args=[source.pk]))
            .context["form"]
            .initial["kind_options"],
            "field_map": "{}",
            "_try": "Try it",
        },
    )
    assert page.status_code == 200
    result = page.context["result"]
    html = page.content.decode()
    assert TOKEN not in html
    intake = client.post(
        "/api/v1/intake/meta/", json.dumps(body), content_type="application/json", **auth("meta")
    )
    if token:
        assert result.accepted
        assert "fetched from the Graph API" in html
        assert intake.status_code == 202, intake.content
        assert Lead.objects.filter(source=source).count() == 1
    else:
        assert not result.accepted
        assert "page_access_token" in html
        assert intake.status_code == 422
        assert RefusedPayload.objects.filter(source=source).count() == 1
