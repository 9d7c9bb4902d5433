"""Retention (routing/retention/): periods from a frozen clock, per source, resumable, counted.

Leads are routed for real (lead_process, the published test rules); the clock is the ``now``
the job is given, so "400 days ago" is exact. After the personal policy no column of any table
holds the pruned person (the raw SQL search of the erasure tests), the audit log verifies, and
the pages render the lead as "erased person".
"""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from audit.models import Event, EventType
from audit.verify import audit_verify
from leads import privacy
from leads.models import Lead, LeadStatus, PersonKey, RefusedPayload
from routing.decisions import clear_live_config_cache
from routing.delivery.models import Delivery, WebhookEndpoint
from routing.monitoring.models import Alert, AlertKind, AlertStatus
from routing.monitoring.unassigned import unassigned_retry
from routing.retention import services as retention
from routing.retention.services import retention_apply, retention_scheduled, retention_totals
from routing.rules_io import rules_import
from routing.services import lead_process
from tests.audit.test_pages import manager
from tests.leads.factories import LeadFactory, SourceFactory
from tests.routing.monitoring.test_metrics import scrape
from tests.routing.test_erasure import _found_anywhere
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db

NOW = timezone.now().replace(microsecond=0)
OLD = NOW - timedelta(days=400)
RECENT = NOW - timedelta(days=10)


@pytest.fixture(autouse=True)
def _clean(settings: Any) -> Any:
    settings.RETENTION_RAW_PAYLOAD_DAYS = 0
    settings.RETENTION_UNROUTED_DAYS = 0
    settings.RETENTION_PERSONAL_DAYS = 0
    settings.RETENTION_KEY_GRACE_SECONDS = 3600
    privacy.cache_clear()
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    yield
    clear_live_config_cache()
    privacy.cache_clear()


def _routed(email: str, *, at: Any, source: Any = None, **payload: Any) -> Lead:
    extra = {"source": source} if source is not None else {}
    lead = LeadFactory(
        raw_payload={"email": email, "first_name": "Wilhelmina", "phone": "+4930555999", **payload},
        received_at=at,
        **extra,
    )
    lead_process(lead_id=lead.id)
    lead.refresh_from_db()
    assert lead.status == LeadStatus.ASSIGNED
    return lead


def test_personal_period_prunes_old_leads_and_nothing_else(client: Client, settings: Any) -> None:
    settings.RETENTION_PERSONAL_DAYS = 365
    WebhookEndpoint.objects.create(name="CRM hook", url="https://hooks.example.com/in")
    old = _routed("old.person@retention.example", at=OLD, last_name="Oldfellow")
    recent = _routed("recent.person@retention.example", at=RECENT)
    assert Delivery.objects.filter(assignment__lead=old).exists()
    old_key = old.person_key_id
    assert old_key is not None

    result = retention_apply(now=NOW)
    assert result.complete
    assert result.counts["personal_leads"] == 1
    assert result.counts["keys_retired"] == 1

    old.refresh_from_db()
    recent.refresh_from_db()
    assert old.first_name == privacy.ERASED
    assert old.email == ""
    assert old.phone == ""
    assert old.raw_payload == retention.PRUNED_PAYLOAD
    assert old.personal_pruned_at == NOW
    assert old.raw_pruned_at == NOW
    assert recent.email == "recent.person@retention.example"
    assert recent.raw_payload["email"] == "recent.person@retention.example"
    # The decision stays.
    assignment = old.assignments.get()
    assert assignment.rule_name == "Everyone"
    pruned = Event.objects.get(chain=str(old.pk), type=EventType.PRUNED)
    assert pruned.data["policy"] == "personal"
    assert pruned.data["days"] == 365
    assert "Oldfellow" not in str(pruned.data)
    for needle in ("old.person@retention.example", "Oldfellow", "+4930555999"):
        hits = [hit for hit in _found_anywhere(needle) if "recent" not in hit]
        # The recent lead is someone else with the same phone: only its rows may hold it.
        if needle == "+4930555999":
            assert all(not hit.startswith("audit_") for hit in hits)
            continue
        assert hits == [], needle

    # The key is retired (no lookup: a new lead of the person gets a new key) and destroyed
    # only after the grace period; the sealed events then read "erased person".
    key = PersonKey.objects.get(pk=old_key)
    assert key.lookup is None
    assert key.retired_at == NOW
    assert key.wrapped
    assert retention_apply(now=NOW + timedelta(minutes=30)).counts["keys_destroyed"] == 0
    later = retention_apply(now=NOW + timedelta(hours=2))
    assert later.counts["keys_destroyed"] == 1
    assert later.counts["personal_leads"] == 0  # nothing pruned twice
    key.refresh_from_db()
    assert key.wrapped is None
    assert key.erased_at is not None
    privacy.cache_clear()
    assigned = Event.objects.get(chain=str(old.pk), type=EventType.ASSIGNED)
    assert assigned.trace == [{"rule": None, "matched": False, "why": privacy.ERASED}]
    assert Event.objects.filter(chain=str(old.pk), type=EventType.PRUNED).count() == 1
    report = audit_verify()
    assert report.ok, report.findings

    user = manager("mia")
    user.user_permissions.add(Permission.objects.get(codename="view_lead"))
    client.force_login(user)
    page = client.get(f"/history/{old.pk}/").content.decode()
    assert privacy.ERASED in page
    assert "Personal data pruned (retention)" in page
    assert client.get("/history/").status_code == 200
    assert client.get("/dashboard/").status_code == 200


def test_a_person_with_a_lead_still_in_its_period_keeps_their_key(settings: Any) -> None:
    settings.RETENTION_PERSONAL_DAYS = 365
    old = _routed("same.person@retention.example", at=OLD)
    recent = _routed("same.person@retention.example", at=RECENT)
    assert old.person_key_id == recent.person_key_id
    result = retention_apply(now=NOW + timedelta(days=1))
    assert result.counts["personal_leads"] == 1
    assert result.counts["keys_retired"] == 0
    key = PersonKey.objects.get(pk=recent.person_key_id)
    assert key.wrapped
    assert key.lookup
    assert key.retired_at is None
    privacy.cache_clear()
    event = Event.objects.get(chain=str(recent.pk), type=EventType.ASSIGNED)
    assert event.trace
    assert event.trace[0].get("why") != privacy.ERASED


def test_a_key_taken_by_a_new_lead_during_the_grace_period_stays(settings: Any) -> None:
    settings.RETENTION_PERSONAL_DAYS = 365
    old = _routed("racing.person@retention.example", at=OLD)
    retention_apply(now=NOW)
    key = PersonKey.objects.get(pk=old.person_key_id)
    assert key.retired_at == NOW
    # A worker that looked the key up just before it was retired commits its lead with it.
    newcomer = LeadFactory(raw_payload={"email": "racing.person@retention.example"})
    Lead.objects.filter(pk=newcomer.pk).update(person_key_id=key.pk)
    result = retention_apply(now=NOW + timedelta(hours=2))
    assert result.counts["keys_destroyed"] == 0
    key.refresh_from_db()
    assert key.wrapped
    assert key.retired_at is None
    # The person's next lead gets a key of its own (the retired one has no lookup any more).
    assert privacy.person_key_for(email="racing.person@retention.example") != key.pk


def test_unrouted_period_takes_only_leads_that_never_got_an_owner(settings: Any) -> None:
    settings.RETENTION_UNROUTED_DAYS = 90
    owned = _routed("owned@retention.example", at=OLD)
    left = _routed("left@retention.example", at=OLD)
    excluded = _routed("excluded@retention.example", at=OLD)
    young = _routed("young@retention.example", at=RECENT)
    Lead.objects.filter(pk__in=[left.pk, young.pk]).update(
        status=LeadStatus.UNASSIGNED, unassigned_retry_at=NOW - timedelta(hours=1)
    )
    Lead.objects.filter(pk=excluded.pk).update(status=LeadStatus.EXCLUDED)
    result = retention_apply(now=NOW)
    assert result.counts["unrouted_leads"] == 2
    by_id = {lead.pk: lead for lead in Lead.objects.all()}
    assert by_id[owned.pk].email == "owned@retention.example"
    assert by_id[young.pk].email == "young@retention.example"
    assert by_id[left.pk].email == ""
    assert by_id[left.pk].unassigned_retry_at is None
    assert by_id[excluded.pk].first_name == privacy.ERASED
    # A pruned unassigned lead has nothing to route on: the retries leave it alone.
    Lead.objects.filter(pk=young.pk).update(unassigned_retry_at=NOW + timedelta(days=1))
    assert unassigned_retry(now=NOW) == 0


def test_raw_payload_period_per_source_and_the_refused_inbox(settings: Any) -> None:
    short = SourceFactory(slug="webinar-tool", retention_raw_payload_days=30)
    kept = SourceFactory(slug="website")
    a = _routed("a@retention.example", at=NOW - timedelta(days=31), source=short)
    b = _routed("b@retention.example", at=NOW - timedelta(days=29), source=short)
    c = _routed("c@retention.example", at=OLD, source=kept)
    waiting = LeadFactory(source=short, received_at=OLD, raw_payload={"email": "w@x.example"})
    old_refused = RefusedPayload.objects.create(
        source=short,
        body=b'{"mail": 1}',
        status_code=422,
        reason="not_a_lead",
        received_at=NOW - timedelta(days=40),
    )
    new_refused = RefusedPayload.objects.create(
        source=short, body=b'{"mail": 2}', status_code=422, reason="not_a_lead"
    )
    result = retention_apply(now=NOW)
    assert result.counts["raw_payloads"] == 1
    assert result.counts["refused_payloads"] == 1
    a.refresh_from_db()
    assert a.raw_payload == retention.PRUNED_PAYLOAD
    assert a.raw_pruned_at == NOW
    assert a.email == "a@retention.example"  # the canonical fields stay
    assert a.personal_pruned_at is None
    for lead in (b, c, waiting):
        lead.refresh_from_db()
        assert lead.raw_pruned_at is None
        assert "email" in lead.raw_payload
    assert not RefusedPayload.objects.filter(pk=old_refused.pk).exists()
    assert RefusedPayload.objects.filter(pk=new_refused.pk).exists()
    # The global setting covers the other source; the source's own wins for its leads.
    settings.RETENTION_RAW_PAYLOAD_DAYS = 365
    assert retention_apply(now=NOW).counts["raw_payloads"] == 1
    c.refresh_from_db()
    assert c.raw_pruned_at == NOW
    b.refresh_from_db()
    assert b.raw_pruned_at is None


def _crash_on_pruning(chain: str) -> None:
    """The database refuses the `pruned` event of ``chain``: the job fails inside its second
    batch, as on a lost connection or a killed statement (a real fault, not a stand-in)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION test_retention_crash() RETURNS trigger AS $$ BEGIN "
                "RAISE EXCEPTION 'worker killed'; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(
                "CREATE TRIGGER test_retention_crash BEFORE INSERT ON audit_event FOR EACH ROW "
                f"WHEN (NEW.type = 'pruned' AND NEW.chain = '{chain}') "
                "EXECUTE FUNCTION test_retention_crash()"
            )
        else:
            cursor.execute(
                "CREATE TRIGGER test_retention_crash BEFORE INSERT ON audit_event "
                f"WHEN NEW.type = 'pruned' AND NEW.chain = '{chain}' "
                "BEGIN SELECT RAISE(ABORT, 'worker killed'); END"
            )


def _crash_mended() -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("DROP TRIGGER test_retention_crash ON audit_event")
            cursor.execute("DROP FUNCTION test_retention_crash()")
        else:
            cursor.execute("DROP TRIGGER test_retention_crash")


def test_a_run_that_crashes_half_way_resumes_without_pruning_more_or_less(settings: Any) -> None:
    settings.RETENTION_PERSONAL_DAYS = 365
    settings.RETENTION_BATCH_SIZE = 2
    source = SourceFactory(slug="crashing")
    leads = [
        _routed(f"crash{n}@retention.example", at=OLD + timedelta(minutes=n), source=source)
        for n in range(5)
    ]
    recent = _routed("crash.recent@retention.example", at=RECENT, source=source)
    _crash_on_pruning(str(leads[3].pk))  # the second lead of the second batch
    assert retention_scheduled(now=NOW) is None
    alert = Alert.objects.get(kind=AlertKind.RETENTION, status=AlertStatus.OPEN)
    assert "worker killed" in alert.message
    # The first batch (2 leads) committed; the second rolled back whole.
    pruned = set(Lead.objects.filter(personal_pruned_at__isnull=False).values_list("pk", flat=True))
    assert pruned == {leads[0].pk, leads[1].pk}
    assert Event.objects.filter(type=EventType.PRUNED).count() == 2
    assert Lead.objects.get(pk=leads[2].pk).email == "crash2@retention.example"
    assert retention_totals()["pruned"]["personal_leads"] == 2

    _crash_mended()
    result = retention_scheduled(now=NOW)
    assert result is not None
    assert result.counts["personal_leads"] == 3
    assert not Alert.objects.filter(kind=AlertKind.RETENTION, status=AlertStatus.OPEN).exists()
    pruned = set(Lead.objects.filter(personal_pruned_at__isnull=False).values_list("pk", flat=True))
    assert pruned == {lead.pk for lead in leads}
    assert recent.pk not in pruned
    for lead in leads:
        assert Event.objects.filter(chain=str(lead.pk), type=EventType.PRUNED).count() == 1
    assert retention_totals()["pruned"]["personal_leads"] == 5
    assert retention_totals()["last_success_at"] == NOW.isoformat()


@pytest.fixture
def _small_batches(settings: Any) -> None:
    settings.RETENTION_BATCH_SIZE = 2


@pytest.mark.usefixtures("_small_batches")
def test_a_run_stops_at_its_time_budget_and_the_next_goes_on(settings: Any) -> None:
    settings.RETENTION_PERSONAL_DAYS = 365
    for n in range(3):
        _routed(f"budget{n}@retention.example", at=OLD)
    stopped = retention_apply(now=NOW, max_seconds=0)
    assert not stopped.complete
    assert stopped.total == 0
    assert "next run" in stopped.sentence()
    done = retention_apply(now=NOW)
    assert done.complete
    assert done.counts["personal_leads"] == 3


def test_metrics_count_what_was_pruned(client: Client, settings: Any) -> None:
    from routing.monitoring.metrics import COLLECTOR

    settings.METRICS_TOKEN = "t0ken"
    settings.RETENTION_PERSONAL_DAYS = 365
    _routed("metrics@retention.example", at=OLD)
    retention_scheduled(now=NOW)
    COLLECTOR.clear()
    found = scrape(client, HTTP_AUTHORIZATION="Bearer t0ken")
    assert found[("leadrouter_retention_pruned_total", (("what", "personal_leads"),))] == 1
    assert found[("leadrouter_retention_pruned_total", (("what", "keys_retired"),))] == 1
    assert found[("leadrouter_retention_last_success_timestamp_seconds", ())] == NOW.timestamp()


def test_the_command_shows_periods_and_counts_a_dry_run(settings: Any) -> None:
    settings.RETENTION_PERSONAL_DAYS = 365
    lead = _routed("dry@retention.example", at=OLD)
    out = StringIO()
    call_command("retention_apply", "--dry-run", stdout=out)
    assert "personal 365 d" in out.getvalue()
    assert "personal 1 lead(s)" in out.getvalue()
    lead.refresh_from_db()
    assert lead.email == "dry@retention.example"
    out = StringIO()
    call_command("retention_apply", stdout=out)
    assert "1 personal leads" in out.getvalue()


@pytest.mark.postgres
def test_personal_period_on_postgresql(client: Client, settings: Any) -> None:
    test_personal_period_prunes_old_leads_and_nothing_else(client, settings)


@pytest.mark.postgres
def test_crash_and_resume_on_postgresql(settings: Any) -> None:
    test_a_run_that_crashes_half_way_resumes_without_pruning_more_or_less(settings)


def test_a_lead_erased_before_is_not_pruned_or_counted_again(settings: Any) -> None:
    """Review of issue 21: retention re-pruned erased leads and counted them in /metrics."""
    from routing.erasure import person_erase

    settings.RETENTION_PERSONAL_DAYS = 365
    settings.RETENTION_RAW_PAYLOAD_DAYS = 30
    _routed("gone@retention.example", at=OLD)
    person_erase(email="gone@retention.example", actor="user:dpo", reason="request")
    result = retention_apply(now=NOW)
    assert result.counts["personal_leads"] == 0
    assert result.counts["raw_payloads"] == 0
