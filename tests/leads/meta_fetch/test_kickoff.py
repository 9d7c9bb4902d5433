"""The kickoff and Meta's leadgen notification: accepted as leads waiting for their fetch when
the source has a page token (one per leadgen_id, a repeat is one lead), refused into the inbox
with a reason that says what to set when it has none; Meta is never called in the request."""

from __future__ import annotations

import json

import pytest

from leads.inbox import refused_reaccept
from leads.models import FetchStatus, Lead, RefusedPayload
from tests.leads.conftest import auth
from tests.leads.factories import SourceFactory
from tests.leads.meta_fetch.conftest import notification

pytestmark = pytest.mark.django_db

URL = "/api/v1/intake/meta/"


def _post(client, body):
    return client.post(URL, json.dumps(body), content_type="application/json", **auth("meta"))


def test_with_a_page_token_a_notification_is_accepted_and_meta_not_called(
    client, published, meta_source, meta_graph
):
    response = _post(client, notification("1300000000000042"))
    assert response.status_code == 202, response.content
    lead = Lead.objects.get(source=meta_source)
    assert str(lead.id) == response.json()["id"]
    assert lead.idempotency_key == "1300000000000042"
    assert lead.fetch_status == FetchStatus.NONE  # the worker parks it for the fetch
    assert meta_graph.requests == []
    assert not RefusedPayload.objects.exists()


def test_a_batched_notification_is_one_lead_per_leadgen_id_and_a_repeat_dedups(
    client, published, meta_source
):
    first = _post(client, notification("111", "222", "333"))
    assert first.status_code == 202, first.content
    assert sorted(Lead.objects.values_list("idempotency_key", flat=True)) == ["111", "222", "333"]
    again = _post(client, notification("222"))
    assert again.status_code == 202
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == str(Lead.objects.get(idempotency_key="222").id)
    assert Lead.objects.count() == 3
    # Meta retrying the whole POST changes nothing either.
    assert _post(client, notification("111", "222", "333")).status_code == 202
    assert Lead.objects.count() == 3


def test_without_a_page_token_it_is_refused_into_the_inbox_saying_what_to_set(client, published):
    source = SourceFactory(slug="meta", kind="meta_lead_ads", kind_options={"verify_token": "v"})
    response = _post(client, notification("111", "222"))
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "not_a_lead"
    assert "page_access_token" in response.json()["error"]["message"]
    refused = RefusedPayload.objects.get(source=source)
    assert refused.reason == "not_a_lead"
    assert "page_access_token" in refused.message
    assert not Lead.objects.exists()
    # The token set, the one refused body is re-accepted as its two leads, once.
    source.kind_options = {"verify_token": "v", "page_access_token": "EAAG-new"}
    source.save()
    done = refused_reaccept(refused_id=refused.pk, actor="user:revops")
    assert len(done.lead_ids) == 2, done
    assert refused_reaccept(refused_id=refused.pk, actor="user:revops").already
    assert sorted(Lead.objects.values_list("idempotency_key", flat=True)) == ["111", "222"]
    refused.refresh_from_db()
    assert "EAAG-new" not in refused.message
    assert "EAAG-new" not in json.dumps(refused.headers)


def test_a_notification_without_a_usable_leadgen_id_is_refused(client, published, meta_source):
    body = notification("111")
    body["entry"][0]["changes"][0]["value"]["leadgen_id"] = "not-an-id"
    response = _post(client, body)
    assert response.status_code == 422
    assert "leadgen_id" in response.json()["error"]["message"]
