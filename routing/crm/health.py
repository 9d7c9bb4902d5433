"""Each CRM connection's health: what the calls learnt, and the alert that follows from it.

Every stage reports what a call came to: ``crm_record_ok`` (at most one write per
``CRM_OK_WRITE_SECONDS``, so a busy pipeline does not write the row on every call) and
``crm_record_error`` (the error's kind and message, never a credential). The beat job
``crm_health_check`` turns that into one alert per connection (kind ``crm``, subject the
connection's name):

- ``auth`` or ``config``: the credential is expired, revoked or missing a scope — at once;
- the CRM down: failures (timeouts, 5xx, refused connections, unusable answers) and no success
  for ``CRM_DOWN_ALERT_SECONDS``;
- a rate limit that never clears: the vendor answering 429 (or its daily limit) and no success
  for ``CRM_RATE_LIMIT_ALERT_SECONDS``.

While a problem is open, and when the connection has not answered for
``CRM_HEALTH_PROBE_SECONDS``, the check probes it itself (``check()``: one row of each thing
the stages read, so a scope or permission missing for one of them is found), so the alert
resolves by itself once the CRM answers again even when no lead is calling it. Leads are
accepted and routed (without the CRM) all the while; ``/readyz`` does not look at any of this.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from routing.crm.base import CrmError
from routing.crm.models import CrmConnection

logger = logging.getLogger(__name__)

_FAILURE_KINDS = ("unavailable", "malformed")


# When this process last wrote a success per connection: a busy worker writes it every
# CRM_OK_WRITE_SECONDS at most, not once per call.
_ok_written: dict[int, float] = {}


def crm_record_ok(connection: CrmConnection, *, now: datetime | None = None) -> None:
    """A call succeeded: clear the connection's error (cheaply, at most every few seconds)."""
    clock = time.monotonic()
    last = _ok_written.get(connection.pk)
    if last is not None and clock - last < settings.CRM_OK_WRITE_SECONDS:
        return
    _ok_written[connection.pk] = clock
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.CRM_OK_WRITE_SECONDS)
    updated = (
        CrmConnection.objects.filter(pk=connection.pk)
        .filter(
            Q(last_ok_at__isnull=True)
            | Q(last_ok_at__lt=stale)
            | Q(last_error_at__isnull=False, last_error_at__gte=F("last_ok_at"))
        )
        .update(last_ok_at=now)
    )
    if updated:
        connection.last_ok_at = now


def crm_record_error(connection: CrmConnection, error: CrmError, *, lead_id: object = None) -> None:
    """A call failed in a way that says something about the CRM (not our own rate limit)."""
    if error.kind == "rate_limited" and error.status is None:
        return  # our own budget said wait: the CRM is fine
    if error.kind == "rejected":
        return  # about one request, not the connection
    _ok_written.pop(connection.pk, None)  # the next success clears it at once
    now = timezone.now()
    message = str(error)[:1000]
    since = (
        CrmConnection.objects.filter(pk=connection.pk)
        .values_list("last_error_kind", "problem_since", "last_ok_at", "last_error_at")
        .first()
    )
    problem_since: datetime = now
    if since is not None:
        kind, started, last_ok, last_error = since
        ongoing = started is not None and (last_ok is None or (last_error and last_error > last_ok))
        if ongoing and started is not None and _family(kind) == _family(error.kind):
            problem_since = started
    CrmConnection.objects.filter(pk=connection.pk).update(
        last_error=message,
        last_error_kind=error.kind,
        last_error_permission=error.permission,
        last_error_at=now,
        problem_since=problem_since,
    )
    logger.warning(
        "CRM %s (%s) call failed: %s",
        connection.name,
        connection.kind,
        message,
        extra={"lead_id": str(lead_id) if lead_id else None, "crm": connection.kind},
    )


def _family(kind: str) -> str:
    if kind in ("auth", "config"):
        return "auth"
    if kind in _FAILURE_KINDS:
        return "down"
    return kind


def connection_problem(connection: CrmConnection, *, now: datetime) -> tuple[str, str] | None:
    """(family, message) of the problem that should be an alert now, or None."""
    last_error = connection.last_error_at
    if last_error is None or (connection.last_ok_at and connection.last_ok_at > last_error):
        return None
    family = _family(connection.last_error_kind)
    since = connection.problem_since or last_error
    lasted = (now - since).total_seconds()
    name = f"{connection.name} ({connection.get_kind_display()})"
    if family == "auth":
        return family, (
            f"CRM connection {name}: the credential was refused or lacks a permission "
            f"({connection.last_error}). Leads are routed without the CRM until it answers "
            "again. Grant what is missing (the scopes and permissions in docs/operations.md) "
            "or save a new token or key on the connection (Admin → CRM connections)."
        )
    if family == "down" and lasted >= settings.CRM_DOWN_ALERT_SECONDS:
        return family, (
            f"CRM connection {name} has been failing for {int(lasted)} s "
            f"({connection.last_error}). Leads are routed without it; write-backs wait in "
            "the outbox and are sent when it answers."
        )
    if family == "rate_limited" and lasted >= settings.CRM_RATE_LIMIT_ALERT_SECONDS:
        return family, (
            f"CRM connection {name} has been rate limited by the CRM for {int(lasted)} s "
            f"({connection.last_error}). Another integration may be using the same quota; "
            "lower the connection's rate or raise the CRM's limit."
        )
    return None


def _probe(connection: CrmConnection) -> bool:
    """One cheap call; records its outcome. True when the CRM answered."""
    from routing.crm.connections import crm_client
    from routing.crm.limits import spender

    try:
        # The check makes a few calls (one per object the stages read): it may wait a few
        # seconds for their tokens, like the other batch jobs.
        crm_client(connection, spend=spender(connection, wait_seconds=5.0)).check()
    except CrmError as exc:
        crm_record_error(connection, exc)
        return False
    except Exception as exc:  # a bug in a module must not stop the check of the others
        crm_record_error(connection, CrmError("unavailable", f"{type(exc).__name__}: {exc}"))
        return False
    crm_record_ok(connection, now=timezone.now())
    return True


def crm_health_check(*, now: datetime | None = None, probe: bool = True) -> dict[str, str]:
    """Open, refresh or resolve each connection's alert; {connection name: problem} open now."""
    from routing.monitoring.alerts import alert_raise, alert_resolve, open_alert_subjects
    from routing.monitoring.models import AlertKind

    now = now or timezone.now()
    open_now: dict[str, str] = {}
    quiet = timedelta(seconds=settings.CRM_HEALTH_PROBE_SECONDS)
    for connection in CrmConnection.objects.filter(active=True).order_by("id"):
        problem = connection_problem(connection, now=now)
        idle = connection.last_ok_at is None or now - connection.last_ok_at > quiet
        erred = connection.last_error_at is not None and (
            connection.last_ok_at is None or connection.last_error_at > connection.last_ok_at
        )
        if probe and (erred or idle):
            # Whatever the probe came to (a first failure of an idle connection too) is the
            # problem now.
            _probe(connection)
            connection.refresh_from_db()
            problem = connection_problem(connection, now=timezone.now())
        if problem is None:
            continue
        family, message = problem
        open_now[connection.name] = family
        alert_raise(
            kind=AlertKind.CRM,
            subject=connection.name,
            message=message,
            data={
                "connection": connection.pk,
                "kind": connection.kind,
                "problem": family,
                "error_kind": connection.last_error_kind,
            },
            now=now,
        )
    for subject in open_alert_subjects(AlertKind.CRM) - set(open_now):
        alert_resolve(kind=AlertKind.CRM, subject=subject, now=now)
    return open_now
