"""Forms of the lead page's actions."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet

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
