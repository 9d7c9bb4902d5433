"""SLA timers: each breached, untouched assignment is handled exactly once.

``sla_check`` finds active assignments past ``sla_due_at`` with no first touch and no
``SlaBreach`` yet, and hands each to ``assignment_sla_breach``, which — under the lead's row
lock, in one transaction — records the ``SlaBreach`` row (one-to-one with the assignment: a
second one cannot be stored), the ``sla_breached`` event, and what was done about it:

- the deciding rule says ``reassign``: the lead goes to another eligible member of the same
  team (never a rep it already had), chosen under the team's and the rep's row locks, as a
  reassignment row that supersedes the breached one (``reassigned`` event, deliveries), at most
  ``SLA_MAX_REASSIGNMENTS`` times; after that, or with nobody eligible, it stays and the team's
  ``sla`` alert (one per team, ``team:<id>``, counting its kept leads) is raised or updated;
- otherwise the rep and the team's manager are notified (e-mail) and the alert webhook told.

``now`` is injectable everywhere, so tests drive the clock instead of sleeping.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from audit.models import EventType
from audit.services import event_record_for_assignment
from config.logging import log_context
from leads.models import Lead, LeadStatus
from routing.decisions import (
    LiveConfig,
    RulesetNotFound,
    _lock_rep,
    _snapshot,
    assignment_create,
    assignment_sla_due,
    decide_locked,
    live_config,
)
from routing.engine import RuleErrors, rep_is_eligible
from routing.models import Assignment, AssignmentKind, OnSlaBreach, Team
from routing.monitoring.alerts import (
    alert_raise,
    alert_resolve,
    notify_email,
    notify_webhook,
    open_alert_subjects,
)
from routing.monitoring.models import AlertKind, SlaBreach, SlaBreachAction, SlaCheckFailure
from routing.services import schedule_delivery

logger = logging.getLogger(__name__)

__all__ = ["SlaCheckResult", "assignment_sla_breach", "breach_notice_send", "sla_check"]

# The task that sends one breach's e-mail and webhook post (routed to the `delivery` queue).
BREACH_NOTICE_TASK = "delivery.notify_sla_breach"

_clock = time.monotonic  # tests move it


@dataclass
class SlaCheckResult:
    """What one ``sla_check`` did."""

    breached: int = 0
    reassigned: int = 0
    kept: int = 0
    failed: int = 0
    alerts_resolved: int = 0
    out_of_time: bool = False  # stopped at SLA_CHECK_MAX_SECONDS; the next run carries on


FAILING = "failing"  # the subject prefix of an assignment whose SLA check keeps failing


TEAM = "team"  # the subject prefix of a team's leads left with their owners after a breach
_ALERT_LEAD_IDS = 20  # lead ids listed in a team's alert


def _team_subject(team_id: int | None) -> str:
    return f"{TEAM}:{team_id if team_id is not None else 'none'}"


def _kept_breaches(team_key: str) -> QuerySet[SlaBreach]:
    """A team's breached leads kept with their owners and still waiting (current, untouched)."""
    rows = SlaBreach.objects.filter(
        action=SlaBreachAction.KEPT, assignment__active=True, assignment__touched_at__isnull=True
    )
    if team_key == "none":
        return rows.filter(assignment__team__isnull=True)
    return rows.filter(assignment__team_id=int(team_key))


def _team_alert_raise(assignment: Assignment, why: str, now: datetime) -> None:
    """One ``sla`` alert per team for its leads that missed their SLA and stay with their owner:
    opened (notified) with the first, then updated (not notified again) as more join, resolved
    by the end-of-run sweep once none is left. A whole team out of office with hundreds of
    breached leads is one incident, not hundreds."""
    key = str(assignment.team_id) if assignment.team_id is not None else "none"
    kept = _kept_breaches(key)
    count = kept.count()
    lead_ids = [
        str(lead_id)
        for lead_id in kept.order_by("breached_at", "id").values_list("lead_id", flat=True)[
            :_ALERT_LEAD_IDS
        ]
    ]
    team = assignment.team_name or "no team"
    more = f" (and {count - len(lead_ids)} more)" if count > len(lead_ids) else ""
    alert_raise(
        kind=AlertKind.SLA,
        subject=_team_subject(assignment.team_id),
        message=f"{count} lead(s) of {team} missed their SLA and stay with their owners "
        f"(latest: lead {assignment.lead_id} with {assignment.rep_name}: {why}). Someone must "
        f"take them by hand: {', '.join(lead_ids)}{more}.",
        data={"team": assignment.team_id, "count": count, "leads": lead_ids},
        now=now,
    )


def _due(now: datetime) -> QuerySet[Assignment]:
    """Breached, untouched, active assignments not yet handled nor waiting after a failure.

    Read through ``assignment_sla_due_idx`` (partial: active, untouched, with a due time, not
    handled): a handled breach is stamped ``sla_breached_at`` and leaves the index, so the
    query reads the unhandled due rows only, not every assignment ever breached.
    """
    return Assignment.objects.filter(
        active=True,
        touched_at__isnull=True,
        sla_due_at__isnull=False,
        sla_due_at__lte=now,
        sla_breached_at__isnull=True,
    ).exclude(pk__in=SlaCheckFailure.objects.filter(retry_at__gt=now).values("assignment_id"))


def sla_check(
    *,
    now: datetime | None = None,
    batch_size: int | None = None,
    limit: int | None = None,
    max_seconds: float | None = None,
) -> SlaCheckResult:
    """Handle every breached, untouched, active assignment once; resolve cleared ``sla`` alerts.

    Walks the due assignments in ``(sla_due_at, id)`` order, a batch at a time, with a cursor
    that moves past each row whether it succeeded or not: a row that raises is logged at ERROR,
    counted (``SlaCheckFailure``: tried again after a growing pause, an ``sla`` alert after
    ``SLA_CHECK_ALERT_AFTER_FAILURES`` failures) and never holds up the rows behind it. At most
    ``limit`` (``SLA_CHECK_MAX_PER_RUN``) rows a run, and for at most ``max_seconds``
    (``SLA_CHECK_MAX_SECONDS``, below the task's soft time limit); the next run carries on.

    Celery's ``SoftTimeLimitExceeded`` is not a failure of the row being handled: it propagates
    (its transaction rolls back; the row stays due) instead of being recorded against it.
    """
    now = now or timezone.now()
    batch_size = batch_size or settings.SLA_CHECK_BATCH_SIZE
    limit = limit or settings.SLA_CHECK_MAX_PER_RUN
    if max_seconds is None:
        max_seconds = settings.SLA_CHECK_MAX_SECONDS
    deadline = _clock() + max_seconds
    result = SlaCheckResult()
    cursor: tuple[datetime | None, int] | None = None
    seen = 0
    while seen < limit and not result.out_of_time:
        rows = _due(now)
        if cursor is not None:
            rows = rows.filter(
                Q(sla_due_at__gt=cursor[0]) | Q(sla_due_at=cursor[0], pk__gt=cursor[1])
            )
        batch = list(
            rows.order_by("sla_due_at", "id").values_list("sla_due_at", "id", "lead_id")[
                : min(batch_size, limit - seen)
            ]
        )
        if not batch:
            break
        failing = set(
            SlaCheckFailure.objects.filter(assignment_id__in=[row[1] for row in batch]).values_list(
                "assignment_id", flat=True
            )
        )
        for due_at, assignment_id, lead_id in batch:
            if _clock() >= deadline:
                result.out_of_time = True
                break
            cursor = (due_at, assignment_id)
            seen += 1
            with log_context(lead_id=lead_id):  # every line logged meanwhile names the lead
                try:
                    breach = assignment_sla_breach(assignment_id=assignment_id, now=now)
                except SoftTimeLimitExceeded:
                    raise  # the task ran out of time: not this row's fault
                except Exception as exc:  # one bad row must not stop the others
                    logger.exception("SLA check of assignment %s failed", assignment_id)
                    result.failed += 1
                    _record_failure(assignment_id, exc, now)
                    continue
                if assignment_id in failing:
                    _clear_failure(assignment_id, now)
            if breach is None:
                continue
            result.breached += 1
            if breach.action == SlaBreachAction.REASSIGNED:
                result.reassigned += 1
            elif breach.action == SlaBreachAction.KEPT:
                result.kept += 1
    _sweep(result, now)
    if result.out_of_time:
        logger.warning(
            "SLA: stopped after %.0f s with due assignments left; the next run carries on",
            max_seconds,
        )
    if result.breached or result.failed:
        logger.warning(
            "SLA: %d breach(es), %d reassigned, %d kept with an alert, %d failed",
            result.breached,
            result.reassigned,
            result.kept,
            result.failed,
        )
    return result


def _sweep(result: SlaCheckResult, now: datetime) -> None:
    """End of run: forget the failures of assignments no longer due, then resolve the ``sla``
    alerts whose cause is gone (a team's alert once none of its kept leads waits)."""
    no_longer_due = SlaCheckFailure.objects.exclude(
        assignment__in=Assignment.objects.filter(
            active=True, touched_at__isnull=True, sla_breached_at__isnull=True
        )
    )
    if no_longer_due.exists():  # touched, reassigned or handled meanwhile: no longer failing
        no_longer_due.delete()
    for subject in open_alert_subjects(AlertKind.SLA):
        prefix, _, raw_id = subject.partition(":")
        if prefix == TEAM and (raw_id == "none" or raw_id.isdigit()):
            if not _kept_breaches(raw_id).exists() and alert_resolve(
                kind=AlertKind.SLA, subject=subject, now=now
            ):
                result.alerts_resolved += 1
            continue
        # `assignment:<id>` (one lead's alert, before alerts were per team) and `failing:<id>`.
        if prefix not in ("assignment", FAILING) or not raw_id.isdigit():
            continue
        still_open = Assignment.objects.filter(
            pk=int(raw_id), active=True, touched_at__isnull=True
        ).exists()
        if prefix == FAILING:
            still_open = (
                still_open and SlaCheckFailure.objects.filter(assignment_id=int(raw_id)).exists()
            )
        if not still_open and alert_resolve(kind=AlertKind.SLA, subject=subject, now=now):
            result.alerts_resolved += 1


def _failure_pause(failures: int) -> timedelta:
    """One check interval after the first failure, doubling, at most an hour."""
    base = max(1.0, settings.SLA_CHECK_INTERVAL_SECONDS)
    return timedelta(seconds=min(3600.0, base * 2 ** max(0, failures - 1)))


def _record_failure(assignment_id: int, exc: Exception, now: datetime) -> None:
    """Count the failure, pause the row, and raise an alert once it keeps failing; never raises."""
    error = f"{type(exc).__name__}: {exc}"[:2000]
    try:
        with transaction.atomic():
            failure = (
                SlaCheckFailure.objects.select_for_update()
                .filter(assignment_id=assignment_id)
                .first()
            )
            if failure is None:
                if not Assignment.objects.filter(pk=assignment_id).exists():
                    return
                failure = SlaCheckFailure(
                    assignment_id=assignment_id, first_failed_at=now, failures=0
                )
            failure.failures += 1
            failure.last_failed_at = now
            failure.last_error = error
            failure.retry_at = now + _failure_pause(failure.failures)
            failure.save()
            if failure.failures >= settings.SLA_CHECK_ALERT_AFTER_FAILURES:
                logger.error(
                    "SLA check of assignment %s failed %d times: %s",
                    assignment_id,
                    failure.failures,
                    error,
                )
                alert_raise(
                    kind=AlertKind.SLA,
                    subject=f"{FAILING}:{assignment_id}",
                    message=f"The SLA check of assignment {assignment_id} failed "
                    f"{failure.failures} times (last: {error}); its breach is not handled. "
                    f"Retried at {failure.retry_at.isoformat()}.",
                    data={
                        "assignment": assignment_id,
                        "failures": failure.failures,
                        "error": error,
                    },
                    now=now,
                )
    except SoftTimeLimitExceeded:
        raise
    except Exception:  # the database is the problem: the next run tries again
        logger.exception("could not record the SLA check failure of assignment %s", assignment_id)


def _clear_failure(assignment_id: int, now: datetime) -> None:
    """The row was handled (or is no longer due): forget its failures, resolve their alert."""
    if SlaCheckFailure.objects.filter(assignment_id=assignment_id).delete()[0]:
        alert_resolve(kind=AlertKind.SLA, subject=f"{FAILING}:{assignment_id}", now=now)


def _deciding_rule_policy(lead: Lead) -> tuple[int | None, str]:
    """The rule that first routed the lead and its ``on_sla_breach`` (``notify`` if none)."""
    first = (
        Assignment.objects.filter(lead=lead, rule__isnull=False)
        .select_related("rule")
        .order_by("assigned_at", "id")
        .first()
    )
    if first is None or first.rule is None:
        return None, OnSlaBreach.NOTIFY
    return first.rule_id, first.rule.on_sla_breach


def assignment_sla_breach(*, assignment_id: int, now: datetime | None = None) -> SlaBreach | None:
    """Handle one breached assignment exactly once; None when it is not (or no longer) due.

    Safe to call concurrently for the same assignment (two beat schedulers): the lead's row
    lock serialises the callers, and the one-to-one ``SlaBreach`` refuses a second record.
    """
    now = now or timezone.now()
    try:
        with transaction.atomic(durable=True):
            return _breach_locked(assignment_id, now)
    except IntegrityError:
        # A concurrent checker recorded it first (its row is committed): nothing to do.
        if SlaBreach.objects.filter(assignment_id=assignment_id).exists():
            return None
        raise


def _breach_locked(assignment_id: int, now: datetime) -> SlaBreach | None:
    lead_id = Assignment.objects.filter(pk=assignment_id).values_list("lead_id", flat=True).first()
    if lead_id is None:
        return None
    # Under the decide lock shared, like every path that assigns a lead: a reassignment reads
    # one configuration version (routing.decisions.decide_locked).
    lead = decide_locked(Lead.objects.select_for_update(no_key=True).filter(pk=lead_id)).first()
    if lead is None:
        return None
    assignment = (
        Assignment.objects.select_related("rep", "team", "team__manager")
        .filter(
            pk=assignment_id,
            active=True,
            touched_at__isnull=True,
            sla_due_at__isnull=False,
            sla_due_at__lte=now,
        )
        .first()
    )
    if assignment is None or SlaBreach.objects.filter(assignment_id=assignment_id).exists():
        return None
    if _clock_paused_since(assignment, now):
        return None
    breach = SlaBreach.objects.create(
        assignment=assignment, lead=lead, breached_at=now, action=SlaBreachAction.NOTIFIED
    )
    Assignment.objects.filter(pk=assignment.pk).update(sla_breached_at=now)
    rule_id, policy = _deciding_rule_policy(lead)
    overdue = (now - assignment.sla_due_at).total_seconds() if assignment.sla_due_at else 0.0
    event_record_for_assignment(
        type=EventType.SLA_BREACHED,
        assignment=assignment,
        at=now,
        data={
            "sla_minutes": assignment.sla_minutes,
            "sla_due_at": assignment.sla_due_at,
            "overdue_seconds": round(overdue),
            "policy": policy,
        },
    )
    _notify_breach(assignment, now)
    if policy != OnSlaBreach.REASSIGN:
        return breach
    done = SlaBreach.objects.filter(lead=lead, action=SlaBreachAction.REASSIGNED).count()
    limit = settings.SLA_MAX_REASSIGNMENTS
    if done >= limit:
        why = f"already reassigned {done} time(s) for missed SLAs (limit {limit})"
        new = None
    else:
        new, why = _reassign_within_team(lead, assignment, rule_id, now)
    if new is None:
        breach.action = SlaBreachAction.KEPT
        breach.note = why[:2000]
        breach.save(update_fields=["action", "note"])
        _team_alert_raise(assignment, why, now)
        return breach
    breach.action = SlaBreachAction.REASSIGNED
    breach.reassigned_to = new
    breach.note = f"reassigned to {new.rep_name}"
    breach.save(update_fields=["action", "reassigned_to", "note"])
    return breach


def _clock_paused_since(assignment: Assignment, now: datetime) -> bool:
    """In a team that respects working hours, time off planned after the lead was assigned (a
    holiday calendar, a custom day, leave) pauses its SLA clock too: the due time worked out
    again now is stored and, when it is still ahead, the lead is not breached (yet)."""
    team = assignment.team
    if team is None or not team.respect_working_hours or not assignment.sla_minutes:
        return False
    due = assignment_sla_due(
        now=assignment.assigned_at,
        minutes=assignment.sla_minutes,
        rep_id=assignment.rep_id,
        team_id=assignment.team_id,
    )
    if due is None or due <= now:
        return False
    Assignment.objects.filter(pk=assignment.pk).update(sla_due_at=due)
    logger.info(
        "SLA: assignment %s not breached: time off since it was assigned moved its due time to %s",
        assignment.pk,
        due.isoformat(),
    )
    return True


def _team_spec_config() -> LiveConfig | None:
    try:
        return live_config()
    except (RulesetNotFound, RuleErrors):
        return None


def _reassign_within_team(
    lead: Lead, current: Assignment, rule_id: int | None, now: datetime
) -> tuple[Assignment | None, str]:
    """Give the lead to another eligible member of the current team; (None, why) if nobody.

    Locks the team row (as routing does, before any rep), then picks the eligible member who
    never had this lead, fewest open leads first (ties: the team's order), and re-checks them
    under their own row lock. The team's round-robin turn does not move.
    """
    if current.team_id is None:
        return None, "it was not routed through a team"
    config = _team_spec_config()
    team = config.teams.get(current.team_id) if config is not None else None
    if config is None or team is None:
        return None, "no published ruleset knows its team"
    Team.objects.select_for_update(no_key=True).filter(pk=team.id).values_list(
        "pk", flat=True
    ).first()
    had = set(Assignment.objects.filter(lead=lead).values_list("rep_id", flat=True))
    snap = _snapshot(config, now)
    order = {rep_id: position for position, (rep_id, _weight) in enumerate(team.members)}
    candidates = [
        snap.reps[rep_id]
        for rep_id in order
        if rep_id not in had
        and rep_id in snap.reps
        and rep_is_eligible(snap.reps[rep_id], team, now)[0]
    ]
    candidates.sort(key=lambda rep: (rep.open_count, order[rep.id]))
    for candidate in candidates:
        fresh = _lock_rep(config, candidate.id, now)
        if fresh is None or not rep_is_eligible(fresh, team, now)[0]:
            continue
        return _reassign(lead, current, fresh.id, fresh.name, rule_id, now), ""
    return None, f"no other eligible member of {team.name} who has not had this lead"


def _reassign(
    lead: Lead, current: Assignment, rep_id: int, rep_name: str, rule_id: int | None, now: datetime
) -> Assignment:
    sla = current.sla_minutes or settings.DEFAULT_SLA_MINUTES or None
    assignment = assignment_create(
        lead=lead,
        rep_id=rep_id,
        rep_name=rep_name,
        team_id=current.team_id,
        team_name=current.team_name,
        rule_id=rule_id,
        rule_name=current.rule_name,
        ruleset_version=current.ruleset_version,
        kind=AssignmentKind.REASSIGNMENT,
        supersede=current,
        reason=f"SLA of {current.sla_minutes} min missed by {current.rep_name}: reassigned "
        f"within {current.team_name}",
        sla_minutes=sla,
        now=now,
    )
    if lead.status not in (LeadStatus.ASSIGNED, LeadStatus.DUPLICATE):
        lead.status = LeadStatus.ASSIGNED
        lead.save(update_fields=["status"])
    event_record_for_assignment(
        type=EventType.REASSIGNED,
        assignment=assignment,
        at=now,
        data={
            "manual": False,
            "reason": "sla_breached",
            "from": {"id": current.rep_id, "name": current.rep_name},
        },
    )
    schedule_delivery(assignment=assignment, event=EventType.REASSIGNED)
    return assignment


def _notify_breach(assignment: Assignment, now: datetime) -> None:
    """The rep and the team's manager by e-mail, and the alert webhook: queued after commit.

    Sent by a task on the ``delivery`` queue (``breach_notice_send``), not here: an SMTP server
    or a webhook that hangs (up to their timeouts each) would otherwise make a mass breach
    crawl through ``check_sla`` and into its time limit.
    """
    rep_email = assignment.rep.email if assignment.rep_id else ""
    manager = assignment.team.manager if assignment.team is not None else None
    recipients = [address for address in [rep_email, getattr(manager, "email", "")] if address]
    due = assignment.sla_due_at.isoformat() if assignment.sla_due_at else "?"
    lead_id: uuid.UUID = assignment.lead_id
    text = (
        f":alarm_clock: SLA missed: lead {lead_id} assigned to {assignment.rep_name}"
        f"{f' ({assignment.team_name})' if assignment.team_name else ''} was not touched "
        f"by {due}."
    )
    payload = {
        "event": "sla.breached",
        "lead": str(lead_id),
        "assignment": assignment.pk,
        "rep": {"id": assignment.rep_id, "name": assignment.rep_name},
        "team": assignment.team_name or None,
        "sla_due_at": due,
        "at": now.isoformat(),
    }

    notice = {
        "subject": f"[LeadRouter] SLA missed: lead {lead_id}",
        "text": text,
        "recipients": recipients,
        "payload": payload,
    }
    transaction.on_commit(lambda: _queue_breach_notice(notice), robust=True)


def _queue_breach_notice(notice: dict[str, Any]) -> None:
    """Publish the notice's task; if the broker refuses it, send it here rather than lose it."""
    from config.celery import app as celery_app

    try:
        celery_app.send_task(BREACH_NOTICE_TASK, kwargs=notice, retry=False)
    except Exception as exc:
        logger.warning(
            "could not queue the SLA breach notification (%s: %s); sending it now",
            type(exc).__name__,
            exc,
        )
        breach_notice_send(**notice)


def breach_notice_send(
    *, subject: str, text: str, recipients: list[str], payload: dict[str, Any]
) -> None:
    """Send one breach notification: e-mail to the rep and manager, the alert webhook."""
    notify_email(subject=subject, body=text, recipients=recipients)
    notify_webhook(text=text, payload=payload)
