"""A live edit in the admin is gated by the saved test cases like a publish (issue 19): a save
after which a saved test case fails is refused with the failing cases named, nothing saved and
no version; ticking "Save even though saved test cases fail" saves it as a version that names
the cases, audited with who forced it."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from audit.models import Event, EventType
from routing.drafts.models import ConfigSnapshot
from routing.models import RoutingTestCase, RuleSet, Team, TeamMembership
from tests.routing.admin.test_config_audit import _form_data

pytestmark = pytest.mark.django_db

CASE = "A German lead goes to EMEA SDR"


@pytest.fixture
def case(live: RuleSet, emea: Team) -> RoutingTestCase:
    return RoutingTestCase.objects.create(
        name=CASE,
        lead={"email": "x@acme.com", "country": "DE"},
        expected_status="assigned",
        expected_team=emea,
    )


def _without_members(client: Client, url: str, **more: Any) -> dict[str, Any]:
    data = _form_data(client, url, **more)
    for key in [key for key in data if key.endswith("-rep")]:
        data[key.removesuffix("-rep") + "-DELETE"] = "on"  # every membership removed
    return data


def _messages(response: Any) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def test_a_save_that_makes_a_saved_test_case_fail_is_refused(
    client_revops: Client, case: RoutingTestCase, emea: Team
) -> None:
    url = reverse("admin:routing_team_change", args=[emea.pk])
    page = client_revops.get(url)
    assert b'name="_force_failing_test_cases"' in page.content  # the box is offered
    response = client_revops.post(url, _without_members(client_revops, url), follow=True)
    assert response.status_code == 200
    (message,) = [m for m in _messages(response) if m.startswith("Not saved")]
    assert CASE in message
    assert "team is —, expected EMEA SDR" in message or "status is" in message
    assert TeamMembership.objects.filter(team=emea).count() == 2  # nothing saved
    assert ConfigSnapshot.objects.count() == 0  # no version (the baseline rolled back too)


def test_a_forced_save_is_a_version_naming_the_failing_cases_and_who_forced_it(
    client_revops: Client, case: RoutingTestCase, emea: Team
) -> None:
    url = reverse("admin:routing_team_change", args=[emea.pk])
    data = _without_members(client_revops, url, _force_failing_test_cases="1")
    response = client_revops.post(url, data, follow=True)
    assert response.status_code == 200
    assert TeamMembership.objects.filter(team=emea).count() == 0
    version = ConfigSnapshot.objects.order_by("-number").first()
    assert version is not None
    assert version.number == 2
    assert version.failing_test_cases == [CASE]
    assert version.published_by == "user:rita"
    (event,) = [
        event
        for event in Event.objects.filter(type=EventType.CONFIG_CHANGED)
        if event.data.get("action") == "published"
    ]
    assert event.actor == "user:rita"
    assert event.data["forced"] is True
    assert event.data["failing_test_cases"] == [CASE]
    assert any(CASE in message for message in _messages(response))


def test_a_save_the_cases_still_pass_after_is_saved_as_before(
    client_revops: Client, case: RoutingTestCase, emea: Team
) -> None:
    url = reverse("admin:routing_team_change", args=[emea.pk])
    response = client_revops.post(url, _form_data(client_revops, url, sla_minutes=15))
    assert response.status_code == 302
    assert Team.objects.get(pk=emea.pk).sla_minutes == 15
    assert ConfigSnapshot.objects.order_by("-number").first().failing_test_cases == []


def test_saving_a_test_case_itself_is_not_gated(
    client_revops: Client, case: RoutingTestCase, emea: Team
) -> None:
    """A case saved that fails is a test, not a change of routing: saved (a version)."""
    url = reverse("admin:routing_routingtestcase_change", args=[case.pk])
    french = '{"email": "x@acme.com", "country": "FR"}'  # no rule routes it: the case fails
    response = client_revops.post(url, _form_data(client_revops, url, lead=french))
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert RoutingTestCase.objects.get(pk=case.pk).lead["country"] == "FR"
    assert ConfigSnapshot.objects.order_by("-number").first().failing_test_cases == []


def test_a_csv_import_is_gated_by_the_saved_test_cases_too(client_revops, emea):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from routing.models import Territory
    from tests.routing.factories import make_rep, published_ruleset, team_with

    other = team_with([make_rep(email="cai@x.example", name="Cai")], name="Other")
    Territory.objects.create(name="Germany", countries=["DE"], team=emea)
    published_ruleset({"name": "By territory", "action": {"type": "territory"}})
    RoutingTestCase.objects.create(
        name=CASE,
        lead={"email": "x@acme.com", "country": "DE"},
        expected_status="assigned",
        expected_team=emea,
    )
    url = reverse("admin:routing_territory_import")
    csv = b"territory,country,region,postal_prefix,team,rep\nGermany,DE,,,Other,\n"
    refused = client_revops.post(url, {"file": SimpleUploadedFile("t.csv", csv)})
    assert refused.status_code == 200
    assert f"saved test case {CASE} fails" in refused.content.decode()
    assert Territory.objects.get(name="Germany").team_id == emea.pk  # nothing written
    assert ConfigSnapshot.objects.count() == 0
    forced = client_revops.post(
        url,
        {"file": SimpleUploadedFile("t.csv", csv), "force_failing_test_cases": "on"},
    )
    assert forced.status_code == 302
    assert Territory.objects.get(name="Germany").team_id == other.pk
    version = ConfigSnapshot.objects.order_by("-number").first()
    assert version is not None
    assert version.failing_test_cases == [CASE]
    assert version.published_by == "user:rita"
