"""Forms of the lead page's actions and of the user's own settings."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from django import forms
from django.db.models import QuerySet

from audit.timezones import zone_names
from routing.models import Rep


class RepChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Any) -> str:
        return f"{obj.name} <{obj.email}>"


class ReassignForm(forms.Form):
    """Hand a lead to another rep, with the reason recorded in the audit log."""

    rep = RepChoiceField(queryset=Rep.objects.none(), to_field_name="email", label="To")
    reason = forms.CharField(max_length=500, widget=forms.TextInput, strip=True)

    def __init__(self, *args: Any, reps: QuerySet[Rep], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["rep"] = RepChoiceField(queryset=reps, to_field_name="email", label="To")


class TimeZoneForm(forms.Form):
    """The user's own time zone; empty = follow the browser (then the server)."""

    time_zone = forms.ChoiceField(required=False, label="Time zone")

    def __init__(self, *args: Any, browser_zone: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        follow = f"My browser's ({browser_zone})" if browser_zone else "My browser's"
        field = self.fields["time_zone"]
        if not isinstance(field, forms.ChoiceField):  # pragma: no cover - declared above
            raise TypeError("time_zone must be a ChoiceField")
        field.choices = [("", follow), *((n, n) for n in zone_names())]


class AbsenceForm(forms.Form):
    """A rep plans time off on their own page: from and to in their own time zone."""

    starts_at = forms.DateTimeField(
        label="From", widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    ends_at = forms.DateTimeField(
        label="To", widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    note = forms.CharField(max_length=200, required=False, strip=True)

    def __init__(self, *args: Any, zone: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.zone = zone

    def _in_zone(self, value: Any) -> Any:
        # The browser sends a wall time with no zone: it means the rep's zone, whatever the
        # page's zone is (an absence is "Monday to Friday where I live").
        if value is None:
            return None
        aware = value.replace(tzinfo=None).replace(tzinfo=self.zone)
        try:  # stored in UTC: a wall time near year 1 or 9999 may have no UTC instant
            aware.astimezone(UTC)
        except OverflowError:
            raise forms.ValidationError("This time is out of range.", code="invalid") from None
        return aware

    def clean_starts_at(self) -> Any:
        return self._in_zone(self.cleaned_data.get("starts_at"))

    def clean_ends_at(self) -> Any:
        return self._in_zone(self.cleaned_data.get("ends_at"))
