"""The lead API's priority and tags: in the document, ?priority=, ?tag= and ?ordering=."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.utils import timezone
from rest_framework.authtoken.models import Token

from leads.models import Lead
from leads.selectors import LeadFilter, lead_list
from leads.services import lead_tags_set
from tests.leads.factories import LeadFactory
from tests.routing.factories import AssignmentFactory, make_rep

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(client: Any, db: None) -> Any:
    user = User.objects.create_user("manager", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="view_lead"))
    token = Token.objects.create(user=user)
    client.defaults["HTTP_AUTHORIZATION"] = f"Token {token.key}"
    return client


def _lead(email: str, minutes_ago: int, priority: str = "", tags: tuple[str, ...] = ()) -> Lead:
    lead: Lead = LeadFactory(
        email=email, received_at=timezone.now() - timedelta(minutes=minutes_ago)
    )
    lead_tags_set(lead=lead, priority=priority, tags=list(tags))
    return lead


@pytest.fixture
def leads(db: None) -> dict[str, Lead]:
    return {
        "old_hot": _lead("old-hot@x.example", 50, "hot", ("enterprise",)),
        "new_hot": _lead("new-hot@x.example", 10, "HOT", ("enterprise", "webinar")),
        "normal": _lead("normal@x.example", 20, "normal", ("webinar",)),
        "plain": _lead("plain@x.example", 5),
        "low": _lead("low@x.example", 30, "low"),
    }


def _emails(response: Any) -> list[str]:
    assert response.status_code == 200, response.content
    return [doc["fields"]["email"] for doc in response.json()["results"]]


def test_the_document_shows_priority_and_tags_on_the_lead_and_its_assignment(api: Any) -> None:
    lead = _lead("ana@x.example", 1, "hot", ("enterprise", "webinar"))
    rep = make_rep(email="rita@x.example")
    AssignmentFactory(lead=lead, rep=rep, priority="hot", tags=["enterprise", "webinar"])
    doc = api.get(f"/api/v1/leads/{lead.pk}/").json()
    assert (doc["priority"], doc["tags"]) == ("hot", ["enterprise", "webinar"])
    assert (doc["assignment"]["priority"], doc["assignment"]["tags"]) == (
        "hot",
        ["enterprise", "webinar"],
    )
    plain = _lead("bo@x.example", 1)
    doc = api.get(f"/api/v1/leads/{plain.pk}/").json()
    assert (doc["priority"], doc["tags"]) == (None, [])


def test_priority_filter_is_exact_and_none_finds_leads_without_one(
    api: Any, leads: dict[str, Lead]
) -> None:
    assert _emails(api.get("/api/v1/leads/?priority=hot")) == ["old-hot@x.example"]
    assert _emails(api.get("/api/v1/leads/?priority=none")) == ["plain@x.example"]
    assert _emails(api.get("/api/v1/leads/?priority=nothing-like-it")) == []


def test_tag_filter_and_it_combines_with_priority(api: Any, leads: dict[str, Lead]) -> None:
    assert _emails(api.get("/api/v1/leads/?tag=webinar")) == [
        "new-hot@x.example",
        "normal@x.example",
    ]
    assert _emails(api.get("/api/v1/leads/?tag=webinar&priority=normal")) == ["normal@x.example"]
    assert _emails(api.get("/api/v1/leads/?tag=nope")) == []


def test_ordering_by_priority_puts_high_priorities_first_in_any_case(
    api: Any, leads: dict[str, Lead]
) -> None:
    # hot and HOT are both high (HIGH_PRIORITIES), newest first; then other priorities by
    # name; then leads without one.
    assert _emails(api.get("/api/v1/leads/?ordering=priority")) == [
        "new-hot@x.example",
        "old-hot@x.example",
        "low@x.example",
        "normal@x.example",
        "plain@x.example",
    ]
    assert _emails(api.get("/api/v1/leads/?ordering=-priority"))[0] == "plain@x.example"
    assert _emails(api.get("/api/v1/leads/?ordering=received"))[0] == "old-hot@x.example"


@pytest.mark.parametrize(
    "query",
    ["ordering=sideways", "ordering=priority;drop", "ordering=%00", "tag=%00", "priority=%00"],
)
def test_a_crafted_filter_or_ordering_is_a_json_400_or_finds_nothing(
    api: Any, leads: dict[str, Lead], query: str
) -> None:
    response = api.get(f"/api/v1/leads/?{query}")
    assert response.status_code in (200, 400), response.content
    if response.status_code == 400:
        assert response.json()["error"]["code"] == "invalid_filter"
    else:
        assert response.json()["results"] == []


@pytest.mark.postgres
def test_the_tag_and_priority_filters_can_use_their_indexes_on_postgresql(
    leads: dict[str, Lead],
) -> None:
    for params in ({"tag": "webinar"}, {"priority": "hot"}):
        query = LeadFilter(params, queryset=lead_list()).qs
        sql, args = query.query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute(f"EXPLAIN {sql}", args)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        wanted = "lead_tag_idx" if "tag" in params else "lead_priority_idx"
        assert wanted in plan, plan
