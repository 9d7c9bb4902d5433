"""Subject access (issue 21): everything held about one person, as JSON, from the API, the admin
and manage.py; an erased person exports as what remains."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from audit.subject_access import person_export
from leads import privacy
from routing.erasure import person_erase
from tests.leads.factories import LeadFactory
from tests.routing.test_erasure import (
    EMAIL,
    FIRST,
    LAST,
    PHONE,
    _person_everywhere,
    _rules,  # noqa: F401 (autouse fixture)
)

pytestmark = pytest.mark.django_db


def _api(*codenames: str) -> APIClient:
    user = User.objects.create_user(f"u-{'-'.join(codenames) or 'none'}")
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def test_the_export_holds_every_lead_assignment_event_delivery_and_refusal():
    leads, _ = _person_everywhere()
    other = LeadFactory(raw_payload={"email": "someone.else@elsewhere.example"})
    # By the e-mail alone: the lead holding it (a phone found on it is not followed: it may be
    # a switchboard others share, as in erasure).
    by_email = person_export(email=EMAIL.upper(), actor="user:dpo")
    assert [lead["id"] for lead in by_email["leads"]] == [str(leads[0].pk)]
    document = person_export(email=EMAIL.upper(), phone=PHONE, actor="user:dpo")
    assert document["format"] == "leadrouter.subject-access/1"
    assert document["found"] is True
    ids = [lead["id"] for lead in document["leads"]]
    # The phone-only lead is found through the phone, the e-mail lead through the e-mail.
    assert sorted(ids) == sorted(str(lead.pk) for lead in leads)
    assert str(other.pk) not in ids
    first = next(lead for lead in document["leads"] if lead["id"] == str(leads[0].pk))
    assert first["fields"]["email"] == EMAIL
    assert first["fields"]["first_name"] == FIRST
    assert first["as_received"]["Favourite colour"] == f"{FIRST}'s own words"
    assert first["assignments"][0]["rule"] == "Everyone"
    assert first["assignments"][0]["current_owner"] is True
    words = [event["words"] for event in first["events"]]
    assert words[0].startswith("Received")
    assert any(w.startswith("Assigned") for w in words)
    assert any(f"HubSpot: contact {FIRST} {LAST}" in w for w in words)  # sealed, opened
    assert first["deliveries"]
    assert first["deliveries"][0]["channel"] == "webhook"
    assert [r["body"] for r in document["refused_payloads"]] == [{"mail": EMAIL}]
    assert document["person"]["phones"] == [PHONE]
    assert json.dumps(document)  # JSON all the way down


def test_an_erased_person_exports_as_what_remains():
    leads, _ = _person_everywhere()
    person_erase(email=EMAIL, phone=PHONE, actor="user:dpo", reason="GDPR")
    document = person_export(phone=PHONE)
    assert document["found"] is False  # nothing is found by their data any more
    by_id = person_export(lead_ids=[leads[0].pk])
    (lead,) = by_id["leads"]
    assert lead["erased"] is True
    assert lead["fields"]["first_name"] == privacy.ERASED
    assert lead["assignments"][0]["rule"] == "Everyone"  # the decision stays
    text = json.dumps(by_id)
    for needle in (EMAIL, PHONE, LAST):
        assert needle not in text
    assert any(event["type"] == "erased" for event in lead["events"])


def test_the_api_needs_its_own_permission_and_names_the_person():
    _person_everywhere()
    assert _api("view_lead").get(f"/api/v1/people/export/?email={EMAIL}").status_code == 403
    client = _api("export_person")
    missing = client.get("/api/v1/people/export/")
    assert missing.status_code == 400
    assert missing.json()["error"]["code"] == "invalid_filter"
    assert client.get("/api/v1/people/export/?email=" + "x" * 400).status_code == 400
    unknown = client.get("/api/v1/people/export/?email=nobody@nowhere.example")
    assert unknown.status_code == 200
    assert unknown.json()["found"] is False
    found = client.get(f"/api/v1/people/export/?email={EMAIL}")
    assert found.status_code == 200
    assert found["Cache-Control"] == "no-store"
    assert len(found.json()["leads"]) == 1
    both = client.get(f"/api/v1/people/export/?email={EMAIL}&phone=%2B{PHONE[1:]}")
    assert len(both.json()["leads"]) == 2


def test_the_admin_action_downloads_the_json(client):
    leads, _ = _person_everywhere()
    admin = User.objects.create_user("dora", is_staff=True)
    for codename in ("view_lead", "change_lead", "export_person"):
        admin.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(admin)
    response = client.post(
        "/admin/leads/lead/",
        {"action": "export_person", "_selected_action": [str(leads[1].pk)]},
    )
    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="subject-access.json"'
    document = json.loads(response.content)
    # The lead's person: the phone it gave, not the lead with an e-mail and the same phone.
    assert [lead["id"] for lead in document["leads"]] == [str(leads[1].pk)]


def test_the_command_prints_the_json():
    leads, _ = _person_everywhere()
    out = StringIO()
    call_command("person_export", "--phone", PHONE, stdout=out)
    # The phone names the lead that gave no e-mail (the other's phone may be a switchboard).
    assert [lead["id"] for lead in json.loads(out.getvalue())["leads"]] == [str(leads[1].pk)]
    out = StringIO()
    call_command("person_export", "--phone", PHONE, "--email", EMAIL, stdout=out)
    assert len(json.loads(out.getvalue())["leads"]) == 2
    with pytest.raises(CommandError, match="e-mail or a phone"):
        call_command("person_export")


def test_the_export_refuses_a_fragment_of_an_address():
    """?email=example.com would hand one person everyone's data (review of issue 21)."""
    from audit.subject_access import SubjectAccessRefused

    LeadFactory(raw_payload={"Email": "joann@example.com"})
    with pytest.raises(SubjectAccessRefused, match="not a whole"):
        person_export(email="example.com")
    with pytest.raises(CommandError, match="not a whole"):
        call_command("person_export", email="example.com")
    answer = _api("export_person").get("/api/v1/people/export/?email=example.com")
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_filter"
    assert "not a whole" in answer.json()["error"]["message"]


def test_a_lead_with_every_field_filled_exports_each_value():
    """Issue 21: the export held nine lead fields, no opened event data, no delivery attempts."""
    from decimal import Decimal

    from django.contrib.admin.models import CHANGE, LogEntry
    from django.contrib.contenttypes.models import ContentType
    from django.utils import timezone

    from audit.models import EventType
    from leads.models import Lead
    from routing.delivery.models import Delivery, DeliveryAttempt

    leads, _ = _person_everywhere()
    lead = leads[0]
    now = timezone.now().replace(microsecond=0)
    filled = {
        "email_domain": "quartzly.example",
        "domain": "quartzly-corp.example",
        "title": "Head of Quartz",
        "country": "DE",
        "region": "BE",
        "city": "Berlin-Quartz",
        "postal_code": "10115",
        "employees": 4321,
        "annual_revenue": Decimal("1234567.89"),
        "industry": "Quartz mining",
        "lead_score": 87.5,
        "utm_source": "quartz-source",
        "utm_medium": "quartz-medium",
        "utm_campaign": "quartz-campaign",
        "flags": ["quartz_flag"],
        "last_error": f"an old error quoting {EMAIL}",
        "idempotency_key": "quartz-idem-1",
        "priority": "hot",
        "tags": ["quartz-tag"],
        "custom": {"Favourite colour": "quartz pink"},
        "enrichment": {"clearbit": {"company": "Quartzly GmbH"}},
        "crm": {"hubspot": {"person": {"email": EMAIL, "id": "hs-quartz"}}},
        "fetch": {"leadgen_id": "quartz-fetch", "field_data": [{"name": "email"}]},
        "normalized_at": now,
    }
    Lead.objects.filter(pk=lead.pk).update(**filled)
    lead.refresh_from_db()
    assignment = lead.assignments.get()
    assignment.touched_at = now
    assignment.touch_source = "link"
    assignment.sla_due_at = now
    assignment.save()
    delivery = Delivery.objects.filter(assignment=assignment).first()
    DeliveryAttempt.objects.create(
        delivery=delivery,
        number=1,
        at=now,
        status_code=500,
        error="quartz error",
        response_excerpt=f"they said {FIRST}",
        outcome="retry",
    )
    LogEntry.objects.create(
        user=User.objects.create_user("quartz-admin"),
        content_type=ContentType.objects.get_for_model(Lead),
        object_id=str(lead.pk),
        object_repr=EMAIL,
        action_flag=CHANGE,
        change_message="Changed title.",
    )

    document = person_export(email=EMAIL, actor="user:dpo")
    exported = next(x for x in document["leads"] if x["id"] == str(lead.pk))
    fields = exported["fields"]
    for name in (
        "email_domain",
        "domain",
        "title",
        "country",
        "region",
        "city",
        "postal_code",
        "employees",
        "lead_score",
        "utm_source",
        "utm_medium",
        "utm_campaign",
        "flags",
        "last_error",
        "idempotency_key",
        "priority",
        "tags",
    ):
        assert fields[name] == filled[name], name
    assert fields["annual_revenue"] == "1234567.89"
    assert fields["normalized_at"] == now.isoformat()
    assert fields["first_name"] == FIRST
    assert fields["last_name"] == LAST
    assert fields["phone"] == PHONE
    assert fields["company"] == "Quartzly"
    assert fields["dedup_key"] == lead.dedup_key
    # Every column of the model is there, but those exported under names of their own.
    elsewhere = {"id", "source", "raw_payload", "custom", "enrichment", "crm", "fetch"}
    for field in Lead._meta.concrete_fields:
        if field.name not in elsewhere and field.name != "person_key":
            assert (field.attname if field.is_relation else field.name) in fields, field.name
    assert exported["custom"] == filled["custom"]
    assert exported["enrichment"] == filled["enrichment"]
    assert exported["crm"] == filled["crm"]
    assert exported["fetched"] == filled["fetch"]
    assert exported["as_received"]["Favourite colour"] == f"{FIRST}'s own words"

    owner = exported["assignments"][0]
    assert owner["rep"] in ("Ana", "Ben")
    assert owner["rule"] == "Everyone"
    assert owner["first_touch_at"] == now.isoformat()
    assert owner["first_touch_by"] == "link"
    assert owner["sla_due_at"] == now.isoformat()
    assert owner["trace"] == assignment.trace

    # Events with their opened (sealed) data and trace.
    crm = next(e for e in exported["events"] if e["type"] == EventType.CRM_CHECKED)
    assert crm["data"]["summary"] == f"HubSpot: contact {FIRST} {LAST}"
    assert crm["data"]["crm"]["hubspot"]["person"] == {"email": EMAIL}
    assigned = next(e for e in exported["events"] if e["type"] == EventType.ASSIGNED)
    assert assigned["rule"] == "Everyone"
    assert assigned["trace"]
    assert assigned["trace"] != [{"rule": None, "matched": False, "why": privacy.ERASED}]
    assert "_sealed" not in assigned["data"]

    sent = next(d for d in exported["deliveries"] if d["attempt_log"])
    assert sent["body"] == delivery.payload
    assert sent["attempt_log"][0]["response_excerpt"] == f"they said {FIRST}"
    assert sent["attempt_log"][0]["error"] == "quartz error"
    assert exported["admin_log"][0]["object"] == EMAIL
    assert exported["admin_log"][0]["change"] == "Changed title."
    assert json.dumps(document)
