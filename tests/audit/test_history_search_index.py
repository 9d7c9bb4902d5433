"""The history search is served by the trigram indexes (PostgreSQL; leads 0006)."""

from __future__ import annotations

import uuid
from typing import cast

import pytest
from django.contrib.auth.models import User
from django.db import connection

from audit.selectors import history_leads
from leads.models import Lead, LeadStatus, Source
from tests.leads.factories import SourceFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

INDEXES = {f"lead_{c}_trgm_idx" for c in ("email", "company", "first_name", "last_name")}


@pytest.fixture
def many_leads() -> None:
    source = cast(Source, SourceFactory())
    leads = [
        Lead(
            source=source,
            status=LeadStatus.ASSIGNED,
            raw_payload={},
            request_fingerprint=uuid.uuid4().hex * 2,
            email=f"person{n}@company{n % 500}.example",
            company=f"Company {n % 500} GmbH",
            first_name=f"First{n}",
            last_name=f"Last{n}",
        )
        for n in range(4000)
    ]
    leads[1234].company = "Zyxwvu Industries"
    leads[2345].email = "someone@zyxwvu.example"
    Lead.objects.bulk_create(leads, batch_size=1000)
    with connection.cursor() as cursor:
        # What autovacuum does in production: move the new rows out of the GIN indexes' pending
        # lists (which the planner costs high), and gather statistics.
        for name in sorted(INDEXES):
            cursor.execute("SELECT gin_clean_pending_list(%s::regclass)", [name])
        cursor.execute("ANALYZE leads_lead")


def _plan(queryset) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # the test's transaction only
    return queryset.explain()


def test_the_indexes_exist_on_exactly_the_searched_expressions():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'leads_lead' "
            "AND indexname LIKE '%%_trgm_idx'"
        )
        found = dict(cursor.fetchall())
    assert set(found) == INDEXES
    for name, definition in found.items():
        column = name.removeprefix("lead_").removesuffix("_trgm_idx")
        assert f"USING gin (upper(({column})::text) gin_trgm_ops)" in definition


def test_the_history_search_uses_the_trigram_indexes(many_leads):
    superuser = User.objects.create_superuser("root", password="pw-root-123")
    _, leads = history_leads(user=superuser, data={"q": "zyxwvu"})
    assert {lead.pk for lead in leads}.__len__() == 2
    plan = _plan(leads.order_by())
    for name in INDEXES:
        assert f"Bitmap Index Scan on {name}" in plan, plan
    assert "Seq Scan on leads_lead" not in plan, plan


def test_the_history_page_query_uses_them_too(many_leads):
    """The page's own query: the keyset page (ORDER BY received_at, LIMIT 51) and the bounded
    count, as ``keyset_page`` builds them."""
    from audit.selectors import COUNT_LIMIT, PAGE_SIZE

    superuser = User.objects.create_superuser("root", password="pw-root-123")
    _, leads = history_leads(user=superuser, data={"q": "zyxwvu"})
    page = _plan(leads.order_by("-received_at", "-id")[: PAGE_SIZE + 1])
    count = _plan(leads.order_by()[: COUNT_LIMIT + 1])
    for plan in (page, count):
        assert "Bitmap Index Scan on lead_company_trgm_idx" in plan, plan
        assert "Bitmap Index Scan on lead_email_trgm_idx" in plan, plan
