"""The pages sales managers use: login, history (filters, sorting, keyset pages, CSV), a lead
(decision in words, timeline, actions), the dashboard, permissions and team scoping."""

from __future__ import annotations

import csv
import io
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from audit.csv import FORMULA_STARTS, cell_safe, csv_lines
from audit.models import Event, EventType
from audit.permissions import SALES_MANAGERS_GROUP, sales_managers_group_sync
from audit.selectors import keyset_page, leads_visible_to
from audit.services import event_record, event_record_for_assignment
from leads.models import Lead, LeadStatus
from routing.decisions import clear_live_config_cache
from routing.models import Assignment, Rep, Team, TeamMembership
from routing.rules_io import rules_import
from routing.services import lead_process
from tests.leads.factories import LeadFactory, SourceFactory
from tests.routing.factories import AssignmentFactory, RepFactory, TeamFactory
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def rules() -> Any:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    yield
    clear_live_config_cache()


def manager(username: str = "mia", *, group: bool = True) -> User:
    user = User.objects.create_user(username, password=f"pw-{username}-123")
    if group:
        user.groups.add(sales_managers_group_sync())
    return user


def logged_in(client: Client, user: User) -> Client:
    client.force_login(user)
    return client


def routed(email: str) -> Lead:
    lead = LeadFactory(raw_payload={"email": email})
    lead_process(lead_id=lead.id)
    lead.refresh_from_db()
    return lead


def owned(*, rep: Rep, team: Team | None = None, **lead_fields: Any) -> Lead:
    lead = LeadFactory(status=LeadStatus.ASSIGNED, **lead_fields)
    AssignmentFactory(
        lead=lead, rep=rep, team=team, team_name=team.name if team else "", rule_name="R"
    )
    return lead


def lead_ids(response: Any) -> list[str]:
    return [row.id for row in response.context["rows"]]


# --- Login and permissions --------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/", "/history/", "/history/export.csv", "/dashboard/", f"/history/{uuid.uuid4()}/"],
)
def test_every_page_sends_anonymous_users_to_the_login_page(client: Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_actions_need_login_too(client: Client) -> None:
    lead = LeadFactory()
    for action in ("reassign", "touch"):
        response = client.post(f"/history/{lead.pk}/{action}/")
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
    assert not Event.objects.exclude(type=EventType.RECEIVED).exists()


@pytest.mark.parametrize("path", ["/history/", "/history/export.csv", "/dashboard/"])
def test_a_user_without_view_lead_gets_403(client: Client, path: str) -> None:
    logged_in(client, manager("nobody", group=False))
    assert client.get(path).status_code == 403


def test_reassign_and_touch_need_their_own_permissions(client: Client) -> None:
    viewer = manager("viewer", group=False)
    viewer.user_permissions.add(Permission.objects.get(codename="view_lead"))
    logged_in(client, viewer)
    rep = RepFactory()
    lead = owned(rep=rep)
    assert client.get(f"/history/{lead.pk}/").status_code == 200
    page = client.get(f"/history/{lead.pk}/").content.decode()
    assert "reassign-form" not in page
    assert "touch-form" not in page
    other = RepFactory()
    response = client.post(f"/history/{lead.pk}/reassign/", {"rep": other.email, "reason": "try"})
    assert response.status_code == 403
    assert client.post(f"/history/{lead.pk}/touch/").status_code == 403
    assert Assignment.objects.get(lead=lead, active=True).rep == rep


def test_the_sales_managers_group_gets_its_permissions_after_migrate() -> None:
    group = Group.objects.get(name=SALES_MANAGERS_GROUP)  # created by the post_migrate hook
    codenames = set(group.permissions.values_list("codename", flat=True))
    assert {"view_lead", "touch_lead", "reassign_lead"} <= codenames


def test_login_page_logs_in_and_logout_is_a_post(client: Client) -> None:
    manager("mia")
    page = client.get("/accounts/login/?next=/dashboard/")
    assert page.status_code == 200
    assert b'name="username"' in page.content
    response = client.post(
        "/accounts/login/",
        {"username": "mia", "password": "pw-mia-123", "next": "/dashboard/"},
    )
    assert response.status_code == 302
    assert response["Location"] == "/dashboard/"
    assert client.get("/dashboard/").status_code == 200
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/dashboard/").status_code == 302


def test_password_change_page_changes_the_password(client: Client) -> None:
    user = manager("mia")
    logged_in(client, user)
    assert client.get("/accounts/password/").status_code == 200
    response = client.post(
        "/accounts/password/",
        {
            "old_password": "pw-mia-123",
            "new_password1": "a-much-Longer-pass-42",
            "new_password2": "a-much-Longer-pass-42",
        },
    )
    assert response.status_code == 302
    assert response["Location"] == "/accounts/password/done/"
    user.refresh_from_db()
    assert user.check_password("a-much-Longer-pass-42")


# --- History: filters, sorting, pages ---------------------------------------------------------


def test_history_filters_by_status_source_rep_team_rule_text_and_days(client: Client) -> None:
    logged_in(client, manager())
    ana, ben = RepFactory(name="Ana"), RepFactory(name="Ben")
    emea, us = TeamFactory(name="EMEA"), TeamFactory(name="US")
    web = SourceFactory(slug="web")
    a = owned(rep=ana, team=emea, email="a@acme.com", company="Acme", source=web, received_at=T0)
    b = owned(
        rep=ben, team=us, email="b@globex.com", first_name="Zed", received_at=T0 + timedelta(days=1)
    )
    Assignment.objects.filter(lead=b).update(rule_name="By territory")
    waiting = LeadFactory(email="w@initech.com", received_at=T0 + timedelta(days=2))

    def ids(query: str) -> set[str]:
        response = client.get(f"/history/?{query}")
        assert response.status_code == 200
        return set(lead_ids(response))

    everyone = {str(a.pk), str(b.pk), str(waiting.pk)}
    assert ids("") == everyone
    form = client.get("/history/").content.decode()
    assert "invalid name" not in form
    assert ">Owner:</label>" in form
    assert ids("status=received") == {str(waiting.pk)}
    assert ids("source=web") == {str(a.pk)}
    assert ids(f"rep={ben.pk}") == {str(b.pk)}
    assert ids(f"team={emea.pk}") == {str(a.pk)}
    # Not the name of a rule in the rules table: an invalid choice, left out.
    assert ids("rule=By+territory") == everyone
    assert ids("q=ACME") == {str(a.pk)}
    assert ids("q=zed") == {str(b.pk)}
    assert ids("since=2026-11-03") == {str(b.pk), str(waiting.pk)}
    assert ids("until=2026-11-03") == {str(a.pk), str(b.pk)}
    assert ids("since=2026-11-03&until=2026-11-03") == {str(b.pk)}
    # An invalid value is shown as a form error, not a 500 or an empty page.
    response = client.get("/history/?since=yesterday&status=bogus&q=acme")
    assert response.status_code == 200
    assert set(lead_ids(response)) == {str(a.pk)}  # the valid filter still applies
    assert response.context["filter"].form.errors


def test_history_filters_by_the_rule_that_assigned(client: Client, rules: Any) -> None:
    logged_in(client, manager())
    kept = routed("x@acme.com")
    routed("spy@rival.io")  # excluded, no owner
    response = client.get("/history/?rule=Everyone")
    assert lead_ids(response) == [str(kept.pk)]
    row = response.context["rows"][0]
    assert (row.owner, row.team, row.rule) == ("Ana", "EMEA SDR", "Everyone")


def test_sorting_uses_a_whitelist_and_ignores_unknown_columns(client: Client) -> None:
    logged_in(client, manager())
    leads = [
        LeadFactory(email=f"{name}@x.example", received_at=T0 + timedelta(minutes=i))
        for i, name in enumerate(["beta", "alpha", "gamma"])
    ]
    newest_first = [str(lead.pk) for lead in reversed(leads)]
    assert lead_ids(client.get("/history/")) == newest_first
    assert lead_ids(client.get("/history/?sort=received")) == list(reversed(newest_first))
    by_email = lead_ids(client.get("/history/?sort=email"))
    assert by_email == [str(leads[1].pk), str(leads[0].pk), str(leads[2].pk)]
    assert lead_ids(client.get("/history/?sort=-email")) == list(reversed(by_email))
    for unknown in ("company", "password", "-raw_payload", "source__token_hash", "email;drop"):
        response = client.get(f"/history/?sort={unknown}")
        assert response.status_code == 200
        assert lead_ids(response) == newest_first


def test_keyset_pages_walk_forward_and_back_without_gaps_or_repeats(client: Client) -> None:
    logged_in(client, manager())
    # Ties on the sort columns so the id tie-break matters.
    for i in range(57):
        LeadFactory(email=f"c{i % 4}@x.example", received_at=T0 + timedelta(seconds=i % 7))
    for sort in ("", "&sort=email", "&sort=-email", "&sort=received"):
        first = client.get(f"/history/?q={sort}")
        assert first.context["count_label"] == "57"
        seen = lead_ids(first)
        assert len(seen) == 50
        assert first.context["prev_url"] is None
        second = client.get("/history/" + first.context["next_url"])
        rest = lead_ids(second)
        assert len(rest) == 7
        assert second.context["next_url"] is None
        assert len(set(seen + rest)) == 57
        back = client.get("/history/" + second.context["prev_url"])
        assert lead_ids(back) == seen
        assert back.context["prev_url"] is None


def test_keyset_page_going_back_returns_the_previous_page_exactly() -> None:
    for i in range(12):
        LeadFactory(received_at=T0 + timedelta(minutes=i))
    leads = Lead.objects.select_related("source")
    pages = []
    page = keyset_page(leads, column="received_at", descending=True, size=5)
    pages.append([lead.pk for lead in page.leads])
    while page.next_cursor:
        page = keyset_page(
            leads, column="received_at", descending=True, after=page.next_cursor, size=5
        )
        pages.append([lead.pk for lead in page.leads])
    assert [len(p) for p in pages] == [5, 5, 2]
    back = keyset_page(
        leads, column="received_at", descending=True, before=page.prev_cursor, size=5
    )
    assert [lead.pk for lead in back.leads] == pages[1]
    garbage = keyset_page(
        leads, column="received_at", descending=True, after="!!not-base64", size=5
    )
    assert [lead.pk for lead in garbage.leads] == pages[0]


def test_the_count_is_bounded(monkeypatch: pytest.MonkeyPatch, client: Client) -> None:
    monkeypatch.setattr("audit.selectors.COUNT_LIMIT", 3)
    logged_in(client, manager())
    for _ in range(5):
        LeadFactory()
    response = client.get("/history/")
    assert response.context["count_label"] == "3+"
    assert len(lead_ids(response)) == 5


def test_history_list_query_count_does_not_grow_with_rows(client: Client) -> None:
    logged_in(client, manager())
    rep, team = RepFactory(), TeamFactory()
    for _ in range(3):
        owned(rep=rep, team=team)
    with CaptureQueriesContext(connection) as few:
        assert client.get("/history/").status_code == 200
    for _ in range(20):
        owned(rep=rep, team=team)
    with CaptureQueriesContext(connection) as many:
        assert client.get("/history/").status_code == 200
    assert len(many) == len(few)


# --- CSV export -------------------------------------------------------------------------------


def _csv(response: Any) -> list[list[str]]:
    assert response.streaming
    body = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(body)))


def test_export_streams_the_filtered_set_as_an_attachment_with_safe_cells(client: Client) -> None:
    logged_in(client, manager())
    rep = RepFactory(name='=HYPERLINK("http://evil")')
    bad = owned(rep=rep, company="+cmd|' /C calc'!A0", first_name="@SUM(1)", email="x@acme.com")
    LeadFactory(company="Other")
    response = client.get("/history/export.csv?q=acme")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith("attachment; filename=")
    rows = _csv(response)
    assert rows[0][:3] == ["lead id", "received at", "name"]
    assert len(rows) == 2
    row = dict(zip(rows[0], rows[1], strict=True))
    assert row["lead id"] == str(bad.pk)
    assert row["company"] == "'+cmd|' /C calc'!A0"
    assert row["name"] == "'@SUM(1)"
    assert row["owner"] == '\'=HYPERLINK("http://evil")'
    assert row["email"] == "x@acme.com"


def test_the_lead_api_is_scoped_like_the_pages(client: Client, settings: Any) -> None:
    """A scoped manager got another team's lead, found it in the list and reassigned it into
    their own team through the API (the pages alone were scoped)."""
    settings.HISTORY_SCOPE_TO_MANAGED_TEAMS = True
    user = manager()
    user.user_permissions.add(Permission.objects.get(codename="touch_lead"))
    mine, theirs = TeamFactory(manager=user), TeamFactory()
    my_rep, their_rep = RepFactory(), RepFactory()
    TeamMembership.objects.create(team=mine, rep=my_rep, position=0)
    kept = owned(rep=my_rep, team=mine)
    other = owned(rep=their_rep, team=theirs)
    logged_in(client, user)
    assert client.get(f"/api/v1/leads/{other.pk}/").status_code == 404
    listed = client.get("/api/v1/leads/").json()["results"]
    assert [row["id"] for row in listed] == [str(kept.pk)]
    assert client.post(f"/api/v1/leads/{other.pk}/touch/").status_code == 404
    assert client.post(f"/api/v1/leads/{other.pk}/reroute/").status_code in (403, 404)
    reassign = client.post(
        f"/api/v1/leads/{other.pk}/reassign/",
        {"rep": my_rep.email, "reason": "mine now"},
        content_type="application/json",
    )
    assert reassign.status_code == 404
    outside = client.post(
        f"/api/v1/leads/{kept.pk}/reassign/",
        {"rep": their_rep.email, "reason": "theirs"},
        content_type="application/json",
    )
    assert outside.status_code == 403
    assert Assignment.objects.get(lead=other, active=True).rep_id == their_rep.pk


def test_export_is_scoped_and_needs_view_lead(client: Client, settings: Any) -> None:
    settings.HISTORY_SCOPE_TO_MANAGED_TEAMS = True
    user = manager()
    mine, theirs = TeamFactory(manager=user), TeamFactory()
    rep = RepFactory()
    kept = owned(rep=rep, team=mine)
    owned(rep=rep, team=theirs)
    logged_in(client, user)
    rows = _csv(client.get("/history/export.csv"))
    assert [r[0] for r in rows[1:]] == [str(kept.pk)]


@pytest.mark.reliability
@hsettings(max_examples=300, deadline=None)
@given(st.text())
def test_no_exported_cell_starts_a_formula(text: str) -> None:
    cell = cell_safe(text)
    if cell.startswith(FORMULA_STARTS):
        pytest.fail(f"dangerous cell {cell!r}")
    # What a spreadsheet may skip first: any Unicode space, zero-width characters, the BOM.
    trimmed = text
    while trimmed and (trimmed[0].isspace() or trimmed[0] in "\u200b\u200c\u200d\u2060\ufeff"):
        trimmed = trimmed[1:]
    if text.startswith(FORMULA_STARTS) or trimmed.startswith(FORMULA_STARTS):
        assert cell == "'" + text  # also behind leading whitespace, which some apps trim
    else:
        assert cell == text
    # RFC 4180 round trip: what a reader gets back is the cell written.
    written = "".join(csv_lines([[cell, "x"]]))
    assert list(csv.reader(io.StringIO(written, newline="")))[1] == [cell, "x"]


@pytest.mark.reliability
@hsettings(max_examples=200, deadline=None)
@given(st.sampled_from(FORMULA_STARTS), st.text())
def test_every_formula_start_is_prefixed(start: str, rest: str) -> None:
    assert cell_safe(start + rest) == "'" + start + rest


# --- One lead ---------------------------------------------------------------------------------


def test_lead_page_shows_the_decision_in_words_and_the_timeline(client: Client, rules: Any) -> None:
    logged_in(client, manager())
    lead = routed("x@acme.com")
    response = client.get(f"/history/{lead.pk}/")
    assert response.status_code == 200
    detail = response.context["detail"]
    assert detail.decision[0].startswith("Matched rule 'Everyone' (v1): team EMEA SDR")
    assert detail.decision[0].endswith("; assigned to Ana")
    assert [entry.type for entry in detail.timeline] == ["received", "assigned"]
    assert detail.timeline[1].who.startswith("Ana · EMEA SDR")
    assert detail.sla.state in ("open", "none")
    page = response.content.decode()
    assert "Matched rule &#x27;Everyone&#x27; (v1)" in page
    assert "x@acme.com" in page  # the raw payload


def test_an_excluded_lead_reads_as_excluded(client: Client, rules: Any) -> None:
    logged_in(client, manager())
    lead = routed("spy@rival.io")
    detail = client.get(f"/history/{lead.pk}/").context["detail"]
    assert detail.decision == ["Excluded by rule 'Exclude competitors' (v1): competitor"]
    assert any("Exclude competitors: decided" in line for line in detail.trace)


def test_duplicates_are_linked_both_ways(client: Client) -> None:
    logged_in(client, manager())
    original = LeadFactory(email="o@acme.com")
    copy = LeadFactory(email="o@acme.com", duplicate_of=original, status=LeadStatus.DUPLICATE)
    there = client.get(f"/history/{original.pk}/").content.decode()
    back = client.get(f"/history/{copy.pk}/").content.decode()
    assert f"/history/{copy.pk}/" in there
    assert f"/history/{original.pk}/" in back


def test_reassign_through_the_page_records_the_event_with_actor_and_reason(
    client: Client, rules: Any
) -> None:
    logged_in(client, manager())
    lead = routed("x@acme.com")
    response = client.post(
        f"/history/{lead.pk}/reassign/",
        {"rep": "ben@example.com", "reason": "Ana is on leave"},
        follow=True,
    )
    assert response.status_code == 200
    assert "Reassigned to Ben." in [str(m) for m in response.context["messages"]]
    event = Event.objects.filter(lead=lead, type=EventType.REASSIGNED).get()
    assert event.actor == "user:mia"
    assert event.data["reason"] == "Ana is on leave"
    assert event.rep_name == "Ben"
    detail = response.context["detail"]
    assert detail.decision[-1] == "Reassigned by hand by mia from Ana to Ben: Ana is on leave"
    assert Assignment.objects.get(lead=lead, active=True).rep.email == "ben@example.com"


def test_reassign_refusals_are_messages_not_errors(client: Client) -> None:
    logged_in(client, manager())
    waiting = LeadFactory()  # still received: the service refuses
    rep = RepFactory(name="Cai")
    response = client.post(
        f"/history/{waiting.pk}/reassign/", {"rep": rep.email, "reason": "now"}, follow=True
    )
    assert response.status_code == 200
    texts = [str(m) for m in response.context["messages"]]
    assert any("still received" in text for text in texts)
    response = client.post(
        f"/history/{waiting.pk}/reassign/", {"rep": "ghost@example.com", "reason": ""}, follow=True
    )
    assert response.status_code == 200
    assert len(list(response.context["messages"])) == 2  # unknown rep, missing reason
    assert not Event.objects.filter(lead=waiting, type=EventType.REASSIGNED).exists()


def test_mark_first_touch_through_the_page(client: Client, rules: Any) -> None:
    logged_in(client, manager())
    lead = routed("x@acme.com")
    assert "touch-form" in client.get(f"/history/{lead.pk}/").content.decode()
    response = client.post(f"/history/{lead.pk}/touch/", follow=True)
    assert "First touch recorded." in [str(m) for m in response.context["messages"]]
    assert Event.objects.filter(lead=lead, type=EventType.TOUCHED, actor="user:mia").count() == 1
    assert "touch-form" not in response.content.decode()
    unowned = LeadFactory()
    response = client.post(f"/history/{unowned.pk}/touch/", follow=True)
    assert any("no owner" in str(m) for m in response.context["messages"])


def test_a_get_on_an_action_is_refused(client: Client) -> None:
    logged_in(client, manager())
    lead = LeadFactory()
    assert client.get(f"/history/{lead.pk}/touch/").status_code == 405


@pytest.mark.parametrize("lead_id", ["not-a-uuid", str(uuid.uuid4()), "0" * 40, "%00"])
def test_bad_lead_ids_are_404(client: Client, lead_id: str) -> None:
    logged_in(client, manager())
    assert client.get(f"/history/{lead_id}/").status_code == 404
    assert client.post(f"/history/{lead_id}/touch/").status_code == 404
    assert client.post(f"/history/{lead_id}/reassign/", {"reason": "x"}).status_code == 404


def test_lead_page_query_count_is_fixed(client: Client, rules: Any) -> None:
    logged_in(client, manager())
    one = routed("x@acme.com")
    with CaptureQueriesContext(connection) as first:
        client.get(f"/history/{one.pk}/")
    two = routed("y@acme.com")
    client.post(f"/history/{two.pk}/touch/")
    client.post(f"/history/{two.pk}/reassign/", {"rep": "ana@example.com", "reason": "r"})
    LeadFactory(duplicate_of=two, status=LeadStatus.DUPLICATE)
    LeadFactory(duplicate_of=two, status=LeadStatus.DUPLICATE)
    with CaptureQueriesContext(connection) as second:
        client.get(f"/history/{two.pk}/")
    assert len(second) == len(first)


# --- Scoping to managed teams -----------------------------------------------------------------


def test_with_scoping_a_manager_reaches_only_their_teams_leads(
    client: Client, settings: Any
) -> None:
    settings.HISTORY_SCOPE_TO_MANAGED_TEAMS = True
    user = manager()
    mine, theirs = TeamFactory(manager=user), TeamFactory()
    rep, other = RepFactory(), RepFactory()
    mine.members.add(rep, through_defaults={"position": 0})
    theirs.members.add(other, through_defaults={"position": 0})
    kept = owned(rep=rep, team=mine)
    hidden = owned(rep=other, team=theirs)
    waiting = LeadFactory()
    logged_in(client, user)
    listing = client.get("/history/")
    assert lead_ids(listing) == [str(kept.pk)]
    form = listing.context["filter"].form
    assert list(form.fields["team"].queryset) == [mine]
    assert list(form.fields["rep"].queryset) == [rep]
    assert lead_ids(client.get(f"/history/?team={theirs.pk}")) == [str(kept.pk)]  # refused
    assert client.get(f"/history/{kept.pk}/").status_code == 200
    for lead in (hidden, waiting):
        assert client.get(f"/history/{lead.pk}/").status_code == 404
        assert client.post(f"/history/{lead.pk}/touch/").status_code == 404
        response = client.post(
            f"/history/{lead.pk}/reassign/", {"rep": rep.email, "reason": "grab"}
        )
        assert response.status_code == 404
    assert Assignment.objects.get(lead=hidden, active=True).rep == other
    # Only the reps of their teams are offered, and only they are accepted.
    form = client.get(f"/history/{kept.pk}/").context["reassign_form"]
    assert list(form.fields["rep"].queryset) == [rep]
    client.post(f"/history/{kept.pk}/reassign/", {"rep": other.email, "reason": "x"})
    assert Assignment.objects.get(lead=kept, active=True).rep == rep


def test_scoping_spares_revops_and_is_off_by_default(client: Client, settings: Any) -> None:
    rep = RepFactory()
    lead = owned(rep=rep, team=TeamFactory())
    user = manager()
    assert list(leads_visible_to(user)) == [lead]
    settings.HISTORY_SCOPE_TO_MANAGED_TEAMS = True
    assert list(leads_visible_to(user)) == []
    user.user_permissions.add(Permission.objects.get(codename="change_team"))
    user = User.objects.get(pk=user.pk)  # fresh permission cache
    assert list(leads_visible_to(user)) == [lead]


# --- Dashboard --------------------------------------------------------------------------------


def test_dashboard_shows_backlog_rates_percentiles_breaches_and_rep_load(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    logged_in(client, manager())
    now = datetime.now(UTC)
    if now.hour == 0 and now.minute < 10:
        # The leads below were assigned minutes ago: just after midnight UTC, that was
        # yesterday, and "today" on the rep load chart was 0 / 10 (the test failed nightly).
        now += timedelta(minutes=10)
    monkeypatch.setattr("django.utils.timezone.now", lambda: now)
    ana = RepFactory(name="Ana", max_open=2, max_per_day=10)
    RepFactory(name="Idle")
    LeadFactory(received_at=now - timedelta(minutes=30))  # backlog, 30 min old
    LeadFactory(status=LeadStatus.FAILED)
    LeadFactory(status=LeadStatus.UNASSIGNED)
    LeadFactory(status=LeadStatus.UNASSIGNED)
    for seconds in (10, 20, 30, 40, 100):
        lead = LeadFactory(status=LeadStatus.ASSIGNED, received_at=now - timedelta(minutes=5))
        assignment = AssignmentFactory(
            lead=lead, rep=ana, assigned_at=lead.received_at + timedelta(seconds=seconds)
        )
        # As routing records it: the assigned event at the assignment's time.
        event_record_for_assignment(
            type=EventType.ASSIGNED, assignment=assignment, at=assignment.assigned_at
        )
    event_record(type=EventType.SLA_BREACHED, lead=lead, at=now)
    response = client.get("/dashboard/")
    assert response.status_code == 200
    d = response.context["d"]
    assert d.backlog == 1
    assert response.context["backlog_age"].startswith("30 min")
    assert (d.unassigned, d.failed) == (2, 1)
    assert d.sla_breaches_today == 1
    assert d.assigned_in_window == 5
    assert d.p50 == timedelta(seconds=30)
    assert d.p95 == timedelta(seconds=88)  # 40 + 0.8 * (100 - 40)
    assert d.intake.total == 9  # every lead above was received in the last 3 hours
    assert d.alerts == []
    loads = {load.name: load for load in d.reps}
    assert loads["Ana"].open == 5
    assert loads["Ana"].over
    assert loads["Ana"].open_label == "5 / 2"
    assert loads["Ana"].open_pct == 100.0
    assert loads["Ana"].today_label == "5 / 10"
    assert loads["Ana"].today_pct == 50.0
    assert loads["Idle"].open == 0
    page = response.content.decode()
    assert "<svg" in page
    assert "<rect" in page
    # Charts are server-rendered SVG: the one script is our own (the browser's time zone).
    scripts = re.findall(r"<script[^>]*>", page)
    assert scripts == ['<script src="/static/audit/tz.js">'], scripts
    assert "Open alerts" in page


def test_the_dashboard_lists_open_alerts(client: Client) -> None:
    from routing.monitoring.alerts import alert_raise, alert_resolve

    logged_in(client, manager())
    alert_raise(kind="backlog", subject="pipeline", message="Backlog: 900 leads waiting.")
    alert_raise(kind="sla", subject="7", message="Lead 7 breached its SLA twice.")
    alert_resolve(kind="sla", subject="7")
    response = client.get("/dashboard/")
    alerts = response.context["d"].alerts
    assert len(alerts) == 1
    assert alerts[0].startswith("Backlog: Backlog: 900 leads waiting. (open since ")
    assert "900 leads waiting" in response.content.decode()


def test_dashboard_query_count_does_not_grow_with_reps_or_leads(client: Client) -> None:
    logged_in(client, manager())
    RepFactory()
    with CaptureQueriesContext(connection) as few:
        client.get("/dashboard/?hours=1")
    for _ in range(10):
        rep = RepFactory()
        AssignmentFactory(rep=rep)
    with CaptureQueriesContext(connection) as many:
        client.get("/dashboard/?hours=1")
    assert len(many) == len(few)


def test_export_reads_in_chunks_and_keeps_each_owner(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("audit.csv.EXPORT_CHUNK", 4)
    logged_in(client, manager())
    expected = {}
    for i in range(11):
        rep = RepFactory(name=f"Owner {i}")
        lead = owned(rep=rep, received_at=T0 + timedelta(minutes=i))
        expected[str(lead.pk)] = f"Owner {i}"
    with CaptureQueriesContext(connection) as queries:
        rows = _csv(client.get("/history/export.csv"))
    header, body = rows[0], rows[1:]
    got = {row[0]: row[header.index("owner")] for row in body}
    assert got == expected
    assert [row[0] for row in body] == list(reversed(expected))  # newest first
    # 3 chunks of leads, each with one query for its owners (not one per lead).
    owner_queries = [q for q in queries.captured_queries if "routing_assignment" in q["sql"]]
    assert len(owner_queries) == 3


def test_lead_page_escapes_what_the_source_sent(client: Client) -> None:
    logged_in(client, manager())
    lead = LeadFactory(
        company="<script>alert(1)</script>", raw_payload={"x": "<img src=x onerror=alert(1)>"}
    )
    page = client.get(f"/history/{lead.pk}/").content.decode()
    assert "<script>alert(1)" not in page
    assert "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_a_failed_leads_page_says_why_it_failed(client: Client) -> None:
    lead = LeadFactory(
        status=LeadStatus.FAILED, last_error="quarantined after 3 attempts: OperationalError"
    )
    boss = User.objects.create_superuser("boss", "boss@example.com", "pw-boss-123")
    html = logged_in(client, boss).get(f"/history/{lead.id}/").content.decode()
    assert "Failed: quarantined after 3 attempts: OperationalError" in html
    assert 'id="fetch"' not in html  # no fetch section for a lead that needed none


def test_export_carries_priority_and_tags_like_the_page(client: Client) -> None:
    """The history page shows each lead's priority and tags; the export had neither column
    (review of issue 22, L9). A tag that reads as a formula is neutralised like every cell."""
    logged_in(client, manager())
    rep = RepFactory()
    hot = owned(rep=rep, company="Acme", email="hot@acme.com")
    Lead.objects.filter(pk=hot.pk).update(priority="hot", tags=["=1+1", "enterprise"])
    plain = owned(rep=rep, company="Acme", email="plain@acme.com")
    rows = _csv(client.get("/history/export.csv?q=acme"))
    by_id = {row["lead id"]: row for row in (dict(zip(rows[0], r, strict=True)) for r in rows[1:])}
    assert by_id[str(hot.pk)]["priority"] == "hot"
    assert by_id[str(hot.pk)]["tags"] == "'=1+1; enterprise"
    assert by_id[str(plain.pk)]["priority"] == ""
    assert by_id[str(plain.pk)]["tags"] == ""


def _walk(leads: Any, *, descending: bool, size: int) -> tuple[list[list[Any]], Any]:
    pages, page = [], keyset_page(leads, column="priority", descending=descending, size=size)
    pages.append([lead.pk for lead in page.leads])
    while page.next_cursor:
        page = keyset_page(
            leads, column="priority", descending=descending, after=page.next_cursor, size=size
        )
        pages.append([lead.pk for lead in page.leads])
    return pages, page


@pytest.mark.parametrize("descending", [False, True])
def test_history_sorts_by_priority_as_the_api_orders_it_page_by_page(
    client: Client, settings: Any, descending: bool
) -> None:
    """Issue 22: priority sortable in history (it was a filter only; review L1). High priorities
    (HIGH_PRIORITIES, any case) first, then the others by name, then none, newest first within
    each: the API's ?ordering=priority, walked in keyset pages forward and back across the
    priorities' boundaries, ties on the time broken by id."""
    from leads.selectors import lead_ordering

    settings.HIGH_PRIORITIES = ["hot", "urgent"]
    values = ["", "hot", "low", "Urgent", "hot", "", "medium", "low", "hot", ""]
    for i in range(31):
        lead = LeadFactory(received_at=T0 + timedelta(seconds=i % 4))
        Lead.objects.filter(pk=lead.pk).update(priority=values[i % len(values)])
    leads = Lead.objects.select_related("source")
    api = list(leads.order_by(*lead_ordering("-priority" if descending else "priority")))
    expected = [lead.pk for lead in api]
    first_values = [lead.priority for lead in api[:12]]
    if not descending:  # the high ones, then the rest
        assert set(first_values) == {"hot", "Urgent"}
    pages, last = _walk(leads, descending=descending, size=4)
    assert [pk for page in pages for pk in page] == expected
    assert [len(page) for page in pages] == [4] * 7 + [3]
    back = keyset_page(
        leads, column="priority", descending=descending, before=last.prev_cursor, size=4
    )
    assert [lead.pk for lead in back.leads] == pages[-2]
    # Tampered or foreign cursors give the first page, never an error.
    for cursor in ("!!not-base64", "WyJob3QiXQ", "WzEsMiwzXQ", "W251bGwsImEiLCJiIl0"):
        page = keyset_page(leads, column="priority", descending=descending, after=cursor, size=4)
        assert [lead.pk for lead in page.leads] == pages[0]
    logged_in(client, manager())
    sort = "-priority" if descending else "priority"
    response = client.get(f"/history/?sort={sort}")
    assert response.status_code == 200
    assert lead_ids(response) == [str(pk) for pk in expected]
