"""The page access token is a secret kind option: never shown again (admin, try-it page), kept
when the form is saved with its mask, never exported, audited redacted."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from audit.models import Event, EventType
from leads.models import Source
from leads.sources import SECRET_KEPT
from routing.rules_io import _public_options
from tests.leads.factories import SourceFactory

pytestmark = pytest.mark.django_db

TOKEN = "EAAG-secret-page-token-1234567890"


def _form(source: Source, kind_options: str) -> dict[str, str]:
    return {
        "slug": source.slug,
        "name": source.name,
        "active": "on",
        "kind": source.kind,
        "kind_options": kind_options,
        "auth_mode": source.auth_mode,
        "field_map": "{}",
        "rate_limit_per_minute": "60",
    }


def test_the_token_is_never_shown_and_survives_a_save(admin_client: Client) -> None:
    source = SourceFactory(
        slug="meta",
        kind="meta_lead_ads",
        kind_options={
            "verify_token": "vt-1",
            "page_access_token": TOKEN,
            "graph_api_version": "v21.0",
        },
    )
    url = reverse("admin:leads_source_change", args=[source.pk])
    page = admin_client.get(url).content.decode()
    assert TOKEN not in page
    assert "vt-1" not in page
    assert SECRET_KEPT in page
    assert TOKEN not in admin_client.get(url + "try/").content.decode()
    # Saved with the masks as shown: the secrets are kept, the other option is changed.
    shown = {
        "verify_token": SECRET_KEPT,
        "page_access_token": SECRET_KEPT,
        "graph_api_version": "v22.0",
    }
    response = admin_client.post(url, _form(source, json.dumps(shown)))
    assert response.status_code == 302, response.content[:2000]
    source.refresh_from_db()
    assert source.kind_options == {
        "verify_token": "vt-1",
        "page_access_token": TOKEN,
        "graph_api_version": "v22.0",
    }
    # A new token typed in replaces it; the audit names the change, never the value.
    new = {**shown, "page_access_token": "EAAG-new-token-0987654321"}
    assert admin_client.post(url, _form(source, json.dumps(new))).status_code == 302
    source.refresh_from_db()
    assert source.kind_options["page_access_token"] == "EAAG-new-token-0987654321"
    audit = json.dumps(list(Event.objects.filter(type=EventType.CONFIG_CHANGED).values("data")))
    assert TOKEN not in audit
    assert "EAAG-new-token" not in audit
    assert "page_access_token" not in _public_options(source)


def test_the_admin_filters_failed_fetches_and_retries_them(admin_client: Client) -> None:
    from leads.models import FetchStatus, Lead, LeadStatus
    from tests.leads.factories import LeadFactory

    source = SourceFactory(slug="meta", kind="meta_lead_ads")
    record = {
        "object": "page",
        "entry": [
            {
                "id": "1",
                "changes": [{"field": "leadgen", "value": {"leadgen_id": "123", "page_id": "1"}}],
            }
        ],
    }
    lead = LeadFactory(
        source=source,
        raw_payload=record,
        status=LeadStatus.FAILED,
        fetch_status=FetchStatus.FAILED,
        last_error="Meta Lead Ads: Meta says lead 123 does not exist",
    )
    url = reverse("admin:leads_lead_changelist")
    listed = admin_client.get(url, {"fetch_status__exact": "failed"}).content.decode()
    assert "does not exist" in listed
    response = admin_client.post(
        url, {"action": "fetch_again", "_selected_action": [str(lead.pk)]}, follow=True
    )
    assert "1 lead(s) sent to be fetched from Meta again" in response.content.decode()
    lead.refresh_from_db()
    assert (lead.status, lead.fetch_status) == (LeadStatus.PROCESSING, FetchStatus.PENDING)
    assert Lead.objects.filter(fetch_status=FetchStatus.PENDING).count() == 1
