"""Rep notifications in Slack and Teams through the outbox, against local stand-ins of both.

The real ``slack-sdk`` clients (``WebClient`` with ``base_url``, ``WebhookClient``) and our own
``egress.post`` for Teams talk HTTP to ``tests/support/chat_standins.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core import mail
from django.core.cache import cache
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from pytest_httpserver import HTTPServer

from audit.models import Event
from routing.crm.secrets import secret_seal
from routing.delivery.messages import slack_message, teams_message
from routing.delivery.models import (
    Delivery,
    DeliveryChannel,
    DeliveryStatus,
    NotificationChannel,
    NotificationKind,
)
from routing.delivery.services import deliveries_schedule, delivery_attempt
from routing.models import Assignment, AssignmentKind, Rep, Team
from tests.routing.factories import AssignmentFactory, RepFactory, TeamFactory
from tests.support.chat_standins import SLACK_TOKEN, SlackStandin, TeamsStandin

pytestmark = pytest.mark.django_db

BERLIN_DUE = datetime(2026, 12, 3, 17, 30, tzinfo=UTC)  # 18:30 CET in Berlin


@pytest.fixture(autouse=True)
def _no_remembered_slack_users() -> Iterator[None]:
    """Slack user ids are cached per channel id, and SQLite reuses ids after a rollback."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def slack(httpserver: HTTPServer, settings: Any, allow_private: None) -> SlackStandin:
    standin = SlackStandin(httpserver, users={"rep@example.com": "U0REP1"})
    settings.SLACK_API_BASE_URL = standin.base_url
    return standin


@pytest.fixture
def teams(httpserver: HTTPServer, allow_private: None) -> TeamsStandin:
    return TeamsStandin(httpserver)


@pytest.fixture
def berlin(assignment: Assignment) -> Assignment:
    Rep.objects.filter(pk=assignment.rep_id).update(timezone="Europe/Berlin")
    Assignment.objects.filter(pk=assignment.pk).update(
        sla_due_at=BERLIN_DUE, priority="hot", tags=["enterprise", "webinar"]
    )
    return Assignment.objects.select_related("rep", "lead__source", "team").get(pk=assignment.pk)


def _channel(
    kind: str,
    secret: str,
    *,
    rep: Rep | None = None,
    team: Team | None = None,
    events: list[str] | None = None,
) -> NotificationChannel:
    channel = NotificationChannel(
        name=f"{kind} test", kind=kind, rep=rep, team=team, secret_encrypted=secret_seal(secret)
    )
    if events is not None:
        channel.events = events
    channel.full_clean()
    channel.save()
    return channel


def _chat_row(
    rows: list[Delivery], channel: NotificationChannel, event: str = "lead.assigned"
) -> Delivery:
    return next(r for r in rows if r.notification_channel_id == channel.pk and r.event == event)


def test_a_slack_bot_dms_the_rep_found_by_email_with_priority_tags_and_local_sla(
    berlin: Assignment, slack: SlackStandin, published: list[int], settings: Any
) -> None:
    settings.DELIVERY_LINK_BASE_URL = "https://leads.example.com"
    channel = _channel(NotificationKind.SLACK_BOT, SLACK_TOKEN, rep=berlin.rep)
    row = _chat_row(deliveries_schedule(assignment=berlin), channel)
    assert row.channel == DeliveryChannel.SLACK
    assert SLACK_TOKEN not in row.recipient
    assert SLACK_TOKEN not in json.dumps(row.payload)

    assert delivery_attempt(delivery_id=row.pk) == "delivered"

    (lookup, post) = slack.calls
    assert lookup[0] == "users.lookupByEmail"
    assert lookup[1]["email"] == "rep@example.com"
    assert lookup[2]["Authorization"] == f"Bearer {SLACK_TOKEN}"
    assert post[0] == "chat.postMessage"
    (message,) = slack.posted
    assert message["channel"] == "U0REP1"
    assert message["text"] == "[hot] New lead assigned to you: Ada Lovelace (Acme GmbH)"
    section = message["blocks"][0]["text"]["text"]
    assert "Thu 03 Dec 2026, 18:30 CET (Europe/Berlin)" in section
    assert "enterprise, webinar" in section
    assert f"<https://leads.example.com/history/{berlin.lead_id}/|Open the lead>" in section
    row.refresh_from_db()
    assert row.status == DeliveryStatus.DELIVERED
    assert Event.objects.filter(type="delivered", data__channel="slack").count() == 1
    # A duplicate task message after delivery sends nothing.
    assert delivery_attempt(delivery_id=row.pk) is None
    assert len(slack.posted) == 1


def test_a_rep_unknown_to_slack_is_a_failed_delivery_saying_so(
    assignment: Assignment, slack: SlackStandin, published: list[int]
) -> None:
    slack.users.clear()
    channel = _channel(NotificationKind.SLACK_BOT, SLACK_TOKEN, rep=assignment.rep)
    row = _chat_row(deliveries_schedule(assignment=assignment), channel)

    assert delivery_attempt(delivery_id=row.pk) == "failed"

    row.refresh_from_db()
    assert row.status == DeliveryStatus.FAILED
    assert "no Slack user has this rep's e-mail" in row.last_error
    assert "users_not_found" in row.last_error
    assert Event.objects.get(type="delivery_failed").data["error"] == row.last_error


@pytest.mark.parametrize(
    ("setup", "code"),
    [
        (lambda s: s.tokens.clear(), "invalid_auth"),
        (lambda s: s.revoked.add(SLACK_TOKEN), "token_revoked"),
        (lambda s: s.closed_channels.add("U0REP1"), "channel_not_found"),
    ],
    ids=["invalid_auth", "token_revoked", "channel_not_found"],
)
def test_auth_and_channel_errors_fail_at_once_without_retrying(
    assignment: Assignment, slack: SlackStandin, published: list[int], setup: Any, code: str
) -> None:
    channel = _channel(NotificationKind.SLACK_BOT, SLACK_TOKEN, rep=assignment.rep)
    row = _chat_row(deliveries_schedule(assignment=assignment), channel)
    setup(slack)

    assert delivery_attempt(delivery_id=row.pk) == "failed"

    row.refresh_from_db()
    assert row.status == DeliveryStatus.FAILED
    assert row.attempts == 1
    assert code in row.last_error
    assert row.next_attempt_at is None
    assert row.attempt_log.get().outcome == "failed"


def test_slack_429_is_retried_no_sooner_than_retry_after(
    assignment: Assignment, slack: SlackStandin, published: list[int]
) -> None:
    slack.rate_limited_for, slack.retry_after = 1, 120
    channel = _channel(NotificationKind.SLACK_BOT, SLACK_TOKEN, rep=assignment.rep)
    row = _chat_row(deliveries_schedule(assignment=assignment), channel)
    before = timezone.now()

    assert delivery_attempt(delivery_id=row.pk) == "retry"

    row.refresh_from_db()
    assert row.status == DeliveryStatus.PENDING
    assert row.last_status_code == 429
    assert "ratelimited" in row.last_error
    assert row.next_attempt_at >= before + timedelta(seconds=120)
    # Due again: the limit is over and it goes through.
    Delivery.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())
    assert delivery_attempt(delivery_id=row.pk) == "delivered"
    assert [a.outcome for a in row.attempt_log.order_by("number")] == ["retry", "delivered"]


def test_a_slow_slack_is_a_retry_after_the_timeout(
    assignment: Assignment, slack: SlackStandin, published: list[int], settings: Any
) -> None:
    settings.DELIVERY_TIMEOUT_SECONDS = 1
    slack.delay_seconds = 2.5
    channel = _channel(NotificationKind.SLACK_BOT, SLACK_TOKEN, rep=assignment.rep)
    row = _chat_row(deliveries_schedule(assignment=assignment), channel)

    assert delivery_attempt(delivery_id=row.pk) == "retry"

    row.refresh_from_db()
    assert "timed out" in row.last_error.lower()


def test_a_retry_past_the_deadline_is_a_dead_letter(
    assignment: Assignment, slack: SlackStandin, published: list[int]
) -> None:
    slack.rate_limited_for = 5
    channel = _channel(NotificationKind.SLACK_BOT, SLACK_TOKEN, rep=assignment.rep)
    row = _chat_row(deliveries_schedule(assignment=assignment), channel)
    Delivery.objects.filter(pk=row.pk).update(give_up_at=timezone.now() - timedelta(seconds=1))

    assert delivery_attempt(delivery_id=row.pk) == "failed"
    row.refresh_from_db()
    assert row.status == DeliveryStatus.FAILED
    assert row.last_status_code == 429


def test_a_slack_webhook_posts_and_its_url_is_never_shown(
    assignment: Assignment, slack: SlackStandin, published: list[int]
) -> None:
    channel = _channel(NotificationKind.SLACK_WEBHOOK, slack.webhook_url, rep=assignment.rep)
    row = _chat_row(deliveries_schedule(assignment=assignment), channel)
    assert "standinwebhooksecret" not in row.recipient

    assert delivery_attempt(delivery_id=row.pk) == "delivered"
    (body,) = slack.posted
    assert body["text"].startswith("New lead assigned to you: Ada Lovelace")

    slack.webhook_status = (400, "invalid_payload")
    again = _chat_row(
        deliveries_schedule(assignment=assignment, event="sla_warning"), channel, "lead.sla_warning"
    )
    assert delivery_attempt(delivery_id=again.pk) == "failed"
    again.refresh_from_db()
    assert "invalid_payload" in again.last_error
    assert "standinwebhooksecret" not in again.last_error


def test_a_slack_webhook_429_waits_for_retry_after(
    assignment: Assignment, slack: SlackStandin, published: list[int]
) -> None:
    slack.rate_limited_for, slack.retry_after = 1, 60
    channel = _channel(NotificationKind.SLACK_WEBHOOK, slack.webhook_url, rep=assignment.rep)
    row = _chat_row(deliveries_schedule(assignment=assignment), channel)
    before = timezone.now()
    assert delivery_attempt(delivery_id=row.pk) == "retry"
    row.refresh_from_db()
    assert row.next_attempt_at >= before + timedelta(seconds=60)


def test_a_team_teams_webhook_gets_an_adaptive_card_and_honours_429(
    assignment: Assignment, teams: TeamsStandin, published: list[int], settings: Any
) -> None:
    settings.DELIVERY_LINK_BASE_URL = "https://leads.example.com"
    team = TeamFactory(name="EMEA SDR")
    Assignment.objects.filter(pk=assignment.pk).update(team=team)
    assignment.refresh_from_db()
    channel = _channel(NotificationKind.TEAMS_WEBHOOK, teams.url, team=team)
    teams.rate_limited_for, teams.retry_after = 1, 45
    row = _chat_row(deliveries_schedule(assignment=assignment), channel)
    assert row.channel == DeliveryChannel.TEAMS
    before = timezone.now()

    assert delivery_attempt(delivery_id=row.pk) == "retry"
    row.refresh_from_db()
    assert row.next_attempt_at >= before + timedelta(seconds=45)
    Delivery.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())
    assert delivery_attempt(delivery_id=row.pk) == "delivered"

    (body,) = teams.posted
    card = body["attachments"][0]["content"]
    # The team's channel: the message names the owner ("to you" would read as every reader's).
    owner = assignment.rep.name
    assert card["body"][0]["text"] == f"New lead assigned to {owner}: Ada Lovelace (Acme GmbH)"
    facts = {fact["title"]: fact["value"] for fact in card["body"][2]["facts"]}
    assert facts["Company"] == "Acme GmbH"
    assert facts["SLA due"].endswith("UTC (UTC)")
    actions = {action["title"]: action["url"] for action in card["actions"]}
    assert actions["Open the lead"] == f"https://leads.example.com/history/{assignment.lead_id}/"
    # The team's channel is read by the whole team: no one-click link there, which would record
    # the owner's first touch for whoever pressed it.
    assert "I'm on it" not in actions
    assert "touch_link" not in row.payload["notice"]
    row.refresh_from_db()
    assert row.attempt_log.get(number=2).response_excerpt == "1"


def test_a_removed_teams_webhook_fails_for_good(
    assignment: Assignment, teams: TeamsStandin, published: list[int]
) -> None:
    teams.gone = True
    channel = _channel(NotificationKind.TEAMS_WEBHOOK, teams.url, rep=assignment.rep)
    row = _chat_row(deliveries_schedule(assignment=assignment), channel)
    assert delivery_attempt(delivery_id=row.pk) == "failed"
    row.refresh_from_db()
    assert row.last_status_code == 404
    assert "Teams webhook: HTTP 404" in row.last_error


def test_scheduling_twice_makes_one_row_per_channel_and_respects_events_and_active(
    assignment: Assignment,
    teams: TeamsStandin,
    published: list[int],
    django_capture_on_commit_callbacks: Any,
) -> None:
    wanted = _channel(NotificationKind.TEAMS_WEBHOOK, teams.url, rep=assignment.rep)
    _channel(NotificationKind.TEAMS_WEBHOOK, teams.url, rep=assignment.rep, events=["sla_warning"])
    off = _channel(NotificationKind.TEAMS_WEBHOOK, teams.url, rep=assignment.rep)
    NotificationChannel.objects.filter(pk=off.pk).update(active=False)
    with django_capture_on_commit_callbacks(execute=True):
        first = deliveries_schedule(assignment=assignment)
        second = deliveries_schedule(assignment=assignment)
    chats = [r for r in first if r.channel == DeliveryChannel.TEAMS]
    assert [r.notification_channel_id for r in chats] == [wanted.pk]
    assert sorted(r.pk for r in first) == sorted(r.pk for r in second)
    assert published == [r.pk for r in first]  # published once, on the first call


def test_a_reassignment_tells_the_new_rep_and_the_one_it_left(
    assignment: Assignment, slack: SlackStandin, published: list[int]
) -> None:
    slack.users["bob@example.com"] = "U0BOB"
    old_rep = assignment.rep
    _channel(NotificationKind.SLACK_BOT, SLACK_TOKEN, rep=old_rep)
    Assignment.objects.filter(pk=assignment.pk).update(active=False)
    bob = RepFactory(email="bob@example.com", name="Bob")
    moved = AssignmentFactory(
        lead=assignment.lead,
        rep=bob,
        rep_name="Bob",
        kind=AssignmentKind.REASSIGNMENT,
        supersedes=assignment,
    )
    rows = deliveries_schedule(assignment=moved)
    emails = sorted((r.recipient, r.event) for r in rows if r.channel == DeliveryChannel.EMAIL)
    assert emails == [
        ("bob@example.com", "lead.reassigned"),
        ("rep@example.com", "lead.reassigned_away"),
    ]
    (away,) = [r for r in rows if r.channel == DeliveryChannel.SLACK]
    assert away.event == "lead.reassigned_away"
    assert delivery_attempt(delivery_id=away.pk) == "delivered"
    (message,) = slack.posted
    assert message["channel"] == "U0REP1"
    assert message["text"] == "Lead reassigned away from you: Ada Lovelace (Acme GmbH)"
    assert "now belongs to Bob" in message["blocks"][0]["text"]["text"]


def test_the_email_has_text_and_html_parts_in_the_reps_zone(
    berlin: Assignment, published: list[int], settings: Any
) -> None:
    settings.DELIVERY_LINK_BASE_URL = "https://leads.example.com"
    (row,) = deliveries_schedule(assignment=berlin)
    assert delivery_attempt(delivery_id=row.pk) == "delivered"
    (message,) = mail.outbox
    assert message.subject == "[hot] New lead assigned to you: Ada Lovelace (Acme GmbH)"
    assert "SLA due:   Thu 03 Dec 2026, 18:30 CET (Europe/Berlin)" in message.body
    assert "Tags:      enterprise, webinar" in message.body
    ((html, mimetype),) = message.alternatives
    assert mimetype == "text/html"
    assert "Thu 03 Dec 2026, 18:30 CET (Europe/Berlin)" in html
    assert f'href="https://leads.example.com/history/{berlin.lead_id}/"' in html
    assert "<strong>hot</strong>" in html


def test_the_html_email_escapes_what_the_lead_typed(
    assignment: Assignment, published: list[int]
) -> None:
    lead = assignment.lead
    lead.first_name = "<script>alert(1)</script>"
    lead.save(update_fields=["first_name"])
    (row,) = deliveries_schedule(assignment=assignment)
    delivery_attempt(delivery_id=row.pk)
    ((html, _),) = mail.outbox[0].alternatives
    assert "<script>" not in html
    assert "&lt;script&gt;" in html


def test_email_can_be_turned_off_per_rep_and_per_team(
    assignment: Assignment, published: list[int]
) -> None:
    Rep.objects.filter(pk=assignment.rep_id).update(email_notifications=False)
    assignment.refresh_from_db()
    assert deliveries_schedule(assignment=assignment) == []
    Rep.objects.filter(pk=assignment.rep_id).update(email_notifications=True)
    team = TeamFactory(email_notifications=False)
    Assignment.objects.filter(pk=assignment.pk).update(team=team)
    assignment = Assignment.objects.select_related("rep", "team").get(pk=assignment.pk)
    assert deliveries_schedule(assignment=assignment) == []


def test_the_admin_keeps_the_credential_write_only(
    admin_client: Client, assignment: Assignment, settings: Any
) -> None:
    add = reverse("admin:routing_notificationchannel_add")
    bad = admin_client.post(
        add,
        {
            "name": "DM",
            "kind": "slack_bot",
            "rep": assignment.rep_id,
            "events": ["assigned"],
            "active": "on",
            "new_secret": "nope",
        },
    )
    assert bad.status_code == 200
    assert "starts with xoxb-" in bad.content.decode()
    settings.DELIVERY_ALLOW_PRIVATE_URLS = False
    private = admin_client.post(
        add,
        {
            "name": "Hook",
            "kind": "teams_webhook",
            "team": TeamFactory().pk,
            "events": ["assigned"],
            "new_secret": "http://169.254.169.254/hook",
        },
    )
    assert private.status_code == 200
    assert "link-local" in private.content.decode()
    token = "xoxb-9999-8888-a-real-looking-token"
    saved = admin_client.post(
        add,
        {
            "name": "DM",
            "kind": "slack_bot",
            "rep": assignment.rep_id,
            "events": ["assigned", "sla_warning"],
            "active": "on",
            "new_secret": token,
        },
    )
    assert saved.status_code == 302, saved.content.decode()[:2000]
    channel = NotificationChannel.objects.get(name="DM")
    assert channel.secret_encrypted.startswith("fernet:")
    assert token not in channel.secret_encrypted
    page = admin_client.get(reverse("admin:routing_notificationchannel_change", args=[channel.pk]))
    text = page.content.decode()
    assert token not in text
    assert "ending …oken" in text
    assert token not in json.dumps(list(Event.objects.values_list("data", flat=True)))


def test_key_rotation_reseals_the_channel_secrets(
    assignment: Assignment, settings: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from django.core.management import call_command

    from routing.crm.secrets import new_key, secret_open

    old = new_key()
    settings.CRM_SECRET_KEYS = [old]
    channel = _channel(NotificationKind.SLACK_BOT, SLACK_TOKEN, rep=assignment.rep)
    new = new_key()
    settings.CRM_SECRET_KEYS = [new, old]
    call_command("crm_rotate_key")
    assert "1 credential(s) re-encrypted, 0 unreadable" in capsys.readouterr().out
    settings.CRM_SECRET_KEYS = [new]
    channel.refresh_from_db()
    assert secret_open(channel.secret_encrypted) == SLACK_TOKEN


def test_a_reps_slack_user_is_looked_up_once_for_many_messages(
    assignment: Assignment, slack: SlackStandin, published: list[int]
) -> None:
    channel = _channel(NotificationKind.SLACK_BOT, SLACK_TOKEN, rep=assignment.rep)
    first = _chat_row(deliveries_schedule(assignment=assignment), channel)
    warning = _chat_row(
        deliveries_schedule(assignment=assignment, event="sla_warning"),
        channel,
        "lead.sla_warning",
    )
    assert delivery_attempt(delivery_id=first.pk) == "delivered"
    assert delivery_attempt(delivery_id=warning.pk) == "delivered"
    methods = [method for method, _, _ in slack.calls]
    assert methods == ["users.lookupByEmail", "chat.postMessage", "chat.postMessage"]
    assert [posted["channel"] for posted in slack.posted] == ["U0REP1", "U0REP1"]


def test_only_messages_to_the_rep_alone_carry_the_one_click_link(
    assignment: Assignment, settings: Any
) -> None:
    """A rep's own channels and a team's bot (a DM to the rep) carry the one-click link; a team's
    Slack or Teams webhook posts to a channel the whole team reads, so its message has none."""
    settings.DELIVERY_LINK_BASE_URL = "https://leads.example.com"
    team = TeamFactory(name="EMEA SDR")
    Assignment.objects.filter(pk=assignment.pk).update(team=team)
    assignment.refresh_from_db()
    rep = assignment.rep
    mine = [
        _channel(NotificationKind.SLACK_WEBHOOK, "https://hooks.slack.com/services/T/B/r", rep=rep),
        _channel(NotificationKind.TEAMS_WEBHOOK, "https://x.webhook.office.com/r", rep=rep),
        _channel(NotificationKind.SLACK_BOT, SLACK_TOKEN, rep=rep),
        _channel(NotificationKind.SLACK_BOT, SLACK_TOKEN, team=team),
    ]
    shared = [
        _channel(
            NotificationKind.SLACK_WEBHOOK, "https://hooks.slack.com/services/T/B/t", team=team
        ),
        _channel(NotificationKind.TEAMS_WEBHOOK, "https://x.webhook.office.com/t", team=team),
    ]
    rows = deliveries_schedule(assignment=assignment)
    for channel in mine:
        link = _chat_row(rows, channel).payload["notice"]["touch_link"]
        assert link.startswith("https://leads.example.com/touch/")
    for channel in shared:
        row = _chat_row(rows, channel)
        assert "touch_link" not in row.payload["notice"]
        assert "/touch/" not in json.dumps(slack_message(row.payload))
        assert "/touch/" not in json.dumps(teams_message(row.payload))


def test_a_team_channels_message_names_the_owner_instead_of_you(
    assignment: Assignment, settings: Any
) -> None:
    """A message in a channel the whole team reads says whose lead it is; "assigned to you"
    there reads as if it were every reader's (review of issue 22, L3). The rep's own channels
    keep "you"."""
    team = TeamFactory(name="EMEA SDR")
    Assignment.objects.filter(pk=assignment.pk).update(team=team)
    assignment.refresh_from_db()
    rep = assignment.rep
    own = _channel(
        NotificationKind.SLACK_WEBHOOK, "https://hooks.slack.com/services/T/B/r", rep=rep
    )
    shared = [
        _channel(
            NotificationKind.SLACK_WEBHOOK, "https://hooks.slack.com/services/T/B/t", team=team
        ),
        _channel(NotificationKind.TEAMS_WEBHOOK, "https://x.webhook.office.com/t", team=team),
    ]
    rows = deliveries_schedule(assignment=assignment)
    mine = json.dumps(slack_message(_chat_row(rows, own).payload))
    assert "assigned to you" in mine
    for channel in shared:
        payload = _chat_row(rows, channel).payload
        for body in (json.dumps(slack_message(payload)), json.dumps(teams_message(payload))):
            assert "to you" not in body
            assert f"assigned to {rep.name}" in body
