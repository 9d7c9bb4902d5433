"""Deleting a routing table's row in the admin is gated by the saved test cases like any live
edit, and offers the same way through: a "Delete even though saved test cases fail" box on the
delete page and on the list's bulk delete confirmation; a forced delete is a version naming the
failing cases and who forced it."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from routing.drafts.models import ConfigSnapshot
from routing.models import RoutingTestCase, RuleSet, Team, Territory
from tests.routing.factories import published_ruleset

pytestmark = pytest.mark.django_db

CASE = "A German lead goes to EMEA SDR"
BOX = 'name="_force_failing_test_cases"'


@pytest.fixture
def germany(emea: Team) -> Territory:
    territory = Territory.objects.create(name="Germany", countries=["DE"], team=emea)
    published_ruleset({"name": "By territory", "action": {"type": "territory"}})
    RoutingTestCase.objects.create(
        name=CASE,
        lead={"email": "x@acme.com", "country": "DE"},
        expected_status="assigned",
        expected_team=emea,
    )
    return territory


def _messages(response: Any) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def test_a_delete_that_fails_a_case_is_refused_and_the_delete_page_offers_to_force_it(
    client_revops: Client, germany: Territory
) -> None:
    url = reverse("admin:routing_territory_delete", args=[germany.pk])
    page = client_revops.get(url)
    assert BOX in page.content.decode()
    assert "Delete even though saved test cases fail" in page.content.decode()
    refused = client_revops.post(url, {"post": "yes"}, follow=True)
    (message,) = [m for m in _messages(refused) if m.startswith("Not saved")]
    assert CASE in message
    assert '"Delete even though saved test cases fail" on the delete page' in message
    assert Territory.objects.filter(pk=germany.pk).exists()
    before = ConfigSnapshot.objects.count()

    forced = client_revops.post(url, {"post": "yes", "_force_failing_test_cases": "1"})
    assert forced.status_code == 302
    assert not Territory.objects.filter(pk=germany.pk).exists()
    version = ConfigSnapshot.objects.order_by("-number").first()
    assert ConfigSnapshot.objects.count() > before
    assert version.failing_test_cases == [CASE]
    assert version.published_by == "user:rita"


def test_the_bulk_delete_confirmation_offers_to_force_it_too(
    client_revops: Client, germany: Territory
) -> None:
    url = reverse("admin:routing_territory_changelist")
    chosen = {"action": "delete_selected", "_selected_action": [germany.pk]}
    confirm = client_revops.post(url, chosen)
    assert confirm.status_code == 200
    assert BOX in confirm.content.decode()
    client_revops.post(url, {**chosen, "post": "yes"})
    assert Territory.objects.filter(pk=germany.pk).exists()  # refused: the case fails
    client_revops.post(url, {**chosen, "post": "yes", "_force_failing_test_cases": "1"})
    assert not Territory.objects.filter(pk=germany.pk).exists()
    assert ConfigSnapshot.objects.order_by("-number").first().failing_test_cases == [CASE]


def test_the_test_cases_delete_page_has_no_box(client_revops: Client, germany: Territory) -> None:
    case = RoutingTestCase.objects.get()
    page = client_revops.get(reverse("admin:routing_routingtestcase_delete", args=[case.pk]))
    assert BOX not in page.content.decode()


def test_a_delete_the_cases_pass_after_needs_no_box(
    client_revops: Client, live: RuleSet, emea: Team
) -> None:
    other = Territory.objects.create(name="France", countries=["FR"], team=emea)
    url = reverse("admin:routing_territory_delete", args=[other.pk])
    assert client_revops.post(url, {"post": "yes"}).status_code == 302
    assert not Territory.objects.filter(pk=other.pk).exists()
