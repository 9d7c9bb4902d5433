"""The rep's own page (/me/), the one-click "I'm on it" link, and the invitation to log in."""

from __future__ import annotations

import threading
import time
import zoneinfo
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.core import mail, signing
from django.db import connection
from django.test import Client
from django.utils import timezone

from audit.models import Event, EventType
from leads.models import LeadStatus
from routing.delivery.messages import email_parts, slack_message, teams_message
from routing.delivery.models import Delivery, DeliveryChannel
from routing.models import Assignment, Rep, TouchLinkUse
from routing.rep_access import rep_invite
from routing.services import lead_reassign
from routing.timeoff.models import RepAbsence
from routing.touch_links import TOUCH_LINK_SALT, touch_link_url
from tests.leads.factories import LeadFactory
from tests.routing.factories import AssignmentFactory, RepFactory

pytestmark = pytest.mark.django_db


def _routed_to_ana() -> Assignment:
    """A lead routed by the pipeline (so its notices are scheduled) to Ana."""
    from routing.decisions import clear_live_config_cache
    from routing.rules_io import rules_import
    from routing.services import lead_process
    from tests.routing.test_pipeline import RULES

    clear_live_config_cache()
    rules_import(RULES, publish=True)
    lead = LeadFactory(
        raw_payload={"email": "max@acme.com", "first_name": "Max", "company": "Acme"}
    )
    lead_process(lead_id=lead.id)
    lead.refresh_from_db()
    assert lead.status == LeadStatus.ASSIGNED
    return Assignment.objects.select_related("rep").get(lead=lead, active=True)


def _email_payload(assignment: Assignment) -> dict[str, Any]:
    row = Delivery.objects.get(assignment=assignment, channel=DeliveryChannel.EMAIL)
    return dict(row.payload)


def _path(url: str) -> str:
    return urlsplit(url).path


# --- The one-click link ------------------------------------------------------------------------


def test_the_assignment_email_carries_a_one_click_link_that_records_the_touch_once(
    client: Client, settings: Any
) -> None:
    settings.DELIVERY_LINK_BASE_URL = "https://leads.example.com"
    assignment = _routed_to_ana()
    payload = _email_payload(assignment)
    link = payload["notice"]["touch_link"]
    assert link.startswith("https://leads.example.com/touch/")
    _subject, text, html = email_parts(payload)
    assert link in text
    assert link in html
    slack_text = slack_message(payload)["blocks"][0]["text"]["text"]
    assert f"<{link}|I'm on it>" in slack_text
    actions = teams_message(payload)["attachments"][0]["content"]["actions"]
    assert {"type": "Action.OpenUrl", "title": "I'm on it", "url": link} in actions

    # Opening the link (a mail scanner does) records nothing: the button's POST does.
    page = client.get(_path(link))
    assert page.status_code == 200
    assert b"touch-confirm" in page.content
    assert b"Max" in page.content
    assert page["Referrer-Policy"] == "same-origin"
    assignment.refresh_from_db()
    assert assignment.touched_at is None

    done = client.post(_path(link))
    assert done.status_code == 200
    assert b"First touch recorded" in done.content
    assignment.refresh_from_db()
    assert assignment.touched_at is not None
    touched = Event.objects.get(lead=assignment.lead, type=EventType.TOUCHED)
    assert touched.actor == "rep:ana@example.com (one-click link)"

    # A second click, a forwarded copy: told when, nothing recorded again.
    again = client.post(_path(link))
    assert again.status_code == 200
    assert b"already used" in again.content
    assert Event.objects.filter(lead=assignment.lead, type=EventType.TOUCHED).count() == 1
    assert TouchLinkUse.objects.filter(assignment=assignment).count() == 1
    assert b"already used" in client.get(_path(link)).content


def test_the_reassigned_away_notice_has_no_one_click_link(settings: Any) -> None:
    assignment = _routed_to_ana()
    lead_reassign(
        lead_id=assignment.lead_id, rep_email="ben@example.com", reason="offsite", actor="t"
    )
    away = Delivery.objects.get(
        assignment__lead=assignment.lead,
        channel=DeliveryChannel.EMAIL,
        event="lead.reassigned_away",
    )
    assert "touch_link" not in away.payload["notice"]
    to_ben = Delivery.objects.get(
        assignment__lead=assignment.lead, channel=DeliveryChannel.EMAIL, event="lead.reassigned"
    )
    assert to_ben.payload["notice"]["touch_link"]


def test_a_link_of_a_lead_reassigned_since_refuses_and_records_nothing(client: Client) -> None:
    assignment = _routed_to_ana()
    link = _email_payload(assignment)["notice"]["touch_link"]
    lead_reassign(
        lead_id=assignment.lead_id, rep_email="ben@example.com", reason="offsite", actor="t"
    )
    answer = client.post(_path(link))
    assert answer.status_code == 200
    assert b"no longer yours" in answer.content
    assert not Event.objects.filter(lead=assignment.lead, type=EventType.TOUCHED).exists()
    assert not TouchLinkUse.objects.exists()
    assert Assignment.objects.get(lead=assignment.lead, active=True).touched_at is None


def test_a_click_after_the_touch_was_recorded_elsewhere_says_so(client: Client) -> None:
    """The page was opened, then the rep marked the touch on their page (or the CRM reported
    it) before clicking: the click records nothing and says when the touch was recorded,
    instead of "First touch recorded at <the earlier time>. Thank you."."""
    from routing.services import assignment_touch

    assignment = _routed_to_ana()
    link = _email_payload(assignment)["notice"]["touch_link"]
    assert b"touch-confirm" in client.get(_path(link)).content
    earlier = timezone.now() - timedelta(minutes=7)
    assignment_touch(lead_id=assignment.lead_id, actor="rep:ana@example.com", now=earlier)

    answer = client.post(_path(link))
    assert answer.status_code == 200
    assert b"First touch recorded" not in answer.content
    assert b"already recorded" in answer.content
    assert Event.objects.filter(lead=assignment.lead, type=EventType.TOUCHED).count() == 1
    assignment.refresh_from_db()
    assert assignment.touched_at == earlier


def _old_token(claims: dict[str, Any], age_seconds: int) -> str:
    class Back(signing.TimestampSigner):
        def timestamp(self) -> str:
            return signing.b62_encode(int(time.time()) - age_seconds)

    return Back(salt=TOUCH_LINK_SALT).sign_object(claims)


def test_expired_forged_and_foreign_tokens_record_nothing(client: Client, settings: Any) -> None:
    assignment = AssignmentFactory()
    claims = {"a": assignment.pk, "r": assignment.rep_id, "n": "nonce-1"}
    expired = _old_token(claims, settings.TOUCH_LINK_MAX_AGE_SECONDS + 60)
    fresh = _old_token(claims, 60)
    assert client.get(f"/touch/{fresh}/").status_code == 200  # the helper signs valid tokens
    answer = client.post(f"/touch/{expired}/")
    assert answer.status_code == 410
    assert b"expired" in answer.content
    head, _, tail = fresh.rpartition(":")
    forged = f"{head}:{'A' if tail[0] != 'A' else 'B'}{tail[1:]}"
    other_salt = signing.dumps(claims, salt="another.purpose")
    other_rep = _old_token({**claims, "r": RepFactory().pk}, 60)
    for token in (forged, other_salt, other_rep, "x", "a:b:c", "%00", "é" * 50):
        for method in (client.get, client.post):
            assert method(f"/touch/{token}/").status_code == 404, token
    assert not Event.objects.filter(type=EventType.TOUCHED).exists()
    assert not TouchLinkUse.objects.exists()
    assignment.refresh_from_db()
    assert assignment.touched_at is None


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_clicks_at_once_record_one_touch() -> None:
    assignment = AssignmentFactory()
    link = touch_link_url(assignment_id=assignment.pk, rep_id=assignment.rep_id)
    barrier = threading.Barrier(4)
    answers: list[int] = []

    def click() -> None:
        try:
            barrier.wait()
            answers.append(Client().post(_path(link)).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=click) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [200] * 4
    assert TouchLinkUse.objects.count() == 1
    assert Event.objects.filter(lead=assignment.lead, type=EventType.TOUCHED).count() == 1


# --- The rep's page ----------------------------------------------------------------------------


def _rep_login(rep: Rep, name: str) -> Client:
    user = User.objects.create_user(name, password=f"pw-{name}-123")
    rep.user = user
    rep.save(update_fields=["user"])
    client = Client()
    client.force_login(user)
    return client


def test_a_rep_sees_only_their_own_leads_and_touches_them() -> None:
    ana = RepFactory(name="Ana", email="ana@example.com", timezone="Europe/Berlin")
    ben = RepFactory(name="Ben", email="ben@example.com")
    now = timezone.now()
    mine = AssignmentFactory(
        rep=ana,
        lead=LeadFactory(email="mine@acme.example", first_name="Mina"),
        sla_due_at=now + timedelta(minutes=20),
    )
    theirs = [
        AssignmentFactory(rep=ben, lead=LeadFactory(email=f"b{n}@globex.example")) for n in range(5)
    ]
    client = _rep_login(ana, "ana")
    page = client.get("/me/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "mine@acme.example" in body
    assert "due by" in body
    assert "globex" not in body
    assert client.get("/").url == "/me/"  # a rep who is nothing more lands here

    # BOLA: every lead of Ben's, and ids around, is "no such lead" and stays untouched.
    for other in theirs:
        assert client.post(f"/me/leads/{other.lead_id}/touch/").status_code == 404
    for junk in ("not-a-uuid", "00000000-0000-0000-0000-000000000000"):
        assert client.post(f"/me/leads/{junk}/touch/").status_code == 404
    assert not Assignment.objects.filter(rep=ben, touched_at__isnull=False).exists()
    assert client.get("/history/").status_code == 403  # a rep is not a manager

    done = client.post(f"/me/leads/{mine.lead_id}/touch/", follow=True)
    assert b"First touch recorded" in done.content
    mine.refresh_from_db()
    assert mine.touched_at is not None
    event = Event.objects.get(lead=mine.lead, type=EventType.TOUCHED)
    assert event.actor == "user:ana"
    assert b"touched-table" in done.content


def test_a_login_that_is_no_rep_gets_403_and_anonymous_the_login_page() -> None:
    user = User.objects.create_user("olga", password="pw-olga-123")
    client = Client()
    assert client.get("/me/").status_code == 302
    client.force_login(user)
    assert client.get("/me/").status_code == 403
    assert client.post(f"/me/leads/{AssignmentFactory().lead_id}/touch/").status_code == 403


def test_a_rep_plans_and_cancels_time_off_in_their_zone() -> None:
    ana = RepFactory(name="Ana", email="ana@example.com", timezone="Europe/Berlin")
    ben = RepFactory(name="Ben", email="ben@example.com")
    client = _rep_login(ana, "ana")
    year = timezone.now().year + 1
    answer = client.post(
        "/me/time-off/",
        {"starts_at": f"{year}-07-06T09:00", "ends_at": f"{year}-07-10T18:00", "note": "Sailing"},
    )
    assert answer.status_code == 302
    absence = RepAbsence.objects.get(rep=ana)
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    assert absence.starts_at == datetime(year, 7, 6, 9, 0, tzinfo=berlin)
    assert absence.starts_at.astimezone(UTC).hour == 7  # CEST: UTC+2
    assert b"Sailing" in client.get("/me/").content

    overlapping = client.post(
        "/me/time-off/", {"starts_at": f"{year}-07-08T09:00", "ends_at": f"{year}-07-20T09:00"}
    )
    assert overlapping.status_code == 400
    assert b"overlaps" in overlapping.content
    past = client.post(
        "/me/time-off/", {"starts_at": "2020-01-01T09:00", "ends_at": "2020-01-02T09:00"}
    )
    assert past.status_code == 400
    assert b"already over" in past.content
    garbage = client.post("/me/time-off/", {"starts_at": "soon", "ends_at": ""})
    assert garbage.status_code == 400
    assert RepAbsence.objects.filter(rep=ana).count() == 1

    bens = RepAbsence.objects.create(
        rep=ben,
        starts_at=datetime(year, 8, 1, tzinfo=UTC),
        ends_at=datetime(year, 8, 2, tzinfo=UTC),
    )
    assert client.post(f"/me/time-off/{bens.pk}/cancel/").status_code == 404
    assert RepAbsence.objects.filter(pk=bens.pk).exists()
    assert client.post(f"/me/time-off/{absence.pk}/cancel/").status_code == 302
    assert not RepAbsence.objects.filter(rep=ana).exists()
    changes = Event.objects.filter(type=EventType.CONFIG_CHANGED).values_list("data", flat=True)
    assert any("deleted" in str(data) for data in changes)


# --- The invitation ----------------------------------------------------------------------------


def test_an_invited_rep_sets_a_password_once_logs_in_and_lands_on_their_page(
    settings: Any,
) -> None:
    settings.DELIVERY_LINK_BASE_URL = "https://leads.example.com"
    rep = RepFactory(name="Ana", email="Ana@Example.com")
    link = rep_invite(rep_id=rep.pk, actor="user:revops")
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["Ana@Example.com"]
    assert link in mail.outbox[0].body
    rep.refresh_from_db()
    assert rep.user is not None
    assert rep.user.get_username() == "ana@example.com"
    assert not rep.user.has_usable_password()

    client = Client()
    form = client.get(_path(link), follow=True)
    assert b"set-password-form" in form.content
    chosen = client.post(
        form.redirect_chain[-1][0],
        {"new_password1": "a-Long-pass-4-ana", "new_password2": "a-Long-pass-4-ana"},
        follow=True,
    )
    assert b"set-password-done" in chosen.content
    assert b"set-password-error" in Client().get(_path(link), follow=True).content  # once
    login = client.post(
        "/accounts/login/",
        {"username": "ana@example.com", "password": "a-Long-pass-4-ana"},
        follow=True,
    )
    assert login.redirect_chain[-1][0] == "/me/"
    # Inviting again sends a new link for the same login; an inactive rep is refused.
    rep_invite(rep_id=rep.pk, actor="user:revops")
    assert User.objects.filter(username__iexact="ana@example.com").count() == 1
    rep.active = False
    rep.save()
    from routing.rep_access import InviteError

    with pytest.raises(InviteError, match="inactive"):
        rep_invite(rep_id=rep.pk, actor="user:revops")


def test_the_admin_action_invites_the_selected_reps(admin_client: Client) -> None:
    reps = [RepFactory(email=f"r{n}@example.com") for n in range(2)]
    answer = admin_client.post(
        "/admin/routing/rep/",
        {"action": "invite_to_log_in", "_selected_action": [r.pk for r in reps]},
        follow=True,
    )
    assert answer.status_code == 200
    assert b"Invitation sent to r0@example.com, r1@example.com" in answer.content
    assert sorted(m.to[0] for m in mail.outbox) == ["r0@example.com", "r1@example.com"]
    assert all(Rep.objects.get(pk=r.pk).user_id for r in reps)


def test_a_rep_cannot_tell_other_leads_apart_from_no_lead_at_all() -> None:
    """Enumeration: every lead that is not the rep's own answers exactly as an id that names no
    lead (404, the same body), whatever its state: unassigned, excluded, another rep's, one the
    rep owned before it was reassigned away; none is touched."""
    from leads.models import Lead

    ana = RepFactory(name="Ana", email="ana@example.com")
    ben = RepFactory(name="Ben", email="ben@example.com")
    client = _rep_login(ana, "ana")
    unassigned = LeadFactory(status=LeadStatus.UNASSIGNED, email="u@initech.example")
    excluded = LeadFactory(status=LeadStatus.EXCLUDED, email="x@initech.example")
    received = LeadFactory(status=LeadStatus.RECEIVED, email="r@initech.example")
    bens = AssignmentFactory(rep=ben, lead=LeadFactory(email="b@initech.example"))
    was_anas = AssignmentFactory(
        rep=ana, lead=LeadFactory(email="w@initech.example", status=LeadStatus.ASSIGNED)
    )
    lead_reassign(lead_id=was_anas.lead_id, rep_email=ben.email, reason="cover", actor="t")
    nothing = client.post("/me/leads/00000000-0000-0000-0000-000000000000/touch/")
    assert nothing.status_code == 404
    for lead in (unassigned, excluded, received, bens.lead, was_anas.lead):
        answer = client.post(f"/me/leads/{lead.pk}/touch/")
        assert answer.status_code == 404, lead.status
        assert answer.content == nothing.content
    assert not Assignment.objects.filter(touched_at__isnull=False).exists()
    assert Lead.objects.filter(pk=unassigned.pk, status=LeadStatus.UNASSIGNED).exists()


@pytest.mark.parametrize(
    ("zone", "start", "end"),
    [
        ("America/Los_Angeles", "2026-12-10T09:00", "9999-12-31T23:59"),  # past year 9999 in UTC
        ("Asia/Tokyo", "0001-01-01T00:00", "2026-12-10T09:00"),  # before year 1 in UTC
    ],
)
def test_time_off_at_the_edge_of_the_calendar_is_refused_not_a_500(
    zone: str, start: str, end: str
) -> None:
    ana = RepFactory(name="Ana", email="ana@example.com", timezone=zone)
    client = _rep_login(ana, "ana")
    client.raise_request_exception = False
    answer = client.post("/me/time-off/", {"starts_at": start, "ends_at": end, "note": "x"})
    assert answer.status_code == 400
    assert b"out of range" in answer.content
    assert not RepAbsence.objects.exists()
