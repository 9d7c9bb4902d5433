"""Admin for time off: planned absences (an inline of the rep, entered in the rep's own time
zone) and holiday calendars (a country's public holidays plus custom days). Every change is
audited by ``AuditedConfigAdmin`` (inlines included)."""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.forms import BaseInlineFormSet

from audit.config_changes import AuditedConfigAdmin
from routing.editor.versioned import VersionedConfigAdmin
from routing.engine.availability import NonexistentLocalTime, wall_clock_at, zone_named
from routing.timeoff.models import HolidayCalendar, HolidayCalendarDay, RepAbsence

_FORMAT = "%Y-%m-%d %H:%M"


class _LocalMoment(forms.CharField):
    """A ``YYYY-MM-DD HH:MM`` wall-clock time, read in the rep's zone by the form."""

    def to_python(self, value: Any) -> Any:
        text = (super().to_python(value) or "").strip()
        if not text:
            return None
        try:
            return datetime.strptime(text, _FORMAT)  # noqa: DTZ007 - made aware by the form
        except ValueError:
            raise ValidationError("Enter a time as YYYY-MM-DD HH:MM.") from None


class RepAbsenceForm(forms.ModelForm):
    """From and to in the rep's own time zone (the rep's time zone field, as saved)."""

    starts_local = _LocalMoment(label="From (rep's time)", help_text="YYYY-MM-DD HH:MM")
    ends_local = _LocalMoment(label="To (rep's time)", help_text="YYYY-MM-DD HH:MM, exclusive")

    class Meta:
        model = RepAbsence
        fields = ("note",)

    def _zone_name(self) -> str:
        return (getattr(self.rep, "timezone", "") or "UTC") if self.rep is not None else "UTC"

    def __init__(self, *args: Any, rep: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rep = rep
        if self.instance.pk is not None:
            zone = zone_named(self._zone_name())
            for name, moment in (
                ("starts_local", self.instance.starts_at),
                ("ends_local", self.instance.ends_at),
            ):
                self.initial[name] = moment.astimezone(zone).strftime(_FORMAT)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        zone = zone_named(self._zone_name())
        if zone is None:
            raise ValidationError("The rep's time zone is unknown: fix it first.")
        for local_name, field_name in (("starts_local", "starts_at"), ("ends_local", "ends_at")):
            moment = cleaned.get(local_name)
            if not isinstance(moment, datetime):
                continue
            try:
                setattr(self.instance, field_name, wall_clock_at(moment, zone))
            except NonexistentLocalTime as error:
                self.add_error(local_name, str(error))
        return cleaned


class RepAbsenceFormSet(BaseInlineFormSet):
    """Absences of one rep may not overlap each other, new or stored."""

    def get_form_kwargs(self, index: Any) -> dict[str, Any]:
        # The rep as the form above sets it (its time zone may be changing in the same save).
        return {**super().get_form_kwargs(index), "rep": self.instance}

    def clean(self) -> None:
        super().clean()
        spans = []
        for form in self.forms:
            if not hasattr(form, "cleaned_data") or not form.cleaned_data:
                continue
            if form.cleaned_data.get("DELETE"):
                continue
            start, end = form.instance.starts_at, form.instance.ends_at
            if start is not None and end is not None:
                spans.append((start, end))
        spans.sort()
        for (_, first_end), (second_start, _) in itertools.pairwise(spans):
            if second_start < first_end:
                raise ValidationError("Two absences overlap: make one absence that covers both.")


class RepAbsenceInline(admin.TabularInline):
    model = RepAbsence
    form = RepAbsenceForm
    formset = RepAbsenceFormSet
    extra = 1
    fields = ("starts_local", "ends_local", "note", "started_handled_at")
    readonly_fields = ("started_handled_at",)
    verbose_name_plural = "planned absences (in the rep's time zone)"


class HolidayCalendarDayInline(admin.TabularInline):
    model = HolidayCalendarDay
    extra = 1
    verbose_name_plural = "custom days off"


@admin.register(HolidayCalendar)
class HolidayCalendarAdmin(VersionedConfigAdmin, AuditedConfigAdmin, admin.ModelAdmin):
    list_display = ("name", "country", "subdivision")
    search_fields = ("name", "country")
    filter_horizontal = ("reps", "teams")
    inlines = (HolidayCalendarDayInline,)
