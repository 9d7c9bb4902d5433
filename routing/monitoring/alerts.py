"""Alerts: raise (idempotent while open), resolve, and tell people once each way.

An alert is one row per (kind, subject) while it is open; a partial unique constraint makes a
second open row impossible, so two checkers racing each other cannot open it twice. Only the
call that opens (or resolves) the row notifies, after its transaction commits: an ERROR log, a
Sentry message when Sentry is initialised, the alert webhook (``ALERT_WEBHOOK_URL``) and e-mail
to ``ALERT_EMAILS``. A notification that fails is logged and never raises: the alert row stays
the source of truth, visible in the admin and ``GET /api/v1/alerts/``.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.utils import timezone

from routing.delivery import egress
from routing.monitoring.models import Alert, AlertStatus

logger = logging.getLogger(__name__)

__all__ = ["alert_raise", "alert_resolve", "notify_email", "notify_webhook"]


def _plain(data: dict[str, Any] | None) -> dict[str, Any]:
    return json.loads(json.dumps(data or {}, cls=DjangoJSONEncoder))


def _label(kind: str, subject: str) -> str:
    return f"{kind}:{subject}" if subject else kind


def alert_raise(
    *,
    kind: str,
    subject: str = "",
    message: str,
    data: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Alert:
    """Open the (kind, subject) alert, or refresh it (``last_seen_at``, message) if open.

    Opening logs at ERROR, sends a Sentry message when configured and notifies once, after
    commit. Refreshing notifies nobody.
    """
    now = now or timezone.now()
    subject = subject[:200]
    with transaction.atomic():
        existing = (
            Alert.objects.select_for_update()
            .filter(kind=kind, subject=subject, status=AlertStatus.OPEN)
            .first()
        )
        if existing is None:
            try:
                with transaction.atomic():
                    alert = Alert.objects.create(
                        kind=kind,
                        subject=subject,
                        status=AlertStatus.OPEN,
                        message=message,
                        data=_plain(data),
                        opened_at=now,
                        last_seen_at=now,
                    )
            except IntegrityError:
                # Another checker opened it between our read and our insert: refresh theirs.
                existing = (
                    Alert.objects.select_for_update()
                    .filter(kind=kind, subject=subject, status=AlertStatus.OPEN)
                    .first()
                )
                if existing is None:
                    raise
            else:
                _announce(alert, opened=True)
                return alert
        existing.last_seen_at = now
        existing.message = message
        existing.data = _plain(data)
        existing.save(update_fields=["last_seen_at", "message", "data"])
        return existing


def alert_resolve(
    *, kind: str, subject: str = "", now: datetime | None = None, clear_for: float = 0.0
) -> Alert | None:
    """Resolve the open (kind, subject) alert, if any, and notify once; None when none is open.

    ``clear_for``: resolve only once the condition has not been seen for that many seconds
    (``last_seen_at``), so a condition hovering at its threshold does not open and resolve,
    with a notification each time, on every check.
    """
    now = now or timezone.now()
    with transaction.atomic():
        alert = (
            Alert.objects.select_for_update()
            .filter(kind=kind, subject=subject[:200], status=AlertStatus.OPEN)
            .first()
        )
        if alert is None:
            return None
        if clear_for and (now - alert.last_seen_at).total_seconds() < clear_for:
            return None  # not clear long enough yet
        alert.status = AlertStatus.RESOLVED
        alert.resolved_at = now
        alert.last_seen_at = now
        alert.save(update_fields=["status", "resolved_at", "last_seen_at"])
        _announce(alert, opened=False)
        return alert


def open_alert_subjects(kind: str) -> set[str]:
    """The subjects of the open alerts of ``kind`` (to resolve those that cleared)."""
    return set(
        Alert.objects.filter(kind=kind, status=AlertStatus.OPEN).values_list("subject", flat=True)
    )


# --- Notifications ------------------------------------------------------------------------------


def _announce(alert: Alert, *, opened: bool) -> None:
    """Log, report and notify once the opening (or resolution) is committed."""
    label = _label(alert.kind, alert.subject)
    if opened:
        text = f":rotating_light: LeadRouter alert [{label}]: {alert.message}"
    else:
        text = f":white_check_mark: LeadRouter alert resolved [{label}]: {alert.message}"
    payload = {
        "event": "alert.opened" if opened else "alert.resolved",
        "alert": {
            "id": alert.pk,
            "kind": alert.kind,
            "subject": alert.subject,
            "status": alert.status,
            "message": alert.message,
            "opened_at": alert.opened_at,
            "resolved_at": alert.resolved_at,
            "data": alert.data,
        },
    }
    subject = (
        f"[LeadRouter] {'ALERT' if opened else 'Resolved'}: {label}"
        f" - {alert.message.splitlines()[0] if alert.message else ''}"
    )[:200]
    body = f"{text}\n\nOpened at {alert.opened_at.isoformat()}" + (
        f"\nResolved at {alert.resolved_at.isoformat()}" if alert.resolved_at else ""
    )

    def send() -> None:
        if opened:
            logger.error("ALERT opened [%s]: %s", label, alert.message)
            _sentry_message(f"LeadRouter alert [{label}]: {alert.message}")
        else:
            logger.warning("ALERT resolved [%s]: %s", label, alert.message)
        notify_webhook(text=text, payload=payload)
        notify_email(subject=subject, body=body, recipients=list(settings.ALERT_EMAILS))

    transaction.on_commit(send, robust=True)


def _sentry_message(message: str) -> None:
    try:
        import sentry_sdk

        if sentry_sdk.is_initialized():
            sentry_sdk.capture_message(message, level="error")
    except Exception:  # never let reporting break the check that raised the alert
        logger.warning("could not send the alert to Sentry", exc_info=True)


def notify_webhook(*, text: str, payload: dict[str, Any]) -> bool:
    """POST to ``ALERT_WEBHOOK_URL`` (Slack ``{"text"}`` or our JSON); False when it failed."""
    url = settings.ALERT_WEBHOOK_URL
    if not url:
        return False
    document = {"text": text} if settings.ALERT_WEBHOOK_FORMAT == "slack" else {**payload}
    if settings.ALERT_WEBHOOK_FORMAT != "slack":
        document["text"] = text
    body = json.dumps(document, cls=DjangoJSONEncoder).encode()
    try:
        response = egress.post(
            url,
            body=body,
            headers={},
            timeout=settings.ALERT_WEBHOOK_TIMEOUT_SECONDS,
            allow_private=settings.ALERT_ALLOW_PRIVATE_URLS,
        )
    except Exception as exc:  # refused URL, network error: logged, never raised
        logger.warning("alert webhook failed: %s: %s", type(exc).__name__, exc)
        return False
    if not 200 <= response.status < 300:
        logger.warning("alert webhook answered HTTP %s: %s", response.status, response.excerpt)
        return False
    return True


def notify_email(*, subject: str, body: str, recipients: list[str]) -> bool:
    """Send one e-mail to ``recipients``; False when there are none or it failed."""
    recipients = [address for address in recipients if address]
    if not recipients:
        return False
    try:
        send_mail(subject, body, None, recipients, fail_silently=False)
    except Exception as exc:  # an SMTP outage must not break the check
        logger.warning("alert e-mail failed: %s: %s", type(exc).__name__, exc)
        return False
    return True
