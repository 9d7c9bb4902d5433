"""Reps becoming unavailable: every path (the rep's form, bulk actions, an import, a planned
absence starting) calls ``reps_away_reroute``, which re-routes their untouched leads.

A few leads are re-routed at once; more become a background ``AdminJob`` with progress. Leads
of a team that chose ``keep_leads_when_rep_away`` stay with the rep. ``reps_available`` tells
which reps may take a lead now (active, not out of office, not on leave, no holiday), so a
caller compares it before and after its change and passes the reps that were lost.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Lower
from django.utils import timezone

from audit.config_changes import config_change_record, stored_values, values_of
from routing.decisions import sla_clocks_refresh
from routing.models import AdminJob, AdminJobKind, Assignment, Rep
from routing.timeoff.availability import reps_available
from routing.timeoff.facts import time_off_facts
from routing.timeoff.models import HolidayCalendar, RepAbsence, RepHolidayStart

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

logger = logging.getLogger(__name__)


def rep_lock_for_absences(*, rep_id: int) -> None:
    """Lock a rep's row until the transaction ends: whoever checks and saves their absences."""
    list(Rep.objects.select_for_update().filter(pk=rep_id).values_list("pk", flat=True))


@transaction.atomic
def rep_absence_save(*, absence: RepAbsence, actor: str) -> RepAbsence:
    """Save a planned absence that overlaps none of the rep's others (audited).

    Raises ``ValidationError`` (``RepAbsence.clean``'s messages) when it is invalid. The rep's
    row is locked first, so two overlapping absences saved at once are checked one after the
    other: the second sees the first and is refused (PostgreSQL; SQLite serialises writers).
    """
    rep_lock_for_absences(rep_id=absence.rep_id)
    before = stored_values(absence) if absence.pk is not None else None
    absence.full_clean()
    absence.save()
    sla_clocks_refresh(rep_ids=[absence.rep_id])  # leave planned later pauses running clocks
    config_change_record(
        actor=actor,
        obj=absence,
        action="added" if before is None else "changed",
        before=before,
        after=values_of(absence),
    )
    return absence


@transaction.atomic
def rep_absence_cancel(*, rep_id: int, absence_id: int, actor: str) -> bool:
    """Cancel one of the rep's planned absences that has not started yet (audited).

    False when there is no such absence of this rep, or it has started (an absence under way
    is ended by RevOps, whose change re-routes or keeps the rep's leads as the team says).
    """
    rep_lock_for_absences(rep_id=rep_id)
    absence = RepAbsence.objects.filter(
        pk=absence_id, rep_id=rep_id, starts_at__gt=timezone.now()
    ).first()
    if absence is None:
        return False
    config_change_record(actor=actor, obj=absence, action="deleted", before=stored_values(absence))
    absence.delete()
    sla_clocks_refresh(rep_ids=[rep_id])  # the clocks it paused run through it again
    return True


def untouched_leads_to_move(rep_id: int) -> Any:
    """The lead ids a rep holds untouched, outside teams that keep an away rep's leads."""
    return (
        Assignment.objects.filter(rep_id=rep_id, active=True, touched_at__isnull=True)
        .exclude(team__keep_leads_when_rep_away=True)
        .order_by("assigned_at", "id")
        .values_list("lead_id", flat=True)
    )


def _user(actor: AbstractBaseUser | None) -> Any:
    return actor if actor is not None and actor.pk is not None else None


@dataclass(frozen=True, slots=True)
class AwayReroute:
    """What ``reps_away_reroute`` did: leads moved and kept now, or the job that will."""

    moved: int = 0
    kept: int = 0
    job: AdminJob | None = None
    disabled: bool = False


def reps_away_reroute(
    *,
    rep_ids: Collection[int],
    actor: str,
    reason: str,
    requested_by: AbstractBaseUser | None = None,
) -> AwayReroute:
    """Re-route the untouched leads of reps who just became unavailable (``reason`` says why).

    Off when ``REROUTE_OPEN_LEADS_ON_ABSENCE`` is false. Up to ``REROUTE_INLINE_MAX_LEADS``
    leads in all are routed again now (each in its own transaction); more become one
    background job (``maintenance.admin_job``) whose progress the admin shows. Each move is a
    ``reassigned`` event; each rep a ``config_changed`` event naming the job or the counts.
    """
    if not settings.REROUTE_OPEN_LEADS_ON_ABSENCE:
        return AwayReroute(disabled=True)
    ids = sorted(set(rep_ids))
    if not ids:
        return AwayReroute()
    total = sum(untouched_leads_to_move(rep_id).count() for rep_id in ids)
    if total > settings.REROUTE_INLINE_MAX_LEADS:
        with transaction.atomic():
            job = AdminJob.objects.create(
                kind=AdminJobKind.REROUTE_AWAY,
                requested_by=_user(requested_by),
                params={"rep_ids": ids, "actor": actor, "reason": reason},
                progress_total=total,
            )
            for rep in Rep.objects.filter(pk__in=ids):
                config_change_record(
                    actor=actor,
                    obj=rep,
                    action="reroute_away",
                    extra={"reason": reason, "job": job.pk, "leads": total},
                )
            from routing.tasks import admin_job

            transaction.on_commit(lambda: admin_job.delay(job.pk))
        return AwayReroute(job=job)
    moved, kept = reps_away_reroute_run(rep_ids=ids, actor=actor, reason=reason)
    with transaction.atomic():
        for rep in Rep.objects.filter(pk__in=ids):
            config_change_record(
                actor=actor,
                obj=rep,
                action="reroute_away",
                extra={"reason": reason, "moved": moved, "kept": kept},
            )
    return AwayReroute(moved=moved, kept=kept)


def reps_away_reroute_run(
    *, rep_ids: Iterable[int], actor: str, reason: str, progress: Any = None
) -> tuple[int, int]:
    """Route again, lead by lead, what the reps hold untouched; (moved, kept)."""
    from routing.services import rep_reroute_open_leads

    ids = list(rep_ids)
    total = sum(untouched_leads_to_move(rep_id).count() for rep_id in ids)
    moved = kept = 0
    for rep_id in ids:
        report = rep_reroute_open_leads(
            rep_id=rep_id,
            actor=actor,
            reason=reason,
            limit=None,
            progress=_offset(progress, moved + kept, total),
        )
        moved += report.moved
        kept += report.kept
    return moved, kept


@contextlib.contextmanager
def reps_became_unavailable_after(*, emails: Iterable[str], actor: str, why: str) -> Iterator[None]:
    """Around a change of reps by e-mail (an import): after it commits, re-route the
    untouched leads of those who were available before it and are not after it."""
    keys = [email.strip().lower() for email in emails]
    ids = set(
        Rep.objects.annotate(key=Lower("email")).filter(key__in=keys).values_list("id", flat=True)
    )
    was = reps_available(rep_ids=ids)
    yield
    lost = was - reps_available(rep_ids=was)
    if lost:
        names = ", ".join(
            Rep.objects.filter(pk__in=lost).order_by("name").values_list("name", flat=True)
        )
        transaction.on_commit(
            lambda: reps_away_reroute(rep_ids=lost, actor=actor, reason=f"{names} {why}")
        )


def _offset(progress: Any, base: int, total: int) -> Callable[[int, int], None] | None:
    if progress is None:
        return None

    def report(done: int, _of: int) -> None:
        progress(base + done, total)

    return report


def absences_start_due(*, now: datetime | None = None) -> int:
    """Beat: re-route the leads of reps whose planned absence has started (each absence once).

    Returns how many absences it handled. An absence is marked handled only after its re-route
    has run (or its background job was created and sent): one whose re-route fails stays
    unhandled, is logged, and the next run tries it again. Another run doing the same absence
    at the same time is harmless (each lead moves once, under its lock). An absence whose start
    passed while beat was down is handled late, as long as it has not ended.
    """
    now = now or timezone.now()
    handled = 0
    due = list(
        RepAbsence.objects.filter(
            starts_at__lte=now, ends_at__gt=now, started_handled_at__isnull=True
        )
        .select_related("rep")
        .order_by("starts_at", "id")[:200]
    )
    for absence in due:
        local = absence.ends_at.astimezone(_zone(absence.rep.timezone))
        try:
            reps_away_reroute(
                rep_ids=[absence.rep_id],
                actor="system",
                reason=f"{absence.rep.name} on leave until {local:%Y-%m-%d %H:%M} {local.tzname()}",
            )
        except Exception:
            logger.exception("Re-routing for absence %s failed; the next run retries", absence.pk)
            continue
        handled += RepAbsence.objects.filter(pk=absence.pk, started_handled_at__isnull=True).update(
            started_handled_at=now
        )
    return handled


def holidays_start_due(*, now: datetime | None = None) -> int:
    """Beat, with ``absences_start_due``: a holiday beginning (the rep's local day, a country's
    or a custom day) makes the rep unavailable like an absence starting, so their untouched
    leads are re-routed (or kept, per team), audited, once per rep and day.

    Returns how many (rep, day) it handled. A day is marked handled (``RepHolidayStart``) only
    after its re-route ran or its background job was sent; one that fails is logged and tried
    again on the next run, as long as the day lasts. Inactive reps are skipped (nothing of
    theirs is waiting), as is everything when no holiday calendar exists.
    """
    from routing.models import TeamMembership

    now = now or timezone.now()
    if not HolidayCalendar.objects.exists():
        return 0
    members: dict[int, list[int]] = {}
    for team_id, rep_id in TeamMembership.objects.values_list("team_id", "rep_id"):
        members.setdefault(team_id, []).append(rep_id)
    off = time_off_facts(now=now, team_members=members)
    reps = {
        rep.pk: rep
        for rep in Rep.objects.filter(
            pk__in=[rep_id for rep_id, facts in off.items() if facts.holidays], active=True
        )
    }
    handled = 0
    for rep_id, rep in sorted(reps.items()):
        day = now.astimezone(_zone(rep.timezone)).date()
        holiday = off[rep_id].holidays.get(day)
        if holiday is None or RepHolidayStart.objects.filter(rep_id=rep_id, date=day).exists():
            continue
        try:
            reps_away_reroute(
                rep_ids=[rep_id], actor="system", reason=f"{rep.name}: {holiday.label} ({day})"
            )
        except Exception:
            logger.exception(
                "Re-routing for %s's holiday on %s failed; the next run retries", rep.pk, day
            )
            continue
        _, created = RepHolidayStart.objects.get_or_create(
            rep_id=rep_id, date=day, defaults={"name": holiday.label[:200], "handled_at": now}
        )
        handled += int(created)
    return handled


def _zone(name: str) -> Any:
    from routing.engine.availability import zone_named

    return zone_named(name) or timezone.get_default_timezone()
