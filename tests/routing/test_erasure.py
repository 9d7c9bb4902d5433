"""Erasing a person (routing/erasure.py) end to end, on SQLite and on PostgreSQL.

After erasure no column of any table holds the person's e-mail, phone or name (raw SQL over
every text, JSON and binary column); the audit log still verifies and reports the erasure;
a row tampered afterwards is still detected; the pages and the API render "erased person".
"""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import Client

from audit.models import Event, EventType
from audit.services import event_record
from audit.triggers import triggers_create, triggers_drop
from audit.verify import audit_verify
from leads import privacy
from leads.models import Lead, LeadStatus, PersonKey, RefusedPayload
from routing.decisions import clear_live_config_cache
from routing.delivery.models import Delivery, WebhookEndpoint
from routing.erasure import ErasureRefused, person_erase
from routing.rules_io import rules_import
from routing.services import lead_process
from tests.audit.test_pages import manager
from tests.leads.factories import LeadFactory
from tests.routing.test_pipeline import RULES

EMAIL = "zebulon.quartermaine@quartzly.example"
PHONE = "+4930555123456"
FIRST, LAST = "Zebulon", "Quartermaine"
NEEDLES = [EMAIL, PHONE, FIRST, LAST]


@pytest.fixture(autouse=True)
def _rules() -> Any:
    privacy.cache_clear()
    clear_live_config_cache()
    yield
    clear_live_config_cache()
    privacy.cache_clear()


def _text_columns() -> list[tuple[str, str, bool]]:
    """(table, column, is_binary) of every text, JSON and binary column of the database."""
    out = []
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND data_type IN "
                "('text', 'character varying', 'json', 'jsonb', 'bytea')"
            )
            return [(t, c, d == "bytea") for t, c, d in cursor.fetchall()]
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f'PRAGMA table_info("{table}")')
            for _, column, kind, *_ in cursor.fetchall():
                kind = (kind or "").lower()
                if any(word in kind for word in ("char", "text", "json", "blob")) or not kind:
                    out.append((table, column, "blob" in kind))
    return out


def _found_anywhere(needle: str) -> list[str]:
    hits = []
    with connection.cursor() as cursor:
        for table, column, binary in _text_columns():
            if connection.vendor == "postgresql":
                if binary:
                    where = f'position(%s::bytea in "{column}") > 0'
                    sql = f'SELECT count(*) FROM "{table}" WHERE {where}'  # noqa: S608 (catalog names)
                    params: list[Any] = [needle.encode()]
                else:
                    sql = f'SELECT count(*) FROM "{table}" WHERE "{column}"::text ILIKE %s'  # noqa: S608
                    params = [f"%{needle}%"]
            else:
                sql = f'SELECT count(*) FROM "{table}" WHERE CAST("{column}" AS TEXT) LIKE %s'  # noqa: S608
                params = [f"%{needle}%"]
            cursor.execute(sql, params)
            if cursor.fetchone()[0]:
                hits.append(f"{table}.{column}")
    return hits


def _person_everywhere() -> tuple[list[Lead], RefusedPayload]:
    """Two leads of the person routed (with an outbox), a CRM event, a refused payload."""
    rules_import(RULES, publish=True)
    WebhookEndpoint.objects.create(name="CRM hook", url="https://hooks.example.com/in")
    payload = {
        "email": EMAIL,
        "first_name": FIRST,
        "last_name": LAST,
        "phone": PHONE,
        "company": "Quartzly",
        "Favourite colour": f"{FIRST}'s own words",
    }
    first = LeadFactory(raw_payload=payload)
    second = LeadFactory(raw_payload={"phone": PHONE, "name": f"{FIRST} {LAST}"})
    for lead in (first, second):
        lead_process(lead_id=lead.id)
        lead.refresh_from_db()
    event_record(
        type=EventType.CRM_CHECKED,
        lead=first,
        data={
            "status": "done",
            "summary": f"HubSpot: contact {FIRST} {LAST}",
            "crm": {"hubspot": {"status": "done", "person": {"email": EMAIL}}},
        },
    )
    refused = RefusedPayload.objects.create(
        source=first.source,
        body=f'{{"mail": "{EMAIL}"}}'.encode(),
        status_code=422,
        reason="not_a_lead",
    )
    return [first, second], refused


def _erase_end_to_end(client: Client) -> None:
    leads, refused = _person_everywhere()
    assert leads[0].status == LeadStatus.ASSIGNED
    assert Delivery.objects.filter(assignment__lead=leads[0]).exists()
    # Before: the person is in the tables; events hold it only sealed.
    assert _found_anywhere(EMAIL)
    crm_event = Event.objects.get(chain=str(leads[0].pk), type=EventType.CRM_CHECKED)
    assert crm_event.data["summary"] == f"HubSpot: contact {FIRST} {LAST}"  # opened on read
    stored = Event.objects.filter(pk=crm_event.pk).values("data", "trace", "sealed").get()
    assert "summary" not in stored["data"]
    assert stored["sealed"]
    assert audit_verify().ok

    out = StringIO()
    call_command(
        "lead_erase",
        "--email",
        EMAIL.upper(),
        "--phone",
        PHONE,
        "--reason",
        "GDPR request 2026-12-03",
        stdout=out,
    )
    assert "erased: 2 leads" in out.getvalue()
    assert not RefusedPayload.objects.filter(pk=refused.pk).exists()

    for needle in NEEDLES:
        assert _found_anywhere(needle) == [], needle
    assert not PersonKey.objects.filter(wrapped__isnull=False).exists()
    report = audit_verify()
    assert report.ok, report.findings
    assert report.erasures == 2
    assert report.sealed_erased >= 2
    verified = StringIO()
    call_command("audit_verify", stdout=verified)
    assert "2 erasure(s) recorded" in verified.getvalue()

    erased = Event.objects.get(chain=str(leads[0].pk), type=EventType.ERASED)
    assert erased.actor.startswith("cli:")
    assert erased.data["reason"] == "GDPR request 2026-12-03"
    assert erased.data["erased"]["leads"] == 2
    crm_event = Event.objects.get(pk=crm_event.pk)
    assert crm_event.data["summary"] == privacy.ERASED
    assert crm_event.data["status"] == "done"  # the plain part stays

    # The decision structure stays: the owner, the rule, when.
    lead = Lead.objects.get(pk=leads[0].pk)
    assignment = lead.assignments.get()
    assert assignment.rule_name == "Everyone"
    assert assignment.rep_name in ("Ana", "Ben")
    assigned = Event.objects.get(chain=str(lead.pk), type=EventType.ASSIGNED)
    assert assigned.rule_name == "Everyone"
    assert assigned.trace == [{"rule": None, "matched": False, "why": privacy.ERASED}]

    # Pages and the API.
    user = manager("mia")
    user.user_permissions.add(Permission.objects.get(codename="view_lead"))
    client.force_login(user)
    page = client.get(f"/history/{lead.pk}/").content.decode()
    assert privacy.ERASED in page
    assert client.get("/dashboard/").status_code == 200
    assert client.get("/history/").status_code == 200
    detail = client.get(f"/api/v1/leads/{lead.pk}/")
    assert detail.status_code == 200
    assert EMAIL not in detail.content.decode()
    assert privacy.ERASED in detail.content.decode()

    # Twice, or an unknown person: a clear answer, nothing written.
    again = person_erase(email=EMAIL, actor="user:x", reason="again")
    assert not again.found
    assert "nothing held" in again.sentence()
    assert Event.objects.filter(type=EventType.ERASED).count() == 2
    with pytest.raises(ErasureRefused):
        person_erase(email=" ", phone="", actor="user:x", reason="r")
    with pytest.raises(CommandError, match="e-mail or a phone"):
        call_command("lead_erase", "--reason", "r")

    # A row tampered with after the erasure is still detected.
    with transaction.atomic(), connection.cursor() as cursor:
        triggers_drop(connection)
        cursor.execute(
            "UPDATE audit_event SET rule_name = %s WHERE id = %s", ["Other rule", assigned.pk]
        )
        triggers_create(connection)
    findings = audit_verify().findings
    assert [(f.kind, f.event_id) for f in findings] == [("altered", assigned.pk)]


@pytest.mark.django_db
def test_erasure_end_to_end_on_the_embedded_database(client: Client) -> None:
    _erase_end_to_end(client)


@pytest.mark.postgres
@pytest.mark.django_db
def test_erasure_end_to_end_on_postgresql(client: Client) -> None:
    _erase_end_to_end(client)


@pytest.mark.django_db
def test_a_lead_still_queued_is_found_by_its_raw_payload() -> None:
    lead = LeadFactory(raw_payload={"Email": EMAIL})
    assert lead.normalized_at is None
    result = person_erase(email=EMAIL, actor="user:dpo", reason="request")
    assert result.leads == 1
    lead.refresh_from_db()
    assert lead.raw_payload == {"erased": True}
    assert lead_process(lead_id=lead.id) is not None  # routes what is left, without failing
    assert _found_anywhere(EMAIL) == []


@pytest.mark.django_db
def test_an_erased_unassigned_lead_is_not_routed_again() -> None:
    """Its fields are gone: the automatic retries must not hand "erased person" to a rep."""
    from datetime import timedelta

    from django.utils import timezone

    from routing.monitoring.unassigned import unassigned_retry

    rules_import(RULES, publish=True)
    lead = LeadFactory(raw_payload={"email": EMAIL, "first_name": FIRST})
    lead_process(lead_id=lead.id)
    now = timezone.now()
    Lead.objects.filter(pk=lead.pk).update(
        status=LeadStatus.UNASSIGNED, unassigned_retry_at=now - timedelta(minutes=1)
    )
    person_erase(email=EMAIL, actor="user:dpo", reason="request")
    assert unassigned_retry(now=now) == 0
    assert Lead.objects.get(pk=lead.pk).status == LeadStatus.UNASSIGNED


@pytest.mark.django_db
def test_erasing_one_address_leaves_a_longer_address_that_holds_it_alone() -> None:
    """ann@example.com's erasure must not take joann@example.com's queued lead or refused row
    (review of issue 21: the raw searches matched any fragment; this failed before)."""
    ann = LeadFactory(raw_payload={"Email": "ann@example.com"})
    joann = LeadFactory(raw_payload={"Email": "joann@example.com", "note": "ann@example.com.au"})
    refused_ann = RefusedPayload.objects.create(
        source=ann.source, body=b'{"mail": "ann@example.com"}', status_code=422, reason="x"
    )
    refused_joann = RefusedPayload.objects.create(
        source=ann.source, body=b'{"mail": "joann@example.com"}', status_code=422, reason="x"
    )
    result = person_erase(email="ann@example.com", actor="user:dpo", reason="request")
    assert result.leads == 1
    assert result.lead_ids == [str(ann.pk)]
    joann.refresh_from_db()
    assert joann.raw_payload["Email"] == "joann@example.com"
    assert not RefusedPayload.objects.filter(pk=refused_ann.pk).exists()
    assert RefusedPayload.objects.filter(pk=refused_joann.pk).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("email", "phone"),
    [("example.com", ""), ("gmail.com", ""), ("@example.com", ""), ("", "+49"), ("", "030 12")],
)
def test_a_fragment_names_no_one_and_erases_nothing(email: str, phone: str) -> None:
    lead = LeadFactory(raw_payload={"Email": "ann@example.com", "phone": "+49 30 1234567"})
    with pytest.raises(ErasureRefused, match="not a whole"):
        person_erase(email=email, phone=phone, actor="user:dpo", reason="request")
    with pytest.raises(CommandError, match="not a whole"):
        call_command("lead_erase", email=email, phone=phone, reason="request")
    lead.refresh_from_db()
    assert lead.raw_payload["Email"] == "ann@example.com"
    assert not Event.objects.filter(type=EventType.ERASED).exists()
