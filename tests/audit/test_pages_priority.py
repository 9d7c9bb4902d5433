"""The history page filters by priority and tag and shows them; the lead page shows them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from leads.models import Lead
from leads.services import lead_tags_set
from tests.audit.test_pages import lead_ids, logged_in, manager
from tests.leads.factories import LeadFactory

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def _lead(n: int, priority: str, tags: list[str]) -> Lead:
    lead: Lead = LeadFactory(email=f"p{n}@acme.example", received_at=T0 + timedelta(hours=n))
    lead_tags_set(lead=lead, priority=priority, tags=tags)
    return lead


def test_history_filters_by_priority_and_tag_and_shows_them(client: Client) -> None:
    logged_in(client, manager())
    hot = _lead(1, "hot", ["enterprise", "webinar"])
    warm = _lead(2, "warm", ["webinar"])
    plain = _lead(3, "", [])

    def ids(query: str) -> set[str]:
        response = client.get(f"/history/?{query}")
        assert response.status_code == 200
        return set(lead_ids(response))

    assert ids("priority=hot") == {str(hot.pk)}
    assert ids("priority=none") == {str(plain.pk)}
    assert ids("tag=webinar") == {str(hot.pk), str(warm.pk)}
    assert ids("tag=webinar&priority=warm") == {str(warm.pk)}
    assert ids("tag=") == {str(hot.pk), str(warm.pk), str(plain.pk)}
    assert ids("tag=%00&priority=%ff") <= {str(hot.pk), str(warm.pk), str(plain.pk)}
    page = client.get("/history/?tag=enterprise").content.decode()
    assert '<span class="priority" data-priority="hot">hot</span>' in page
    assert '<span class="tag">webinar</span>' in page
    assert ">Priority:</label>" in page
    assert ">Tag:</label>" in page


def test_the_lead_page_shows_priority_and_tags(client: Client) -> None:
    logged_in(client, manager())
    hot = _lead(1, "hot", ["enterprise"])
    page = client.get(f"/history/{hot.pk}/").content.decode()
    assert 'id="lead-priority"' in page
    assert ">hot</span>" in page
    assert ">enterprise</span>" in page
    plain = _lead(2, "", [])
    assert 'id="lead-priority"' not in client.get(f"/history/{plain.pk}/").content.decode()
