"""The single-lead intake's POST is answered without DRF's dispatch (issue 18): no Request
wrapper, negotiation or Response rendering, for the answers DRF gave (JSON bytes as its
renderer writes them, the same headers); every other method still goes through DRF."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from leads.api import _json_response
from tests.leads.conftest import auth

pytestmark = pytest.mark.django_db
URL = "/api/v1/intake/webform/"


@pytest.mark.parametrize(
    "data",
    [
        {"id": "5b0f", "status": "received", "url": "/api/v1/leads/5b0f/"},
        {"error": {"code": "not_a_lead", "message": 'Ana\u2028Lo \u2029 \u00e9 \U0001f600 "q"'}},
        {"error": {"code": "x", "message": "</script>", "fields": {"a.b": ["1", "\\"]}}},
    ],
)
def test_the_json_is_byte_for_byte_what_drfs_renderer_writes(data: dict[str, Any]) -> None:
    response = _json_response(data, status=400)
    assert response.content == JSONRenderer().render(data)
    assert response["Content-Type"] == "application/json"


def test_a_post_does_not_go_through_drfs_dispatch(client, source, published, monkeypatch):  # type: ignore[no-untyped-def]
    calls: list[str] = []
    original = APIView.initial

    def counting(self: APIView, request: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(request.method)
        original(self, request, *args, **kwargs)

    monkeypatch.setattr(APIView, "initial", counting)
    accepted = client.post(
        URL, data=json.dumps({"email": "a@b.co"}), content_type="application/json", **auth()
    )
    refused = client.post(URL, data="{", content_type="application/json", **auth())
    unauthorised = client.post(URL, data="{}", content_type="application/json")
    assert (accepted.status_code, refused.status_code, unauthorised.status_code) == (202, 400, 401)
    for response in (accepted, refused, unauthorised):
        # As DRF's dispatch answered: its allowed methods on every answer, JSON.
        assert response["Allow"] == "GET, POST, HEAD, OPTIONS"
        assert response["Content-Type"] == "application/json"
    assert accepted["Location"] == accepted.json()["status_url"]
    assert refused.json()["error"]["code"] == "invalid_body"
    assert calls == []
    # Other methods: DRF's answers, as before.
    put = client.put(URL, data="{}", content_type="application/json")
    assert put.status_code == 405
    assert put.json()["error"]["code"] == "method_not_allowed"
    assert client.options(URL).json()["name"] == "Intake"
    assert calls == ["PUT", "OPTIONS"]
