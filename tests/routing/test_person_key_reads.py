"""A routed lead reads its person's key once (issue 21: "one cached read, not a query per field").

It read it twice: the lookup found the key's id, and sealing the first event read the wrapped key
again by id (a new person: looked up, inserted, then read back). The lookup now brings the
wrapped key and caches it; a key just created is cached as it is made (on PostgreSQL at once; on
SQLite, which reuses a rolled-back row's id, once committed).
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from leads import privacy
from leads.models import LeadStatus
from routing.rules_io import rules_import
from routing.services import lead_process
from tests.leads.factories import LeadFactory
from tests.routing.test_erasure import _rules  # noqa: F401 (autouse fixture)
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db


def _key_statements(email: str) -> tuple[int, int]:
    """(reads, writes) of the person key table while one lead of ``email`` is routed."""
    lead = LeadFactory(raw_payload={"email": email, "first_name": "Kira", "company": "Keys"})
    with CaptureQueriesContext(connection) as queries:
        assert lead_process(lead_id=lead.id) in (LeadStatus.ASSIGNED, LeadStatus.DUPLICATE)
    on_keys = [q["sql"] for q in queries.captured_queries if '"leads_personkey"' in q["sql"]]
    reads = sum(sql.lstrip().upper().startswith("SELECT") for sql in on_keys)
    return reads, len(on_keys) - reads


def test_a_returning_person_costs_one_key_read_per_lead_with_a_cold_cache() -> None:
    rules_import(RULES, publish=True)
    _key_statements("kira.returning@keys.example")
    privacy.cache_clear()  # as in another process, or after PRIVACY_KEY_CACHE_SECONDS
    assert _key_statements("kira.returning@keys.example") == (1, 0)
    assert _key_statements("kira.returning@keys.example") == (1, 0)


@pytest.mark.postgres
def test_a_new_person_costs_one_key_read_and_one_insert_on_postgresql() -> None:
    rules_import(RULES, publish=True)
    privacy.cache_clear()
    assert _key_statements("kira.new@keys.example") == (1, 1)
