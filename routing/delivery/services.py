"""Delivery services: schedule the outbox rows of an assignment, attempt one, sweep due ones.

The flow: ``deliveries_schedule`` runs inside the assignment's transaction and writes one
``Delivery`` per recipient with its payload frozen; after commit it publishes a
``delivery.deliver`` task per row (never raising: a lost publish is left to the sweeper).
``delivery_attempt`` claims a due row with one atomic UPDATE (so a duplicate message is a
no-op), sends outside any transaction, and records the attempt and the outcome. Failures are
retried at a due time stored on the row, which ``deliveries_sweep_due`` (beat) picks up.
Nothing here touches the assignment: a delivery that fails never undoes it.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import random
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.core.mail import EmailMultiAlternatives
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import Case, DateTimeField, F, Q, Value, When
from django.utils import timezone

from audit.models import EventType
from audit.services import event_record_for_assignment
from config.celery import app as celery_app
from config.logging import log_context
from leads.priority import priority_is_high
from leads.selectors import lead_fields
from leads.services import broker_breaker
from routing.crm.facts import crm_label
from routing.crm.limits import writeback_lease_seconds
from routing.crm.models import CrmConnection
from routing.crm.roster import rep_crm_user_deactivated
from routing.crm.secrets import SecretUnreadable, secret_open
from routing.crm.writeback import crm_write_owner
from routing.delivery import backoff, chat, egress, signing
from routing.delivery.messages import email_parts, zone_of
from routing.delivery.models import (
    WEBHOOK_EVENTS,
    Delivery,
    DeliveryAttempt,
    DeliveryChannel,
    DeliveryEvent,
    DeliveryStatus,
    NotificationChannel,
    NotificationKind,
    WebhookEndpoint,
    message_id_for,
    notice_event_for,
)
from routing.erasure import ERASED_PAYLOAD
from routing.models import Assignment, AssignmentKind, Rep, Team
from routing.touch_links import touch_link_url

logger = logging.getLogger(__name__)

DELIVER_TASK = "delivery.deliver"
# Redis takes a queue's messages by priority step, lowest first (kombu's priority_steps 0, 3, 6,
# 9): deliveries about a high-priority lead at 0, all others at 3, so the first are taken first.
MESSAGE_PRIORITY_HIGH = 0
MESSAGE_PRIORITY_NORMAL = 3


def message_priority(high: bool) -> int:
    """The broker priority of a delivery message (lower is taken first on Redis)."""
    return MESSAGE_PRIORITY_HIGH if high else MESSAGE_PRIORITY_NORMAL


_rng = random.SystemRandom()

_EVENT_ALIASES = {
    "assigned": DeliveryEvent.ASSIGNED,
    "duplicate": DeliveryEvent.ASSIGNED,
    "initial": DeliveryEvent.ASSIGNED,
    "reassigned": DeliveryEvent.REASSIGNED,
    "reassignment": DeliveryEvent.REASSIGNED,
    "sla_warning": DeliveryEvent.SLA_WARNING,
}


def delivery_event_for(assignment: Assignment) -> str:
    """The event an assignment announces: ``lead.reassigned`` or ``lead.assigned``."""
    if assignment.kind == AssignmentKind.REASSIGNMENT:
        return DeliveryEvent.REASSIGNED.value
    return DeliveryEvent.ASSIGNED.value


def _event_name(event: str) -> str:
    if event in DeliveryEvent.values:
        return event
    if event in _EVENT_ALIASES:
        return _EVENT_ALIASES[event].value
    raise ValueError(f"unknown delivery event {event!r}; expected one of {DeliveryEvent.values}")


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def delivery_payload(*, assignment: Assignment, event: str, at: datetime) -> dict[str, Any]:
    """The JSON sent for ``event`` about ``assignment`` (docs/api.md, "Outbound webhooks")."""
    lead = assignment.lead
    rep = assignment.rep
    document = {
        "type": event,
        "timestamp": at.isoformat(),
        "data": {
            "lead": {
                "id": str(lead.pk),
                "fields": lead_fields(lead),
                "source": lead.source.slug,
                "received_at": _iso(lead.received_at),
                "duplicate_of": str(lead.duplicate_of_id) if lead.duplicate_of_id else None,
                "priority": lead.priority or None,
                "tags": list(lead.tags or []),
            },
            "assignment": {
                "id": assignment.pk,
                "kind": assignment.kind,
                "rep": {"id": rep.pk, "email": rep.email, "name": assignment.rep_name or rep.name},
                "team": (
                    {"id": assignment.team_id, "name": assignment.team_name}
                    if assignment.team_id or assignment.team_name
                    else None
                ),
                "rule": (
                    {"id": assignment.rule_id, "name": assignment.rule_name}
                    if assignment.rule_id or assignment.rule_name
                    else None
                ),
                "ruleset_version": assignment.ruleset_version,
                "reason": assignment.reason,
                "assigned_at": _iso(assignment.assigned_at),
                "sla_due_at": _iso(assignment.sla_due_at),
                "supersedes": assignment.supersedes_id,
                "priority": assignment.priority or None,
                "tags": list(assignment.tags or []),
            },
        },
    }
    # Round-trip so what is stored is exactly what will be sent (no Decimal, no datetime).
    frozen: dict[str, Any] = json.loads(json.dumps(document, cls=DjangoJSONEncoder))
    return frozen


def payload_body(payload: dict[str, Any]) -> bytes:
    """The request body: the payload as compact JSON with sorted keys (stable across retries)."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


# --- Scheduling --------------------------------------------------------------------------------


def _notice(
    *, assignment: Assignment, rep: Rep, event: str, now_with: str = "", shared: bool = False
) -> dict[str, Any]:
    """The ``notice`` part of a rep's message: who it is for, their zone, the lead page.

    ``shared``: a message posted where others read it too (a team's channel): without the
    one-click link, which records the touch as the rep's for whoever presses it.
    """
    return {
        "event": event,
        "rep": {"id": rep.pk, "name": rep.name, "email": rep.email},
        "timezone": zone_of(rep.timezone).key,
        "link": _link(str(assignment.lead_id)),
        **({"now_with": now_with} if now_with else {}),
        **({"shared": True} if shared else {}),
        **(
            {"touch_link": _touch_link(assignment, rep)}
            if event in _OWNER_EVENTS and not shared
            else {}
        ),
    }


# The events that tell a rep a lead is theirs now: their messages carry the one-click link.
_OWNER_EVENTS = frozenset(
    {DeliveryEvent.ASSIGNED.value, DeliveryEvent.REASSIGNED.value, DeliveryEvent.SLA_WARNING.value}
)


def _touch_link(assignment: Assignment, rep: Rep) -> str:
    return touch_link_url(assignment_id=assignment.pk, rep_id=rep.pk)


@dataclass(frozen=True)
class _Notice:
    """One rep to tell about one assignment: who, through which team's settings, what event."""

    rep: Rep
    team: Team | None
    event: str
    now_with: str = ""


def _notices_for(assignment: Assignment, event: str) -> list[_Notice]:
    """Whom an event tells: the assignment's rep, and on a reassignment the rep it left."""
    notices = [_Notice(rep=assignment.rep, team=assignment.team, event=event)]
    if event == DeliveryEvent.REASSIGNED and assignment.supersedes_id is not None:
        before = (
            Assignment.objects.select_related("rep", "team")
            .filter(pk=assignment.supersedes_id)
            .first()
        )
        if before is not None and before.rep_id != assignment.rep_id:
            notices.append(
                _Notice(
                    rep=before.rep,
                    team=before.team,
                    event=DeliveryEvent.REASSIGNED_AWAY.value,
                    now_with=assignment.rep_name or assignment.rep.name,
                )
            )
    return notices


def _chat_channels(notice: _Notice) -> list[NotificationChannel]:
    """The active Slack/Teams channels of the notice's rep and team that want its event."""
    scope = Q(rep_id=notice.rep.pk)
    if notice.team is not None:
        scope |= Q(team_id=notice.team.pk)
    wanted = notice_event_for(notice.event)
    return [
        channel
        for channel in NotificationChannel.objects.filter(scope, active=True).order_by("id")
        if channel.subscribes_to(wanted)
    ]


def _emails_wanted(notice: _Notice) -> bool:
    return (
        settings.DELIVERY_EMAIL_ENABLED
        and bool(notice.rep.email)
        and notice.rep.email_notifications
        and (notice.team is None or notice.team.email_notifications)
    )


@transaction.atomic
def deliveries_schedule(
    *, assignment: Assignment, event: str | None = None, crm: bool = True, fresh: bool = False
) -> list[Delivery]:
    """Write the outbox rows for ``event`` about ``assignment`` and publish them after commit.

    Call it inside the assignment's transaction. One row per active endpoint subscribed to the
    event, one per CRM write-back, and the rep's notices: an e-mail (``DELIVERY_EMAIL_ENABLED``
    and the rep's and team's ``email_notifications``) and a message per Slack/Teams channel of
    the rep or their team; a reassignment also tells the rep it left (``lead.reassigned_away``).
    Calling it again for the same assignment and event creates nothing new (rows are unique per
    recipient) and returns the existing ones. ``crm=False`` leaves the CRM write-backs out (a
    change the CRM made itself). ``event`` defaults to the one the assignment's kind announces;
    the short forms ``assigned`` and ``reassigned`` are accepted, and ``lead.sla_warning``
    (the rep's notices only). ``fresh``: the caller created the assignment in this transaction,
    so no outbox row can name it yet (not even a concurrent one: the assignment is not
    committed) and the read of the existing rows is skipped: one statement less per lead.
    """
    event = _event_name(event) if event else delivery_event_for(assignment)
    notices = _notices_for(assignment, event)
    events = {event} | {notice.event for notice in notices}
    existing = (
        [] if fresh else list(Delivery.objects.filter(assignment=assignment, event__in=events))
    )
    endpoints = (
        list(WebhookEndpoint.objects.filter(active=True).order_by("id"))
        if event in WEBHOOK_EVENTS
        else []
    )
    writebacks = (
        list(CrmConnection.objects.filter(active=True, writeback_enabled=True).order_by("id"))
        if crm and event in WEBHOOK_EVENTS
        else []
    )
    new = _outbox_rows(
        assignment=assignment,
        event=event,
        notices=notices,
        existing=existing,
        endpoints=endpoints,
        writebacks=writebacks,
        chat_channels=_chat_channels,
    )
    if new:
        Delivery.objects.bulk_create(new)
        _publish_on_commit(new, [assignment])
    return existing + new


def _publish_on_commit(rows: list[Delivery], assignments: Sequence[Assignment]) -> None:
    ids = [delivery.pk for delivery in rows]
    high_assignments = {
        assignment.pk
        for assignment in assignments
        if priority_is_high(assignment.priority, settings.HIGH_PRIORITIES)
    }
    high = [row.pk for row in rows if row.assignment_id in high_assignments]
    transaction.on_commit(lambda: deliveries_enqueue(ids, high=high), robust=True)


@transaction.atomic
def deliveries_schedule_fresh(assignments: Sequence[Assignment]) -> list[Delivery]:
    """``deliveries_schedule(assignment=..., event="assigned", fresh=True)`` for many new
    assignments (a routing batch, ``routing.batch``), in a fixed number of statements: their
    reps and teams, the endpoints, the CRM write-backs and the chat channels read once for all,
    and one insert. Each assignment's ``lead`` must be loaded (with its source)."""
    if not assignments:
        return []
    event = _event_name(EventType.ASSIGNED)
    reps = Rep.objects.in_bulk({assignment.rep_id for assignment in assignments})
    team_ids = {assignment.team_id for assignment in assignments if assignment.team_id}
    teams = Team.objects.in_bulk(team_ids) if team_ids else {}
    endpoints = (
        list(WebhookEndpoint.objects.filter(active=True).order_by("id"))
        if event in WEBHOOK_EVENTS
        else []
    )
    writebacks = (
        list(CrmConnection.objects.filter(active=True, writeback_enabled=True).order_by("id"))
        if event in WEBHOOK_EVENTS
        else []
    )
    channels = list(
        NotificationChannel.objects.filter(
            Q(rep_id__in=list(reps)) | Q(team_id__in=list(team_ids)), active=True
        ).order_by("id")
    )

    def chat_channels(notice: _Notice) -> list[NotificationChannel]:
        wanted = notice_event_for(notice.event)
        team_id = notice.team.pk if notice.team is not None else None
        return [
            channel
            for channel in channels
            if (
                channel.rep_id == notice.rep.pk
                or (team_id is not None and channel.team_id == team_id)
            )
            and channel.subscribes_to(wanted)
        ]

    new: list[Delivery] = []
    for assignment in assignments:
        assignment.rep = reps[assignment.rep_id]
        if assignment.team_id is not None:
            assignment.team = teams.get(assignment.team_id)
        notices = [_Notice(rep=assignment.rep, team=assignment.team, event=event)]
        new += _outbox_rows(
            assignment=assignment,
            event=event,
            notices=notices,
            existing=[],
            endpoints=endpoints,
            writebacks=writebacks,
            chat_channels=chat_channels,
        )
    if new:
        Delivery.objects.bulk_create(new)
        _publish_on_commit(new, assignments)
    return new


def _outbox_rows(
    *,
    assignment: Assignment,
    event: str,
    notices: list[_Notice],
    existing: list[Delivery],
    endpoints: list[WebhookEndpoint],
    writebacks: list[CrmConnection],
    chat_channels: Callable[[_Notice], list[NotificationChannel]],
) -> list[Delivery]:
    """The outbox rows ``event`` about ``assignment`` needs that ``existing`` does not hold."""
    now = timezone.now()
    give_up_at = now + timedelta(seconds=settings.DELIVERY_MAX_AGE_SECONDS)
    have_endpoints = {row.endpoint_id for row in existing if row.endpoint_id is not None}
    have_email = {row.event for row in existing if row.channel == DeliveryChannel.EMAIL}
    have_chat = {
        (row.notification_channel_id, row.event)
        for row in existing
        if row.notification_channel_id is not None
    }
    base: dict[str, Any] | None = None
    new: list[Delivery] = []

    def row(
        channel: str,
        endpoint: WebhookEndpoint | None,
        recipient: str,
        key: str = "",
        *,
        notice: _Notice | None = None,
        shared: bool = False,
    ) -> Delivery:
        nonlocal base
        if base is None:
            base = delivery_payload(assignment=assignment, event=event, at=now)
        payload = base
        row_event = event
        if notice is not None:
            row_event = notice.event
            extra = _notice(
                assignment=assignment,
                rep=notice.rep,
                event=notice.event,
                now_with=notice.now_with,
                shared=shared,
            )
            payload = {**base, "notice": extra}
        key = key or (f"endpoint-{endpoint.pk}" if endpoint is not None else "email")
        return Delivery(
            channel=channel,
            endpoint=endpoint,
            recipient=recipient,
            assignment=assignment,
            event=row_event,
            message_id=message_id_for(
                lead_id=assignment.lead_id,
                assignment_id=assignment.pk,
                recipient=key,
                event=row_event,
            ),
            payload=payload,
            status=DeliveryStatus.PENDING,
            next_attempt_at=now,
            give_up_at=give_up_at,
            dispatched_at=now,  # published on commit just below
            created_at=now,
        )

    for endpoint in endpoints:
        if endpoint.subscribes_to(event) and endpoint.pk not in have_endpoints:
            new.append(row(DeliveryChannel.WEBHOOK, endpoint, endpoint.url))
    have_crms = {row.crm_connection_id for row in existing if row.crm_connection_id is not None}
    for target in writebacks:
        if target.pk not in have_crms:
            write = row(DeliveryChannel.CRM, None, target.name, key=f"crm-{target.pk}")
            write.crm_connection = target
            new.append(write)
    for notice in notices:
        if _emails_wanted(notice) and notice.event not in have_email:
            # The key of the first e-mail stays "email", so its message id is as it was.
            key = "email" if notice.rep.pk == assignment.rep_id else f"email-{notice.rep.pk}"
            new.append(row(DeliveryChannel.EMAIL, None, notice.rep.email, key, notice=notice))
        for chat_target in chat_channels(notice):
            if (chat_target.pk, notice.event) in have_chat:
                continue
            message = row(
                chat_target.delivery_channel,
                None,
                f"{chat_target.name} → {notice.rep.email}"[:2000],
                f"chat-{chat_target.pk}-{notice.rep.pk}",
                notice=notice,
                # A team's webhook posts to the team's channel (a bot writes to the rep alone).
                shared=chat_target.team_id is not None
                and chat_target.kind != NotificationKind.SLACK_BOT,
            )
            message.notification_channel = chat_target
            new.append(message)
    return new


def deliveries_enqueue(
    delivery_ids: Sequence[int], *, countdown: float = 0.0, high: Collection[int] = ()
) -> int:
    """Publish a ``delivery.deliver`` task per id; never raises. Returns how many were published.

    ``countdown``: seconds before a worker runs them (a deferred write-back's wait). ``high``:
    the ids about a high-priority lead, published at ``MESSAGE_PRIORITY_HIGH`` so that a worker
    takes them before the others waiting in the queue (Redis; docs/operations.md, "Priority").
    A failure is logged and left to ``deliveries_sweep_due``: the row is the outbox.
    """
    if not delivery_ids:
        return 0
    if not broker_breaker.allows():
        logger.warning(
            "broker marked down; %d delivery(ies) left for the sweeper", len(delivery_ids)
        )
        return 0
    published = 0
    options: dict[str, Any] = {"countdown": countdown} if countdown > 0 else {}
    try:
        with celery_app.producer_or_acquire() as producer:
            for delivery_id in delivery_ids:
                celery_app.send_task(
                    DELIVER_TASK,
                    args=[delivery_id],
                    producer=producer,
                    retry=False,
                    priority=message_priority(delivery_id in high),
                    **options,
                )
                published += 1
    except Exception as exc:  # any broker failure: the sweeper publishes the rest
        broker_breaker.trip(settings.BROKER_BREAKER_SECONDS)
        logger.error(
            "could not enqueue %d of %d delivery(ies) (%s: %s); the sweeper will retry them",
            len(delivery_ids) - published,
            len(delivery_ids),
            type(exc).__name__,
            exc,
        )
    else:
        broker_breaker.reset()
    return published


# --- Attempting -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Result:
    """What one attempt came to, before it is written down."""

    outcome: str  # delivered | retry | gone | refused | permanent | cancelled
    status_code: int | None = None
    error: str = ""
    excerpt: str = ""
    retry_after: float | None = None
    duration_ms: int = 0


def _send_webhook(delivery: Delivery, endpoint: WebhookEndpoint, now: datetime) -> _Result:
    body = payload_body(delivery.payload)
    headers = signing.headers(
        secret=endpoint.secret,
        message_id=delivery.message_id,
        timestamp=int(time.time()),
        body=body,
    )
    try:
        response = egress.post(
            endpoint.url,
            body=body,
            headers=headers,
            timeout=settings.DELIVERY_TIMEOUT_SECONDS,
            allow_private=settings.DELIVERY_ALLOW_PRIVATE_URLS,
        )
    except egress.HostUnresolved as exc:
        return _Result("retry", error=str(exc))
    except egress.UrlRefused as exc:
        return _Result("refused", error=f"URL refused: {exc}")
    except TimeoutError:
        return _Result("retry", error=f"timed out after {settings.DELIVERY_TIMEOUT_SECONDS} s")
    except (OSError, http.client.HTTPException) as exc:
        return _Result("retry", error=f"{type(exc).__name__}: {exc}")
    if 200 <= response.status < 300:
        return _Result("delivered", status_code=response.status, excerpt=response.excerpt)
    if response.status == 410:
        return _Result("gone", status_code=410, error="HTTP 410 Gone", excerpt=response.excerpt)
    retry_after = None
    if response.status in (429, 503):
        retry_after = backoff.retry_after_seconds(response.headers.get("retry-after"), now=now)
    error = f"HTTP {response.status}"
    if 300 <= response.status < 400:
        error += " (redirects are not followed)"
    return _Result(
        "retry",
        status_code=response.status,
        error=error,
        excerpt=response.excerpt,
        retry_after=retry_after,
    )


def _link(lead_id: str) -> str:
    return f"{settings.DELIVERY_LINK_BASE_URL.rstrip('/')}/history/{lead_id}/"


def email_message(payload: dict[str, Any]) -> tuple[str, str]:
    """Subject and plain-text body of the e-mail to the rep, from a delivery's payload."""
    subject, text, _html = email_parts(payload)
    return subject, text


def _send_email(delivery: Delivery) -> _Result:
    subject, text, html = email_parts(delivery.payload)
    message = EmailMultiAlternatives(subject, text, None, [delivery.recipient])
    message.attach_alternative(html, "text/html")
    try:
        message.send(fail_silently=False)
    except Exception as exc:  # any backend error (SMTP, connection): retried with backoff
        return _Result("retry", error=f"{type(exc).__name__}: {exc}")
    return _Result("delivered")


# A rep's Slack user id, per bot channel: users.lookupByEmail is rate limited (Tier 3), and a
# burst of leads for one rep should not look them up once per message.
SLACK_USER_CACHE_SECONDS = 3600


def _slack_user_key(target: NotificationChannel, email: str) -> str:
    # The stored token is part of the key: a new token (another workspace) looks the rep up again.
    seed = f"{target.secret_encrypted}\n{email.strip().lower()}"
    return f"delivery:slack-user:{target.pk}:{hashlib.sha256(seed.encode()).hexdigest()[:32]}"


def _cache_get(key: str) -> str:
    try:
        return str(cache.get(key) or "")
    except Exception:  # a cache outage costs a lookup, never a delivery
        return ""


def _cache_set(key: str, value: str) -> None:
    try:
        cache.set(key, value, SLACK_USER_CACHE_SECONDS)
    except Exception as exc:  # a cache outage costs a lookup next time, never a delivery
        logger.warning("could not remember a Slack user id (%s)", type(exc).__name__)


def _send_chat(delivery: Delivery, now: datetime) -> _Result:
    target = delivery.notification_channel
    if target is None or not target.active:
        return _Result("cancelled", error="the notification channel is turned off")
    try:
        secret = secret_open(target.secret_encrypted)
    except SecretUnreadable as exc:
        return _Result("permanent", error=f"{target.name}: {exc}")
    if not secret:
        return _Result("permanent", error=f"{target.name}: no webhook URL or token is set")
    timeout = settings.DELIVERY_TIMEOUT_SECONDS
    allow_private = settings.DELIVERY_ALLOW_PRIVATE_URLS
    if target.kind == NotificationKind.SLACK_BOT:
        rep = (delivery.payload.get("notice") or {}).get("rep") or {}
        email = str(rep.get("email") or "")
        remembered = _slack_user_key(target, email)
        known = _cache_get(remembered)
        result = chat.slack_bot_send(
            token=secret,
            email=email,
            payload=delivery.payload,
            base_url=settings.SLACK_API_BASE_URL,
            timeout=timeout,
            now=now,
            known_user_id=known,
        )
        if result.slack_user_id and result.slack_user_id != known:
            _cache_set(remembered, result.slack_user_id)
        elif known and result.outcome == "permanent":
            _cache_set(remembered, "")  # the user may have gone: look them up next time
    elif target.kind == NotificationKind.SLACK_WEBHOOK:
        result = chat.slack_webhook_send(
            url=secret,
            payload=delivery.payload,
            timeout=timeout,
            now=now,
            allow_private=allow_private,
        )
    else:
        result = chat.teams_webhook_send(
            url=secret,
            payload=delivery.payload,
            timeout=timeout,
            now=now,
            allow_private=allow_private,
        )
    # The URL holds the secret: a library's error message may quote it, the log must not.
    error = result.error.replace(secret, "[secret]") if secret else result.error
    return _Result(
        result.outcome,
        status_code=result.status_code,
        error=error,
        excerpt=result.excerpt.replace(secret, "[secret]"),
        retry_after=result.retry_after,
    )


def _send_crm(delivery: Delivery, now: datetime) -> _Result:
    deactivated = _rep_deactivated_in_crm(delivery)
    if deactivated:
        # The CRM would refuse the owner in its own words after every retry: fail now, saying
        # why and what to do, without a request (the dead letter shows it in the admin).
        return _Result("refused", error=deactivated)
    written = crm_write_owner(delivery=delivery, now=now)
    outcome = {"failed": "refused"}.get(written.outcome, written.outcome)
    return _Result(
        outcome,
        error=written.error,
        excerpt=written.excerpt,
        retry_after=written.retry_after,
    )


def _rep_deactivated_in_crm(delivery: Delivery) -> str:
    """The failure message when the delivery's rep has a deactivated CRM user, else ""."""
    connection = delivery.crm_connection
    if connection is None or not connection.active or not connection.writeback_enabled:
        return ""
    assignment = (
        Assignment.objects.select_related("rep")
        .filter(pk=delivery.assignment_id, active=True)
        .first()
    )
    if assignment is None or not rep_crm_user_deactivated(connection.kind, assignment.rep_id):
        return ""
    rep = assignment.rep
    return (
        f"{rep.name or rep.email}'s CRM user is deactivated in {crm_label(connection.kind)}: "
        "re-route the lead or re-link the rep"
    )


def delivery_attempt(*, delivery_id: int) -> str | None:
    """Try one delivery now, if it is pending and due; return the attempt's outcome.

    None means there was nothing to do: already delivered, failed or cancelled, not due, or
    held by another attempt (a duplicate task message). Outcomes: ``delivered``, ``retry``,
    ``failed`` (gave up, refused URL, or 410), ``cancelled`` (endpoint disabled).
    """
    now = timezone.now()
    lease = now + timedelta(seconds=settings.DELIVERY_LEASE_SECONDS)
    # A CRM write-back makes several requests, each up to CRM_TIMEOUT_SECONDS: its lease covers
    # them all, so a slow send is not taken over by a redelivery and sent twice.
    crm_lease = now + timedelta(
        seconds=max(settings.DELIVERY_LEASE_SECONDS, writeback_lease_seconds())
    )
    held_until = Case(
        When(channel=DeliveryChannel.CRM, then=Value(crm_lease)),
        default=Value(lease),
        output_field=DateTimeField(),
    )
    claimed = Delivery.objects.filter(
        pk=delivery_id, status=DeliveryStatus.PENDING, next_attempt_at__lte=now
    ).update(next_attempt_at=held_until, attempts=F("attempts") + 1, updated_at=now)
    if not claimed:
        return None
    delivery = Delivery.objects.select_related(
        "endpoint", "crm_connection", "notification_channel"
    ).get(pk=delivery_id)
    # The lead the delivery is about, for every line logged meanwhile (one small query).
    about = (
        Assignment.objects.filter(pk=delivery.assignment_id)
        .values_list("lead_id", "lead__source__slug")
        .first()
    )
    lead_id, source = about if about is not None else (None, None)
    with log_context(lead_id=lead_id, source=source):
        return _delivery_attempt(delivery, now)


def _delivery_attempt(delivery: Delivery, now: datetime) -> str | None:
    delivery_id = delivery.pk
    number = delivery.attempts
    started = time.monotonic()
    if delivery.channel == DeliveryChannel.EMAIL:
        result = _send_email(delivery)
    elif delivery.channel == DeliveryChannel.CRM:
        result = _send_crm(delivery, now)
    elif delivery.channel in (DeliveryChannel.SLACK, DeliveryChannel.TEAMS):
        result = _send_chat(delivery, now)
    elif delivery.endpoint is None or not delivery.endpoint.active:
        result = _Result("cancelled", error="the endpoint is disabled")
    else:
        result = _send_webhook(delivery, delivery.endpoint, now)
    duration_ms = int((time.monotonic() - started) * 1000)
    return _attempt_record(delivery_id=delivery_id, number=number, result=result, ms=duration_ms)


# What the attempt log says: a refusal or a 410 is a failure, but worth naming as such.
_LOGGED_OUTCOME = {"refused": "refused", "gone": "gone", "permanent": "failed"}


@transaction.atomic(durable=True)
def _attempt_record(*, delivery_id: int, number: int, result: _Result, ms: int) -> str | None:
    """Log the attempt and move the delivery on (delivered, retry at, failed, cancelled)."""
    now = timezone.now()
    # The delivery's row only, NO KEY: the assignment is only read here, and locking it would
    # queue this (after the send) behind a touch, an SLA check or a reassignment of it.
    delivery = (
        Delivery.objects.select_for_update(of=("self",), no_key=True)
        .select_related("assignment")
        .get(pk=delivery_id)
    )
    outcome = result.outcome
    next_at: datetime | None = None
    if outcome == "deferred":
        # Waited for our own rate limit (a CRM's shared budget) or for another write-back of the
        # same lead: not an attempt, no log row. Sent again when the wait is over, by a message
        # of its own, so that write-backs drain at the CRM's pace rather than the sweep's; the
        # sweep re-sends it only if that message is lost (DELIVERY_REDISPATCH_SECONDS after it
        # was due), or when the wait is longer than that.
        if delivery.status == DeliveryStatus.PENDING and delivery.attempts == number:
            wait = max(0.5, result.retry_after or 1.0) * _rng.uniform(1.0, 1.5)
            due = now + timedelta(seconds=wait)
            requeue = wait <= settings.DELIVERY_REDISPATCH_SECONDS
            Delivery.objects.filter(pk=delivery.pk).update(
                next_attempt_at=due,
                attempts=F("attempts") - 1,
                updated_at=now,
                **({"dispatched_at": due} if requeue else {}),
            )
            if requeue:
                delivery_pk = delivery.pk
                transaction.on_commit(
                    lambda: deliveries_enqueue([delivery_pk], countdown=wait), robust=True
                )
        return "deferred"
    if outcome == "retry":
        next_at = backoff.next_attempt_at(
            attempt=number,
            now=now,
            give_up_at=delivery.give_up_at,
            base=settings.DELIVERY_BACKOFF_BASE_SECONDS,
            cap=settings.DELIVERY_BACKOFF_MAX_SECONDS,
            rng=_rng,
            retry_after=result.retry_after,
        )
        if next_at is None:
            outcome = "failed"
    elif outcome in ("gone", "refused", "permanent"):
        outcome = "failed"
    # The lead's person was erased while this was being sent (the erasure blanked the body and
    # cancelled the delivery under this lock): what the receiver answered may quote them.
    erased = delivery.payload == ERASED_PAYLOAD
    DeliveryAttempt.objects.create(
        delivery=delivery,
        number=number,
        at=now,
        status_code=result.status_code,
        error="" if erased else result.error[:2000],
        duration_ms=ms,
        response_excerpt="" if erased else result.excerpt[: egress.RESPONSE_EXCERPT_CHARS],
        outcome="retry" if next_at else _LOGGED_OUTCOME.get(result.outcome, outcome),
    )
    if delivery.status != DeliveryStatus.PENDING or delivery.attempts != number:
        # Our lease ran out and another attempt took over (or an admin changed the row).
        logger.warning("delivery %s: lease lost by attempt %d", delivery.message_id, number)
        return None
    delivery.last_status_code = result.status_code
    delivery.last_error = result.error
    fields = ["last_status_code", "last_error", "status", "next_attempt_at", "updated_at"]
    audit_data: dict[str, Any] = {
        "channel": delivery.channel,
        "event": delivery.event,
        "message_id": delivery.message_id,
        "recipient": delivery.recipient,
        "endpoint": delivery.endpoint_id,
        "attempts": number,
    }
    if result.status_code is not None:
        audit_data["status_code"] = result.status_code
    if outcome == "delivered":
        delivery.status = DeliveryStatus.DELIVERED
        delivery.delivered_at = now
        delivery.next_attempt_at = None
        fields.append("delivered_at")
        event_record_for_assignment(
            type=EventType.DELIVERED, assignment=delivery.assignment, data=audit_data
        )
    elif next_at is not None:
        delivery.next_attempt_at = next_at
    elif outcome == "cancelled":
        delivery.status = DeliveryStatus.CANCELLED
        delivery.next_attempt_at = None
    else:
        delivery.status = DeliveryStatus.FAILED
        delivery.next_attempt_at = None
        event_record_for_assignment(
            type=EventType.DELIVERY_FAILED,
            assignment=delivery.assignment,
            data={**audit_data, "error": result.error},
        )
    delivery.save(update_fields=fields)
    if result.outcome == "gone" and delivery.endpoint_id is not None:
        endpoint_disable(
            endpoint_id=delivery.endpoint_id,
            reason=f"answered 410 Gone to {delivery.message_id} at {now.isoformat()}",
        )
    return "retry" if next_at else outcome


def endpoint_disable(*, endpoint_id: int, reason: str) -> int:
    """Disable an endpoint (keeping why) and cancel its pending deliveries; returns how many."""
    now = timezone.now()
    with transaction.atomic():
        WebhookEndpoint.objects.filter(pk=endpoint_id, active=True).update(
            active=False, disabled_at=now, disabled_reason=reason, updated_at=now
        )
        cancelled = Delivery.objects.filter(
            endpoint_id=endpoint_id, status=DeliveryStatus.PENDING
        ).update(
            status=DeliveryStatus.CANCELLED,
            next_attempt_at=None,
            last_error=f"endpoint disabled: {reason}",
            updated_at=now,
        )
    logger.warning(
        "webhook endpoint %s disabled (%s); %d cancelled", endpoint_id, reason, cancelled
    )
    return cancelled


def endpoint_send_test(*, endpoint: WebhookEndpoint) -> str:
    """POST a signed ``test`` message to ``endpoint`` now (admin); returns what happened.

    Not an outbox row: nothing is retried or audited. The URL is checked like any delivery's.
    """
    now = timezone.now()
    message_id = f"msg_test_{int(time.time() * 1000)}"
    body = payload_body(
        {"type": "test", "timestamp": now.isoformat(), "data": {"endpoint": endpoint.name}}
    )
    try:
        response = egress.post(
            endpoint.url,
            body=body,
            headers=signing.headers(
                secret=endpoint.secret, message_id=message_id, timestamp=int(time.time()), body=body
            ),
            timeout=settings.DELIVERY_TIMEOUT_SECONDS,
            allow_private=settings.DELIVERY_ALLOW_PRIVATE_URLS,
        )
    except egress.UrlRefused as exc:
        return f"{endpoint.name}: refused: {exc}"
    except TimeoutError:
        return f"{endpoint.name}: timed out after {settings.DELIVERY_TIMEOUT_SECONDS} s"
    except (OSError, http.client.HTTPException) as exc:
        return f"{endpoint.name}: {type(exc).__name__}: {exc}"
    return f"{endpoint.name}: HTTP {response.status} {response.excerpt[:200]}".rstrip()


# --- Sweeping and retrying ----------------------------------------------------------------------


def deliveries_sweep_due(
    *,
    now: datetime | None = None,
    batch_size: int | None = None,
    max_batches: int = 20,
    inline: bool = False,
) -> int:
    """Publish (or, ``inline``, attempt here) the pending deliveries that are due.

    Picks rows due now that no task was published for since they became due, or whose last
    publish is older than ``DELIVERY_REDISPATCH_SECONDS`` (a lost message). Bounded batches,
    ``FOR UPDATE SKIP LOCKED`` on PostgreSQL so concurrent sweepers split the work. Returns the
    number published (or attempted).
    """
    now = now or timezone.now()
    batch_size = batch_size or settings.DELIVERY_SWEEP_BATCH_SIZE
    redispatch_before = now - timedelta(seconds=settings.DELIVERY_REDISPATCH_SECONDS)
    total = 0
    for _ in range(max_batches):
        with transaction.atomic(durable=True):
            due = (
                Delivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
                .filter(
                    Q(dispatched_at__isnull=True)
                    | Q(dispatched_at__lt=F("next_attempt_at"))
                    | Q(dispatched_at__lt=redispatch_before)
                )
                .order_by("next_attempt_at")
            )
            if connection.features.has_select_for_update_skip_locked:
                # The delivery rows only: the join for the assignment's priority must not lock
                # the assignment (a routing or touch transaction writes it).
                due = due.select_for_update(skip_locked=True, of=("self",))
            rows = list(due.values_list("id", "assignment__priority")[:batch_size])
            ids = [delivery_id for delivery_id, _ in rows]
            high = {
                delivery_id
                for delivery_id, priority in rows
                if priority_is_high(priority, settings.HIGH_PRIORITIES)
            }
            done = len(ids) if inline else deliveries_enqueue(ids, high=high)
            if done:
                Delivery.objects.filter(id__in=ids[:done]).update(dispatched_at=now)
        if inline:
            for delivery_id in ids:
                delivery_attempt(delivery_id=delivery_id)
        total += done
        if len(ids) < batch_size or done < len(ids):
            break
    if total:
        logger.info(
            "delivery sweep: %d due delivery(ies) %s", total, "sent" if inline else "queued"
        )
    return total


@transaction.atomic
def deliveries_retry(*, delivery_ids: Sequence[int]) -> int:
    """Make failed (or waiting) deliveries due now, with a fresh deadline; returns how many.

    Delivered and cancelled ones, and webhooks to a disabled endpoint, are left alone.
    """
    now = timezone.now()
    rows = (
        Delivery.objects.filter(
            id__in=list(delivery_ids),
            status__in=(DeliveryStatus.FAILED, DeliveryStatus.PENDING),
        )
        .filter(Q(endpoint__isnull=True) | Q(endpoint__active=True))
        .values_list("id", flat=True)
    )
    ids = list(rows)
    Delivery.objects.filter(id__in=ids).update(
        status=DeliveryStatus.PENDING,
        next_attempt_at=now,
        give_up_at=now + timedelta(seconds=settings.DELIVERY_MAX_AGE_SECONDS),
        dispatched_at=now,
        updated_at=now,
    )
    if ids:
        transaction.on_commit(lambda: deliveries_enqueue(ids), robust=True)
    return len(ids)
