"""Pages open personal data with a batched person-key lookup (issue 21).

Each sealed event was opened with its own query on the person keys, so a page of N leads (or N
events of N people) cost N key queries. Events are now opened a chunk at a time with one
``person_fernets`` lookup: the count does not grow with the rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token

from audit.models import Event, EventType
from audit.services import event_record
from leads import privacy
from leads.models import Lead, LeadStatus
from tests.audit.test_pages import manager
from tests.audit.test_rep_page import _rep_login
from tests.leads.factories import LeadFactory
from tests.routing.factories import AssignmentFactory, RepFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _cold_cache() -> Any:
    privacy.cache_clear()
    yield
    privacy.cache_clear()


def _people(count: int, start: int, rep: Any) -> list[Lead]:
    leads = []
    for n in range(start, start + count):
        email = f"person{n}@keys.example"
        lead = LeadFactory(raw_payload={"email": email}, email=email, status=LeadStatus.ASSIGNED)
        lead.person_key_id = privacy.person_key_for(email=email)
        lead.save(update_fields=["person_key"])
        AssignmentFactory(lead=lead, rep=rep, rule_name="R")
        for what in ("first", "second"):
            event_record(type=EventType.CRM_CHECKED, lead=lead, data={"summary": f"{what} {email}"})
        leads.append(lead)
    return leads


def _key_reads(get: Callable[[], Any]) -> int:
    privacy.cache_clear()
    with CaptureQueriesContext(connection) as queries:
        response = get()
    assert response.status_code == 200, response.content[:500]
    return sum('"leads_personkey"' in q["sql"] for q in queries.captured_queries)


def test_sealed_events_of_many_people_are_opened_with_one_key_query() -> None:
    rep = RepFactory()
    _people(2, 0, rep)
    privacy.cache_clear()
    with CaptureQueriesContext(connection) as few:
        events = list(Event.objects.filter(type=EventType.CRM_CHECKED))
    _people(5, 2, rep)
    privacy.cache_clear()
    with CaptureQueriesContext(connection) as many:
        events = list(Event.objects.filter(type=EventType.CRM_CHECKED))
    assert len(events) == 14
    assert all(e.data["summary"].endswith("@keys.example") for e in events)  # opened
    assert all(e.erased is False for e in events)
    assert len(many) == len(few) == 2  # the events, and one query for all their keys


@pytest.mark.parametrize("page", ["api_list", "history", "dashboard", "lead_page", "rep_page"])
def test_a_page_costs_the_same_key_queries_for_two_leads_as_for_seven(
    client: Client, page: str
) -> None:
    rep = RepFactory(name="Ana", email="ana@example.com")
    user = manager("mia")
    user.user_permissions.add(Permission.objects.get(codename="view_lead"))
    token = Token.objects.create(user=user).key
    rep_client = _rep_login(rep, "ana")
    client.force_login(user)
    leads = _people(2, 0, rep)
    gets: dict[str, Callable[[], Any]] = {
        "api_list": lambda: client.get("/api/v1/leads/", HTTP_AUTHORIZATION=f"Token {token}"),
        "history": lambda: client.get("/history/"),
        "dashboard": lambda: client.get("/dashboard/"),
        "lead_page": lambda: client.get(f"/history/{leads[0].pk}/"),
        "rep_page": lambda: rep_client.get("/me/"),
    }
    few = _key_reads(gets[page])
    _people(5, 2, rep)
    many = _key_reads(gets[page])
    assert many == few <= 1
