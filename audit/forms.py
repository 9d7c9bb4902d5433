"""Forms of the lead page's actions and of the user's own settings."""

from __future__ import annotations

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
