"""The priority and tags of a lead reach its webhook payload and the rep's e-mail."""

from __future__ import annotations

from typing import Any

import pytest

from leads.services import lead_tags_set
from routing.delivery import services
from routing.delivery.models import DeliveryChannel
from routing.models import Assignment


@pytest.mark.django_db
def test_payload_and_email_name_the_priority_and_tags(
    assignment: Assignment, published: list[int]
) -> None:
    lead_tags_set(lead=assignment.lead, priority="hot", tags=["enterprise", "webinar"])
    Assignment.objects.filter(pk=assignment.pk).update(priority="hot", tags=["enterprise"])
    assignment.refresh_from_db()

    rows = services.deliveries_schedule(assignment=assignment)

    email = next(row for row in rows if row.channel == DeliveryChannel.EMAIL)
    data: dict[str, Any] = email.payload["data"]
    assert (data["lead"]["priority"], data["lead"]["tags"]) == ("hot", ["enterprise", "webinar"])
    assert (data["assignment"]["priority"], data["assignment"]["tags"]) == ("hot", ["enterprise"])
    subject, body = services.email_message(email.payload)
    assert subject.startswith("[hot] New lead assigned to you: Ada Lovelace")
    assert "Priority:  hot" in body
    assert "Tags:      enterprise" in body


@pytest.mark.django_db
def test_a_lead_without_priority_says_so_plainly(
    assignment: Assignment, published: list[int]
) -> None:
    rows = services.deliveries_schedule(assignment=assignment)
    email = next(row for row in rows if row.channel == DeliveryChannel.EMAIL)
    assert email.payload["data"]["assignment"]["priority"] is None
    assert email.payload["data"]["assignment"]["tags"] == []
    subject, body = services.email_message(email.payload)
    assert subject.startswith("New lead assigned to you")
    assert "Priority:  —" in body


def test_only_high_priority_messages_go_first() -> None:
    assert services.message_priority(True) < services.message_priority(False)
