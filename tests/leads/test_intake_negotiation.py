"""Intake answers JSON whatever the client's Accept header or ?format= ask for.

A marketing tool that sends ``Accept: text/html`` (or a URL with ``?format=xml``) must not have
its lead refused: DRF's content negotiation would answer 406 / 404 before the view runs.
"""

from __future__ import annotations

import json

import pytest

from leads.models import Lead
from tests.leads.conftest import auth

pytestmark = pytest.mark.django_db
URL = "/api/v1/intake/webform/"
BATCH_URL = "/api/v1/intake/webform/batch/"
LEAD = {"email": "ana@acme.com", "company": "Acme"}


def assert_json_202(response):
    assert response.status_code == 202, response.content
    assert response["Content-Type"].startswith("application/json")
    return response.json()


@pytest.mark.parametrize(
    "accept", ["text/html", "application/xml", "text/html,application/xhtml+xml;q=0.9"]
)
def test_any_accept_header_gets_the_lead_accepted_in_json(client, source, published, accept):
    response = client.post(
        URL, data=json.dumps(LEAD), content_type="application/json", HTTP_ACCEPT=accept, **auth()
    )
    body = assert_json_202(response)
    assert body["id"] == str(Lead.objects.get().id)


@pytest.mark.parametrize("fmt", ["xml", "html", "api", "json"])
def test_a_format_parameter_is_ignored(client, source, published, fmt):
    response = client.post(
        f"{URL}?format={fmt}", data=json.dumps(LEAD), content_type="application/json", **auth()
    )
    assert assert_json_202(response)["status"] == "received"
    assert Lead.objects.count() == 1


def test_errors_are_json_whatever_accept_says(client, source, published):
    response = client.post(URL, data="{}", content_type="application/json", HTTP_ACCEPT="text/html")
    assert response.status_code == 401
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["error"]["code"] == "unauthorized"


def test_batch_ignores_accept_and_format(client, source, published):
    response = client.post(
        f"{BATCH_URL}?format=xml",
        data=json.dumps([LEAD, {"email": "bo@beta.io"}]),
        content_type="application/json",
        HTTP_ACCEPT="application/xml",
        **auth(),
    )
    assert assert_json_202(response)["accepted"] == 2
