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
from django.test import Client, override_settings

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
    dashboard = client.get("/dashboard/")
    assert dashboard.status_code == 200
    history = client.get("/history/")
    assert history.status_code == 200
    listed = history.content.decode()
    assert listed.count(privacy.ERASED) >= 2  # both leads, by what remains of them
    assert assignment.rep_name in listed  # the decision stays on the list
    exported = b"".join(client.get("/history/export.csv").streaming_content).decode()
    assert exported.count(privacy.ERASED) >= 2
    for needle in NEEDLES:
        for text in (page, listed, exported, dashboard.content.decode()):
            assert needle not in text, needle
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


# --- Review of issue 21: correctness fixes ---------------------------------------------------


def _concurrently(*works: Any) -> list[Any]:
    """Run each of ``works`` on its own thread (own connection), started together."""
    import threading

    barrier = threading.Barrier(len(works))
    results: list[Any] = [None] * len(works)

    def run(index: int, work: Any) -> None:
        try:
            barrier.wait()
            results[index] = work()
        except BaseException as exc:  # handed to the assertion below
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, w)) for i, w in enumerate(works)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    return results


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_erasures_of_one_person_at_once_write_one_erased_event_on_postgresql() -> None:
    """Both read the lead before either erased it; the second re-checks under the lock and
    answers already erased (it wrote a second `erased` event before)."""
    from routing.erasure import lead_person_erase

    rules_import(RULES, publish=True)
    for _ in range(4):
        lead = LeadFactory(raw_payload={"email": EMAIL, "first_name": FIRST, "phone": PHONE})
        lead_process(lead_id=lead.id)
        results = _concurrently(
            *[
                lambda pk=lead.pk: lead_person_erase(lead_id=pk, actor="user:dpo", reason="r")
                for _ in range(2)
            ]
        )
        assert not [r for r in results if isinstance(r, BaseException)], results
        assert sorted(r.leads for r in results) == [0, 1]
        assert sorted(r.already_erased for r in results) == [0, 1]
        assert Event.objects.filter(lead=lead, type=EventType.ERASED).count() == 1


# Lead fields erasure keeps, each for a reason (routing/erasure.py, docs/operations.md): a new
# field must be put here or in LEAD_ERASED_VALUES, which is the point of this list.
KEPT_FIELDS = {
    "id", "source", "status", "country", "flags", "received_at", "normalized_at",
    "processed_at", "queued_at", "requeued_at", "claimed_until", "attempts", "deferrals",
    "unassigned_retries", "unassigned_retry_at", "person_key", "duplicate_of", "deduped_at",
    "enrichment_status", "enrichment_attempts", "enrichment_next_at", "crm_status",
    "crm_attempts", "crm_next_at", "crm_parked_at", "crm_dispatched_at", "fetch_status",
    "fetch_attempts", "fetch_next_at", "priority", "tags", "raw_pruned_at",
    "personal_pruned_at", "erased_at", "lane",
}  # fmt: skip

# A value of the person in every field that can hold one.
EVERY_FIELD = {
    "email": EMAIL,
    "email_domain": "quartzly-mail.example",
    "first_name": FIRST,
    "last_name": LAST,
    "phone": PHONE,
    "company": "Quartzly Holdings",
    "domain": "quartzly-hq.example",
    "title": "Chief Quartz Officer",
    "region": "QZ",
    "city": "Quartzburg",
    "postal_code": "QZ-98765",
    "industry": "Quartzite Polishing",
    "utm_source": "zebulon-source",
    "utm_medium": "zebulon-medium",
    "utm_campaign": "zebulon-campaign",
    "custom": {"Favourite colour": "Quartz pink"},
    "last_error": f"provider said no to {EMAIL}",
    "dedup_key": f"email:{EMAIL}",
    "idempotency_key": "zebulon-form-42",
    "request_fingerprint": "f" * 64,
    "enrichment": {"http": {"data": {"city": "Quartzburg"}}},
    "crm": {"hubspot": {"person": {"email": EMAIL}}},
    "fetch": {"lead": {"full_name": f"{FIRST} {LAST}"}},
}
EVERY_NUMBER = {"employees": 4321, "annual_revenue": 98765432, "lead_score": 87.25}


def test_every_lead_field_is_erased_or_kept_for_a_stated_reason() -> None:
    from routing.erasure import LEAD_ERASED_VALUES

    names = {field.name for field in Lead._meta.concrete_fields}
    assert names - KEPT_FIELDS - set(LEAD_ERASED_VALUES) == set()
    assert set(LEAD_ERASED_VALUES) & KEPT_FIELDS == set()
    assert set(EVERY_FIELD) | set(EVERY_NUMBER) <= set(LEAD_ERASED_VALUES)


@pytest.mark.django_db
def test_no_value_of_the_person_remains_in_the_lead_row() -> None:
    """email_domain, domain, utm_*, industry, region, the company's size... survived erasure."""
    import json

    from django.utils import timezone

    lead = LeadFactory(
        raw_payload={"email": EMAIL},
        normalized_at=timezone.now(),
        status=LeadStatus.UNASSIGNED,
        **EVERY_FIELD,
        **EVERY_NUMBER,
    )
    person_erase(email=EMAIL, actor="user:dpo", reason="request")
    row = Lead.objects.filter(pk=lead.pk).values().get()
    dump = json.dumps(row, default=str).lower()
    for name, value in EVERY_FIELD.items():
        for needle in value.values() if isinstance(value, dict) else [value]:
            text = needle if isinstance(needle, str) else json.dumps(needle)
            assert text.lower() not in dump, (name, text)
    for name in EVERY_NUMBER:
        assert row[name] is None, name
    assert row["first_name"] == privacy.ERASED
    assert row["erased_at"] is not None


@pytest.mark.django_db
def test_a_stored_replay_forgets_the_erased_leads_and_keeps_the_others() -> None:
    """AdminJob.result of a replay kept the e-mail and company of every lead it decided."""
    from routing.models import AdminJob, AdminJobKind, AdminJobStatus, RuleSet, RuleSetStatus

    rules_import(RULES, publish=True)
    mine = LeadFactory(raw_payload={"email": EMAIL, "company": "Quartzly Holdings"})
    other = LeadFactory(raw_payload={"email": "ann@other.example", "company": "Other Ltd"})
    for lead in (mine, other):
        lead_process(lead_id=lead.id)

    def row(lead: Lead) -> dict[str, Any]:  # as routing.versions.replay_result_data writes it
        lead.refresh_from_db()
        outcome = {"status": "assigned", "owner": "Ana", "team": "EMEA SDR", "rule": "Everyone"}
        return {
            "lead_id": str(lead.pk),
            "email": lead.email,
            "company": lead.company,
            "country": lead.country,
            "changed": ["owner"],
            "before": outcome,
            "after": {**outcome, "owner": "Ben"},
        }

    job = AdminJob.objects.create(
        kind=AdminJobKind.REPLAY,
        status=AdminJobStatus.DONE,
        ruleset=RuleSet.objects.get(status=RuleSetStatus.PUBLISHED),
        result={"considered": 2, "changed": 2, "rows": [row(mine), row(other)]},
    )
    assert _found_anywhere(EMAIL)

    person_erase(email=EMAIL, actor="user:dpo", reason="request")
    rows = {r["lead_id"]: r for r in AdminJob.objects.get(pk=job.pk).result["rows"]}
    assert (rows[str(mine.pk)]["email"], rows[str(mine.pk)]["company"]) == ("", "")
    assert rows[str(mine.pk)]["before"]["rule"] == "Everyone"  # the decision stays
    assert (rows[str(other.pk)]["email"], rows[str(other.pk)]["company"]) == (
        "ann@other.example",
        "Other Ltd",
    )
    assert _found_anywhere(EMAIL) == []
    assert _found_anywhere("Quartzly Holdings") == []


@pytest.mark.parametrize(
    ("typed", "kept"),
    [
        ("GDPR request 2026-12-03", "GDPR request 2026-12-03"),
        (f"asked by {EMAIL.title()} by mail", "asked by [redacted] by mail"),
        ("call back +49 (30) 555-12345 please", "call back [redacted] please"),
        ("phone 030 5551234, ticket 42", "phone [redacted], ticket 42"),
        ("ann@example.com / +4930555123456", "[redacted] / [redacted]"),
        ("asked on 03.12.2026, case 1234", "asked on 03.12.2026, case 1234"),
    ],
)
def test_the_reason_is_recorded_without_an_e_mail_or_a_phone(typed: str, kept: str) -> None:
    from routing.erasure import reason_redact

    assert reason_redact(typed) == kept


@pytest.mark.django_db
def test_an_erasure_reason_naming_the_person_is_redacted_in_the_audit_log() -> None:
    lead = LeadFactory(raw_payload={"email": EMAIL})
    person_erase(
        email=EMAIL,
        actor="user:dpo",
        reason=f"Art. 17 request from {EMAIL}, phone {PHONE}, 2026-12-03",
    )
    erased = Event.objects.get(lead=lead, type=EventType.ERASED)
    assert erased.data["reason"] == "Art. 17 request from [redacted], phone [redacted], 2026-12-03"
    assert _found_anywhere(EMAIL) == []
    assert _found_anywhere(PHONE) == []


def _refused_case() -> None:
    lead = LeadFactory(raw_payload={"email": "someone@else.example"})
    mixed = RefusedPayload.objects.create(
        source=lead.source,
        body=b'{"mail": "Zebulon.Quartermaine@Quartzly.EXAMPLE", "x": "\xff\xfe"}',
        status_code=422,
        reason="not_a_lead",
    )
    utf8 = RefusedPayload.objects.create(
        source=lead.source,
        body='{"name": "Zoë", "mail": "ZEBULON.QUARTERMAINE@quartzly.example"}'.encode(),
        status_code=422,
        reason="not_a_lead",
    )
    longer = RefusedPayload.objects.create(
        source=lead.source,
        body=b'{"mail": "Jo.Zebulon.Quartermaine@Quartzly.example"}',
        status_code=422,
        reason="not_a_lead",
    )
    result = person_erase(email=EMAIL, actor="user:dpo", reason="request")
    assert result.refused_payloads == 2
    assert not RefusedPayload.objects.filter(pk__in=[mixed.pk, utf8.pk]).exists()
    assert RefusedPayload.objects.filter(pk=longer.pk).exists()  # another person's address


@pytest.mark.django_db
def test_the_refused_inbox_is_searched_without_regard_to_case() -> None:
    _refused_case()


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_refused_inbox_is_searched_without_regard_to_case_on_postgresql() -> None:
    _refused_case()


@pytest.mark.django_db
def test_leads_erased_before_the_column_existed_are_backfilled() -> None:
    import importlib

    from django.apps import apps
    from django.utils import timezone

    migration = importlib.import_module("leads.migrations.0021_lead_erased_at")
    erased = LeadFactory(raw_payload={"erased": True}, first_name=privacy.ERASED)
    at = timezone.now().replace(microsecond=0) - timezone.timedelta(days=3)
    event_record(type=EventType.ERASED, lead_id=erased.pk, at=at, data={"reason": "old"})
    no_event = LeadFactory(raw_payload={"erased": True}, first_name=privacy.ERASED)
    pruned = LeadFactory(
        raw_payload={"pruned": "retention"},
        first_name=privacy.ERASED,
        personal_pruned_at=timezone.now(),
    )
    named = LeadFactory(raw_payload={}, first_name=privacy.ERASED, email="real@person.example")
    migration.backfill(apps, None)
    got = dict(Lead.objects.values_list("pk", "erased_at"))
    assert got[erased.pk] == at
    assert got[no_event.pk] is not None
    assert got[pruned.pk] is None  # pruned by retention, not erased at anyone's request
    assert got[named.pk] is None


# --- Final review of issue 21 -----------------------------------------------------------------


def _nameless_lead_erased_by_id() -> None:
    """A lead with neither e-mail nor phone (a name and an employer) had no person key: its
    audit events were stored plain, and a rule on its company quoted the company in the trace,
    in the append-only log, where erasure could not reach it (found by the final review)."""
    import copy

    from routing.erasure import lead_person_erase

    rules = copy.deepcopy(RULES)
    rules["ruleset"]["rules"].insert(
        0,
        {
            "name": "Rivals by company",
            "priority": 5,
            "when": {"all": [{"field": "company", "op": "contains", "value": "rivalcorp"}]},
            "action": {"type": "exclude", "reason": "competitor"},
        },
    )
    rules_import(rules, publish=True)
    lead = LeadFactory(raw_payload={"first_name": FIRST, "last_name": LAST, "company": "Quartzly"})
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    assigned = Event.objects.get(lead=lead, type=EventType.ASSIGNED)
    assert any("Quartzly" in entry["why"] for entry in assigned.trace)  # opened on read

    result = lead_person_erase(lead_id=lead.pk, actor="user:dpo", reason="request")
    assert result.leads == 1
    for needle in (FIRST, LAST, "Quartzly"):
        assert _found_anywhere(needle) == [], needle
    report = audit_verify()
    assert report.ok, report.findings
    assert not report.key_problems
    assert report.sealed_erased >= 1
    assigned = Event.objects.get(pk=assigned.pk)
    assert assigned.rule_name == "Everyone"  # the decision stays
    assert assigned.trace == [{"rule": None, "matched": False, "why": privacy.ERASED}]


@pytest.mark.django_db
def test_a_lead_without_e_mail_or_phone_is_erased_from_the_audit_log_too() -> None:
    _nameless_lead_erased_by_id()


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_lead_without_e_mail_or_phone_is_erased_from_the_audit_log_too_on_postgresql() -> None:
    _nameless_lead_erased_by_id()


SWITCHBOARD = "+49 30 1234567"


def _colleagues() -> tuple[Lead, Lead, Lead, Lead]:
    """Ann and Bob gave their company's switchboard number; Bob has a lead without it; a
    caller left only that number."""
    rules_import(RULES, publish=True)
    ann = LeadFactory(raw_payload={"email": "ann@acme.example", "phone": SWITCHBOARD})
    bob = LeadFactory(raw_payload={"email": "bob@acme.example", "phone": SWITCHBOARD})
    bob_again = LeadFactory(raw_payload={"email": "bob@acme.example", "company": "Acme"})
    caller = LeadFactory(raw_payload={"phone": SWITCHBOARD, "first_name": "Cleo"})
    for lead in (ann, bob, bob_again, caller):
        lead_process(lead_id=lead.id)
        lead.refresh_from_db()
    return ann, bob, bob_again, caller


@pytest.mark.django_db
def test_erasing_a_lead_does_not_erase_colleagues_who_share_its_phone() -> None:
    """Erasing Ann's lead (the API, the admin) followed her phone, a switchboard, to Bob's lead,
    then Bob's e-mail to all his leads, and destroyed his key (final review of issue 21)."""
    from routing.erasure import lead_person_erase

    ann, bob, bob_again, caller = _colleagues()
    result = lead_person_erase(lead_id=ann.pk, actor="user:dpo", reason="asked")
    assert result.lead_ids == [str(ann.pk)]
    assert result.keys == 1
    for other in (bob, bob_again, caller):
        fresh = Lead.objects.get(pk=other.pk)
        assert fresh.erased_at is None
        assert (fresh.phone, fresh.email) == (other.phone, other.email)
        assert PersonKey.objects.get(pk=other.person_key_id).wrapped is not None
    # A phone names the person of a lead that has no e-mail: the caller, not Ann or Bob.
    result = person_erase(phone=SWITCHBOARD, actor="user:dpo", reason="asked")
    assert result.lead_ids == [str(caller.pk)]
    assert Lead.objects.filter(pk__in=[bob.pk, bob_again.pk], erased_at__isnull=True).count() == 2


@pytest.mark.django_db
def test_a_lead_s_subject_access_export_holds_no_one_who_shares_its_phone(client: Client) -> None:
    """The admin's export of Ann's lead handed Bob's leads, and the caller's, to Ann."""
    import json

    from django.contrib.auth.models import User

    ann, *_ = _colleagues()
    dpo = User.objects.create_user("dpo", is_staff=True)
    for codename in ("view_lead", "change_lead", "export_person"):
        dpo.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(dpo)
    response = client.post(
        "/admin/leads/lead/", {"action": "export_person", "_selected_action": [str(ann.pk)]}
    )
    assert response.status_code == 200
    document = json.loads(response.content)
    assert [lead["id"] for lead in document["leads"]] == [str(ann.pk)]
    assert "bob@acme.example" not in response.content.decode()
    assert "Cleo" not in response.content.decode()


@pytest.mark.django_db
def test_an_erasure_and_a_retention_batch_refuse_to_run_inside_another_transaction() -> None:
    """Each is the outermost transaction (durable): inside a caller's, "one transaction per
    person" and "a crash loses at most the open batch" would not hold, and the key cache would
    be cleared before the erasure commits (final review of issue 21)."""
    from datetime import timedelta

    from django.utils import timezone

    from routing.retention.services import retention_apply

    LeadFactory(raw_payload={"email": EMAIL})
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        person_erase(email=EMAIL, actor="user:dpo", reason="request")
    old = LeadFactory(raw_payload={"email": "old@retention.example"}, status=LeadStatus.EXCLUDED)
    Lead.objects.filter(pk=old.pk).update(received_at=timezone.now() - timedelta(days=400))
    with (
        override_settings(RETENTION_PERSONAL_DAYS=365),
        pytest.raises(RuntimeError, match="durable"),
        transaction.atomic(),
    ):
        retention_apply()


@pytest.mark.django_db
def test_a_reassignment_reason_naming_the_person_leaves_nothing_after_erasure() -> None:
    """A manager's typed reason ("Zebulon asked for Ben, call +49...") went plain into the
    assignment and its append-only `reassigned` event, where erasure could not reach it; it is
    recorded with e-mails and phone numbers redacted, as an erasure's own reason is (final
    review of issue 21)."""
    from routing.services import lead_reassign

    rules_import(RULES, publish=True)
    lead = LeadFactory(raw_payload={"email": EMAIL, "phone": PHONE})
    lead_process(lead_id=lead.id)
    owner = lead.assignments.get().rep_name
    other = "ben@example.com" if owner == "Ana" else "ana@example.com"
    assignment = lead_reassign(
        lead_id=lead.pk,
        rep_email=other,
        reason=f"asked by {EMAIL.title()} on the phone ({PHONE}), 2026-12-03",
        actor="user:mia",
    )
    assert assignment.reason == (
        "reassigned by hand (user:mia): asked by [redacted] on the phone ([redacted]), 2026-12-03"
    )
    person_erase(email=EMAIL, actor="user:dpo", reason="request")
    for needle in (EMAIL, PHONE):
        assert _found_anywhere(needle) == [], needle


@pytest.mark.django_db
def test_a_phone_takes_no_queued_lead_or_refused_row_that_names_someone_else() -> None:
    """Erasing the caller who left only the switchboard number deleted Bob's refused row and
    erased Bob's lead still queued, both holding that number beside Bob's e-mail (final
    review of issue 21): in a payload, as on a lead, a phone names no one who gave an e-mail."""
    bob_queued = LeadFactory(raw_payload={"Email": "bob@acme.example", "Phone": SWITCHBOARD})
    caller_queued = LeadFactory(raw_payload={"Phone": SWITCHBOARD, "Name": "Cleo"})
    source = bob_queued.source
    bob_refused = RefusedPayload.objects.create(
        source=source,
        body=f'{{"mail": "bob@acme.example", "tel": "{SWITCHBOARD}"}}'.encode(),
        status_code=422,
        reason="not_a_lead",
    )
    caller_refused = RefusedPayload.objects.create(
        source=source, body=f'{{"tel": "{SWITCHBOARD}"}}'.encode(), status_code=422, reason="x"
    )
    result = person_erase(phone=SWITCHBOARD, actor="user:dpo", reason="asked")
    assert result.lead_ids == [str(caller_queued.pk)]
    assert result.refused_payloads == 1
    assert RefusedPayload.objects.filter(pk=bob_refused.pk).exists()
    assert not RefusedPayload.objects.filter(pk=caller_refused.pk).exists()
    bob_queued.refresh_from_db()
    assert bob_queued.erased_at is None
    assert bob_queued.raw_payload["Email"] == "bob@acme.example"
    # Bob himself, by his e-mail and that phone: both are his.
    result = person_erase(
        email="bob@acme.example", phone=SWITCHBOARD, actor="user:dpo", reason="asked"
    )
    assert result.lead_ids == [str(bob_queued.pk)]
    assert not RefusedPayload.objects.filter(pk=bob_refused.pk).exists()
