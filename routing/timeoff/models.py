"""Time off: reps' planned absences and holiday calendars (public holidays plus custom days).

An absence is stored as two aware moments; RevOps enter them in the rep's time zone (the admin
converts). A holiday calendar is a country's public holidays (the ``holidays`` package,
optionally one subdivision) plus custom days, applied to the reps and to the members of the
teams it names; a holiday is a whole local day in the rep's own time zone.
"""

from __future__ import annotations

import functools
from typing import Any

import holidays as holidays_package
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q
from django.utils import timezone as dj_timezone

__all__ = [
    "HolidayCalendar",
    "HolidayCalendarDay",
    "RepAbsence",
    "RepAbsencePast",
    "RepHolidayStart",
    "RepStateChange",
]


@functools.cache
def supported_countries() -> dict[str, tuple[str, ...]]:
    """Country code -> its subdivision codes, as the ``holidays`` package knows them."""
    return {
        code: tuple(subdivisions)
        for code, subdivisions in holidays_package.list_supported_countries().items()
    }


def holiday_country_errors(country: str, subdivision: str) -> dict[str, str]:
    """Problems with a calendar's country and subdivision (empty when they are valid)."""
    known = supported_countries()
    if country not in known:
        return {"country": f'"{country}" is no country the holidays package knows (ISO alpha-2).'}
    if subdivision and subdivision not in known[country]:
        choices = ", ".join(known[country]) or "none"
        return {"subdivision": f'{country} has no subdivision "{subdivision}" (known: {choices}).'}
    return {}


class RepAbsence(models.Model):
    """A rep's planned time off, from ``starts_at`` (inclusive) to ``ends_at`` (exclusive)."""

    rep = models.ForeignKey("routing.Rep", on_delete=models.CASCADE, related_name="absences")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    note = models.CharField(max_length=200, blank=True)
    # When the beat job saw it start and re-routed the rep's untouched leads (once).
    started_handled_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("rep", "starts_at", "id")
        verbose_name = "planned absence"
        constraints = [
            models.CheckConstraint(
                condition=Q(ends_at__gt=F("starts_at")), name="rep_absence_ends_after_start"
            ),
        ]
        indexes = [models.Index(fields=("ends_at",), name="rep_absence_ends_idx")]

    def __str__(self) -> str:
        return f"{self.rep_id}: {self.starts_at:%Y-%m-%d %H:%M} - {self.ends_at:%Y-%m-%d %H:%M}"

    def clean(self) -> None:
        if self.starts_at is None or self.ends_at is None:
            return
        if self.ends_at <= self.starts_at:
            raise ValidationError({"ends_at": "The absence must end after it starts."})
        if self._state.adding and self.ends_at <= dj_timezone.now():
            raise ValidationError({"ends_at": "This absence is already over: plan future ones."})
        if self.rep_id is None:
            return
        overlapping = (
            RepAbsence.objects.filter(
                rep_id=self.rep_id, starts_at__lt=self.ends_at, ends_at__gt=self.starts_at
            )
            .exclude(pk=self.pk)
            .first()
        )
        if overlapping is not None:
            raise ValidationError(
                f"It overlaps the absence from {overlapping.starts_at:%Y-%m-%d %H:%M} to "
                f"{overlapping.ends_at:%Y-%m-%d %H:%M} UTC: change that one to cover both."
            )


class HolidayCalendar(models.Model):
    """A country's public holidays (and a subdivision's) plus custom days, for reps and teams."""

    name = models.CharField(max_length=200, unique=True)
    country = models.CharField(
        max_length=2, blank=True, help_text="ISO 3166-1 alpha-2, e.g. DE; empty = custom only."
    )
    subdivision = models.CharField(
        max_length=16, blank=True, help_text="e.g. BY (Bavaria), NSW, CA; empty = the country's."
    )
    reps = models.ManyToManyField(
        "routing.Rep", blank=True, related_name="holiday_calendars", help_text="Reps it covers."
    )
    teams = models.ManyToManyField(
        "routing.Team",
        blank=True,
        related_name="holiday_calendars",
        help_text="Its holidays are every member's days off, whatever team routes the lead.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("name",)
        constraints = [
            models.CheckConstraint(condition=~Q(name=""), name="holiday_calendar_name_not_empty"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        self.country = (self.country or "").strip().upper()
        self.subdivision = (self.subdivision or "").strip().upper()
        if not self.country:
            if self.subdivision:
                raise ValidationError({"subdivision": "A subdivision needs a country."})
            return
        errors: dict[str, Any] = holiday_country_errors(self.country, self.subdivision)
        if errors:
            raise ValidationError(errors)


class HolidayCalendarDay(models.Model):
    """A custom day off in a calendar (a company day, a local festival)."""

    calendar = models.ForeignKey(HolidayCalendar, on_delete=models.CASCADE, related_name="days")
    date = models.DateField()
    name = models.CharField(max_length=200)

    class Meta:
        ordering = ("calendar", "date")
        constraints = [
            models.UniqueConstraint(fields=("calendar", "date"), name="holiday_day_unique_date"),
            models.CheckConstraint(condition=~Q(name=""), name="holiday_day_name_not_empty"),
        ]

    def __str__(self) -> str:
        return f"{self.date}: {self.name}"


class RepHolidayStart(models.Model):
    """A holiday of a rep that has begun (their local day), handled once by the beat job that
    handles absences starting: the rep's untouched leads were re-routed (or kept, per team)."""

    rep = models.ForeignKey("routing.Rep", on_delete=models.CASCADE, related_name="holiday_starts")
    date = models.DateField(help_text="The holiday's local date in the rep's time zone.")
    name = models.CharField(max_length=200, help_text="As the trace reads it.")
    handled_at = models.DateTimeField()

    class Meta:
        ordering = ("rep", "date")
        verbose_name = "holiday start"
        constraints = [
            models.UniqueConstraint(fields=("rep", "date"), name="rep_holiday_start_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.rep_id}: {self.date} ({self.name})"


class RepStateChange(models.Model):
    """One change of a rep's live state (``active``, ``out_of_office_until``), as it was before
    and after, and when. Written by database triggers (``routing.timeoff.state_history``) on
    every insert and every update of those columns, whatever made it: the rep's form, a bulk
    action, an import, the roster API, a queryset ``update()``. Replays read it to decide a
    past lead with each rep as they were when the lead arrived (``rep_states_at``)."""

    rep = models.ForeignKey(
        "routing.Rep", on_delete=models.CASCADE, related_name="state_changes", db_constraint=False
    )
    at = models.DateTimeField()
    was_active = models.BooleanField()
    was_out_of_office_until = models.DateTimeField(null=True, blank=True)
    active = models.BooleanField()
    out_of_office_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("rep", "at", "id")
        verbose_name = "rep state change"
        indexes = [models.Index(fields=("at",), name="rep_state_change_at_idx")]

    def __str__(self) -> str:
        return f"{self.rep_id} at {self.at:%Y-%m-%d %H:%M:%S}"


class RepAbsencePast(models.Model):
    """The part of a planned absence that had already happened when the absence was deleted or
    its dates changed: ``[starts_at, min(ends_at, recorded_at))``. Written by database triggers
    on ``routing_repabsence`` (``routing.timeoff.state_history``), whatever deleted or changed
    it (the rep's form, a time-off file, the API), so that a replay still sees the rep on leave
    when a past lead arrived."""

    rep = models.ForeignKey(
        "routing.Rep", on_delete=models.CASCADE, related_name="past_absences", db_constraint=False
    )
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    recorded_at = models.DateTimeField()

    class Meta:
        ordering = ("rep", "starts_at", "id")
        verbose_name = "past absence"
        indexes = [models.Index(fields=("ends_at",), name="rep_absence_past_ends_idx")]

    def __str__(self) -> str:
        return f"{self.rep_id}: {self.starts_at:%Y-%m-%d %H:%M} - {self.ends_at:%Y-%m-%d %H:%M}"
