"""Erasing a person by one of their leads: ``POST /api/v1/leads/<id>/erase/`` (its own
permission, ``leads.erase_lead``) and the lead list's admin action (issue 21)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from audit.models import Event, EventType
from audit.verify import audit_verify
from leads.models import Lead
from routing.erasure import is_erased
from tests.leads.factories import LeadFactory
from tests.routing.test_erasure import (
    EMAIL,
    NEEDLES,
    _found_anywhere,
    _person_everywhere,
    _rules,  # noqa: F401 (autouse fixture)
)


def _api(*codenames: str, username: str = "") -> APIClient:
    user = User.objects.create_user(username or f"user-{'-'.join(codenames)}")
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def _erase(client: APIClient, lead: Any, body: Any) -> Any:
    return client.post(f"/api/v1/leads/{lead.pk}/erase/", body, format="json")


def _api_end_to_end() -> None:
    leads, _ = _person_everywhere()
    client = _api("view_lead", "erase_lead", username="dpo")
    # By its e-mail (its phone is not followed: it may be a switchboard), then the lead that
    # gave only that phone.
    for lead in leads:
        response = _erase(client, lead, {"reason": "GDPR art. 17, ticket 4711"})
        assert response.status_code == 200, response.content
        body = response.json()
        assert body["already_erased"] is False
        assert body["leads"] == [str(lead.pk)]
        assert body["erased"]["leads"] == 1
        assert body["message"].startswith("erased: 1 leads")
    for needle in NEEDLES:
        assert _found_anywhere(needle) == [], needle
    report = audit_verify()
    assert report.ok, report.findings
    assert report.erasures == 2
    event = Event.objects.get(chain=str(leads[0].pk), type=EventType.ERASED)
    assert event.actor == "user:dpo"
    assert event.data["reason"] == "GDPR art. 17, ticket 4711"

    # Twice: a clear answer, nothing written again.
    again = _erase(client, leads[0], {"reason": "again"})
    assert again.status_code == 200
    assert again.json()["already_erased"] is True
    assert again.json()["leads"] == []
    assert Event.objects.filter(type=EventType.ERASED).count() == 2


@pytest.mark.django_db
def test_the_api_erases_the_person_of_a_lead_end_to_end() -> None:
    _api_end_to_end()


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_api_erases_the_person_of_a_lead_end_to_end_on_postgresql() -> None:
    _api_end_to_end()


@pytest.mark.django_db
def test_erasing_needs_its_own_permission_and_a_reason() -> None:
    lead = LeadFactory(raw_payload={"email": EMAIL})
    viewer = _api("view_lead")
    refused = _erase(viewer, lead, {"reason": "r"})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "forbidden"
    eraser = _api("view_lead", "erase_lead")
    for body in ({}, {"reason": ""}, {"reason": "   "}, {"reason": 5}, {"reason": "x" * 501}, [1]):
        response = _erase(eraser, lead, body)
        assert response.status_code == 400, (body, response.content)
        assert response.json()["error"]["code"] in ("invalid_body", "invalid_json")
    not_json = eraser.post(f"/api/v1/leads/{lead.pk}/erase/", "reason=r", content_type="text/plain")
    assert 400 <= not_json.status_code < 500
    for missing in ("00000000-0000-0000-0000-000000000000", "not-a-uuid"):
        response = eraser.post(f"/api/v1/leads/{missing}/erase/", {"reason": "r"}, format="json")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
    assert not is_erased(Lead.objects.get(pk=lead.pk))
    assert not Event.objects.filter(type=EventType.ERASED).exists()


@pytest.mark.django_db
def test_a_lead_still_queued_is_erased_by_its_id() -> None:
    """Not normalised yet: the lead holds the person only in its raw payload."""
    lead = LeadFactory(raw_payload={"name": "Zebulon Quartermaine", "company": "Quartzly"})
    assert lead.email == ""
    response = _erase(_api("view_lead", "erase_lead"), lead, {"reason": "asked by phone"})
    assert response.status_code == 200, response.content
    assert response.json()["leads"] == [str(lead.pk)]
    lead.refresh_from_db()
    assert is_erased(lead)
    assert "Quartermaine" not in str(lead.raw_payload)


@pytest.mark.django_db
def test_the_erase_operation_is_in_the_openapi_document() -> None:
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    operation = schema["paths"]["/api/v1/leads/{lead_id}/erase/"]["post"]
    assert operation["operationId"] == "lead_erase"
    assert {"200", "400", "403", "404"} <= set(operation["responses"])


@pytest.mark.django_db
def test_the_admin_action_asks_why_then_erases(client) -> None:  # type: ignore[no-untyped-def]
    leads, _ = _person_everywhere()
    admin = User.objects.create_user("rita", is_staff=True)
    for codename in ("view_lead", "change_lead"):
        admin.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(admin)
    url = "/admin/leads/lead/"
    selected = {"action": "erase_person", "_selected_action": [str(lead.pk) for lead in leads]}
    # Without the permission the action is not offered.
    page = client.get(url).content.decode()
    assert "erase_person" not in page
    admin.user_permissions.add(Permission.objects.get(codename="erase_lead"))
    admin = User.objects.get(pk=admin.pk)  # drop the permission cache
    client.force_login(admin)
    assert "erase_person" in client.get(url).content.decode()
    confirm = client.post(url, selected)
    assert confirm.status_code == 200
    assert "cannot be undone" in confirm.content.decode()
    assert not is_erased(Lead.objects.get(pk=leads[0].pk))
    blank = client.post(url, {**selected, "apply": "1", "reason": " "})
    assert blank.status_code == 200  # asked again: a reason is required
    assert not is_erased(Lead.objects.get(pk=leads[0].pk))
    done = client.post(url, {**selected, "apply": "1", "reason": "GDPR ticket 12"}, follow=True)
    assert done.status_code == 200
    assert "2 lead(s) erased" in done.content.decode()
    assert all(is_erased(lead) for lead in Lead.objects.filter(pk__in=[x.pk for x in leads]))
    for needle in NEEDLES:
        assert _found_anywhere(needle) == [], needle
    event = Event.objects.get(chain=str(leads[1].pk), type=EventType.ERASED)
    assert (event.actor, event.data["reason"]) == ("user:rita", "GDPR ticket 12")
