"""Forms of the rule editor: a rule's condition as rows, its action as plain fields.

The condition widget (``ConditionEditor``) edits the ``when`` JSON as rows of field, operator and
value inside all/any groups that nest; the JSON stays in a textarea under it for power users.
Validation is the model's (``Rule.clean``, i.e. the engine's compiler); this form only moves each
error onto the field that caused it and says where in words ("condition 2.1 (title)").
"""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe

from config.json_input import json_loads_bounded
from routing.engine.fields import CUSTOM_PREFIX, FIELD_NAMES, FieldKind, field_kind
from routing.models import ExpectedStatus, Rep, RoutingTestCase, Rule, Team, ValueList

ACTION_LABELS = {
    "team": "Give it to a team (by the team's strategy)",
    "rep": "Give it to one rep",
    "territory": "Give it to the matching territory's owner",
    "account_owner": "Give it to the account owner",
    "exclude": "Exclude the lead",
    "tag": "Tag it (priority, SLA, tags) and go on to the next rule",
}

_OPS_BY_KIND = {
    FieldKind.TEXT.value: [
        "eq", "neq", "in", "not_in", "contains", "not_contains", "starts_with", "ends_with",
        "matches", "exists", "not_exists", "in_list", "not_in_list",
    ],
    FieldKind.NUMBER.value: [
        "eq", "neq", "gt", "gte", "lt", "lte", "between", "in", "not_in", "exists",
        "not_exists", "in_list", "not_in_list",
    ],
    FieldKind.BOOLEAN.value: ["eq", "neq", "exists", "not_exists"],
}  # fmt: skip
_OPS_BY_KIND[FieldKind.ANY.value] = list(
    dict.fromkeys(_OPS_BY_KIND["text"] + _OPS_BY_KIND["number"])
)
OP_LABELS = {
    "eq": "is",
    "neq": "is not",
    "in": "is one of",
    "not_in": "is none of",
    "contains": "contains",
    "not_contains": "does not contain",
    "starts_with": "starts with",
    "ends_with": "ends with",
    "matches": "matches the pattern",
    "gt": ">",
    "gte": "≥",
    "lt": "<",
    "lte": "≤",
    "between": "is between",
    "exists": "is set",
    "not_exists": "is empty",
    "in_list": "is in the value list",
    "not_in_list": "is not in the value list",
}


def editor_options() -> dict[str, Any]:
    """What the condition editor offers: fields with their kind, operators, value lists."""
    return {
        "fields": [
            {"name": name, "kind": kind.value}
            for name in FIELD_NAMES
            if not name.startswith(CUSTOM_PREFIX) and (kind := field_kind(name)) is not None
        ],
        "customPrefix": CUSTOM_PREFIX,
        "opsByKind": _OPS_BY_KIND,
        "opLabels": OP_LABELS,
        "valueLists": list(ValueList.objects.order_by("name").values_list("name", flat=True)),
    }


class ConditionEditor(forms.Textarea):
    """The ``when`` JSON edited as rows; the textarea (the submitted value) stays available."""

    template_name = "admin/routing/widgets/condition_editor.html"

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__(attrs)
        self.row_errors: dict[str, list[str]] = {}  # "2.1" -> messages, shown on that row

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        context["editor_options"] = {**editor_options(), "rowErrors": self.row_errors}
        return context

    def render(
        self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None
    ) -> SafeString:
        # The project's template engine: the default form renderer sees only Django's own.
        return mark_safe(  # noqa: S308 - a template rendered with autoescaping
            render_to_string(self.template_name, self.get_context(name, value, attrs))
        )


# --- Errors in words ----------------------------------------------------------------------------

_STEP = re.compile(r"\.(all|any|not)(?:\[(\d+)\])?")


def _leaf_at(when: Any, steps: list[tuple[str, str | None]]) -> Any:
    node = when
    for combinator, index in steps:
        node = node.get(combinator) if isinstance(node, dict) else None
        if index is not None:
            node = node[int(index)] if isinstance(node, list) and int(index) < len(node) else None
    return node


def _condition_place(path: str, when: Any) -> tuple[str, str, str]:
    """``when.all[1].any[0].op`` -> (``2.1``, `` (title)``, ``operator``): row, field, part."""
    rest = path.removeprefix("when")
    steps: list[tuple[str, str | None]] = []
    numbers: list[str] = []
    while True:
        match = _STEP.match(rest)
        if match is None:
            break
        steps.append((match.group(1), match.group(2)))
        if match.group(2) is not None:
            numbers.append(str(int(match.group(2)) + 1))
        rest = rest[match.end() :]
    leaf = _leaf_at(when, steps)
    field = (
        f" ({leaf['field']})"
        if isinstance(leaf, dict) and isinstance(leaf.get("field"), str)
        else ""
    )
    part = {".field": "field", ".op": "operator", "": ""}.get(rest)
    if part is None:
        part = "value" if rest.startswith(".value") else rest.lstrip(".")
    return ".".join(numbers), field, part


def condition_error_words(path: str, message: str, when: Any) -> str:
    """``when.all[1].any[0].op: ...`` -> ``Condition 2.1 (title), operator: ...``."""
    number, field, part = _condition_place(path, when)
    where = f"Condition {number}" if number else "The condition"
    return f"{where}{field}{', ' + part if part else ''}: {message}"


def condition_row_error(path: str, message: str, when: Any) -> tuple[str, str] | None:
    """The editor row (``2.1``) an error of ``path`` belongs to, and what to say on it."""
    number, _, part = _condition_place(path, when)
    if not number:
        return None
    return number, f"{part}: {message}" if part else message


_ACTION_FIELDS = {
    "team": "action_team",
    "rep": "action_rep",
    "fallback_team": "action_fallback_team",
    "reason": "action_reason",
    "ignore_caps": "action_ignore_caps",
    "priority": "tag_priority",
    "sla_minutes": "tag_sla_minutes",
    "tags": "tag_tags",
    "type": "action_type",
}


class RuleForm(forms.ModelForm):
    """A rule with its action as fields; ``action`` itself is built from them in ``clean``."""

    action_type = forms.ChoiceField(label="Then", choices=[("", "—"), *ACTION_LABELS.items()])
    action_team = forms.ModelChoiceField(
        Team.objects.all(), to_field_name="name", required=False, label="Team"
    )
    action_rep = forms.ModelChoiceField(
        Rep.objects.all(), to_field_name="email", required=False, label="Rep"
    )
    action_ignore_caps = forms.BooleanField(
        required=False, label="Ignore the rep's caps (max open, max per day)"
    )
    action_fallback_team = forms.ModelChoiceField(
        Team.objects.all(),
        to_field_name="name",
        required=False,
        label="Else the team",
        help_text="When the account has no eligible owner (optional).",
    )
    action_reason = forms.CharField(required=False, label="Exclusion reason", max_length=200)
    tag_priority = forms.CharField(required=False, label="Priority", max_length=50)
    tag_sla_minutes = forms.IntegerField(required=False, min_value=1, label="SLA (minutes)")
    tag_tags = forms.CharField(
        required=False, label="Tags", help_text="Separated by commas, e.g. hot, webinar"
    )

    class Meta:
        model = Rule
        fields = (
            "ruleset",
            "name",
            "priority",
            "when",
            "action",
            "sla_minutes",
            "on_sla_breach",
            "active",
        )
        widgets = {"when": ConditionEditor, "action": forms.HiddenInput}
        labels = {"when": "When"}
        help_texts = {
            "when": "Every condition of an “all” group must hold, one of an “any” group. "
            "No condition: the rule always matches.",
            "priority": "Lower runs first. Reorder with ↑ ↓ in the ruleset rather than by hand.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("action", "priority"):
            if name in self.fields:  # a view-only page has no fields
                self.fields[name].required = False
        action = self.instance.action if isinstance(self.instance.action, dict) else {}
        if action and not self.is_bound:
            self.initial.update(
                action_type=action.get("type", ""),
                action_team=action.get("team"),
                action_rep=action.get("rep"),
                action_ignore_caps=action.get("ignore_caps", False),
                action_fallback_team=action.get("fallback_team"),
                action_reason=action.get("reason", ""),
                tag_priority=action.get("priority", ""),
                tag_sla_minutes=action.get("sla_minutes"),
                tag_tags=", ".join(action.get("tags") or []),
            )

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        kind = data.get("action_type")
        action: dict[str, Any] = {"type": kind}
        if kind == "team":
            if data.get("action_team") is None:
                self.add_error("action_team", "Choose the team.")
            else:
                action["team"] = data["action_team"].name
        elif kind == "rep":
            if data.get("action_rep") is None:
                self.add_error("action_rep", "Choose the rep.")
            else:
                action["rep"] = data["action_rep"].email
                if data.get("action_ignore_caps"):
                    action["ignore_caps"] = True
        elif kind == "account_owner" and data.get("action_fallback_team") is not None:
            action["fallback_team"] = data["action_fallback_team"].name
        elif kind == "exclude" and data.get("action_reason"):
            action["reason"] = data["action_reason"].strip()
        elif kind == "tag":
            if data.get("tag_priority"):
                action["priority"] = data["tag_priority"].strip()
            if data.get("tag_sla_minutes"):
                action["sla_minutes"] = data["tag_sla_minutes"]
            tags = [tag.strip() for tag in (data.get("tag_tags") or "").split(",") if tag.strip()]
            if tags:
                action["tags"] = tags
        data["action"] = action if kind else None
        if data.get("priority") is None and data.get("ruleset") is not None:
            from routing.versions import rule_next_priority

            data["priority"] = rule_next_priority(ruleset=data["ruleset"])
        return data

    def add_error(self, field: str | None, error: Any) -> None:
        """Put the model's path-precise errors on the form field that caused them, in words."""
        if field is None and isinstance(error, ValidationError) and hasattr(error, "error_dict"):
            when = self.cleaned_data.get("when") if hasattr(self, "cleaned_data") else None
            moved: dict[str, list[str]] = {}
            for key, errors in error.error_dict.items():
                for message in (m for e in errors for m in e.messages):
                    target, text = self._place(key, message, when)
                    if target.startswith(("action_", "tag_")) and target in self.errors:
                        continue  # the form already said it in its own words
                    moved.setdefault(target, []).append(text)
            if moved:
                super().add_error(None, ValidationError(moved))
            return
        super().add_error(field, error)

    def _place(self, key: str, message: str, when: Any) -> tuple[str, str]:
        path, _, text = message.partition(": ")
        if key == "when" and path.startswith("when"):
            row = condition_row_error(path, text, when)
            widget = self.fields["when"].widget if "when" in self.fields else None
            if row is not None and isinstance(widget, ConditionEditor):
                widget.row_errors.setdefault(row[0], []).append(row[1])
            return "when", condition_error_words(path, text, when)
        if key == "action" and path.startswith("action"):
            sub = path.removeprefix("action").lstrip(".").split(".")[0].split("[")[0]
            return _ACTION_FIELDS.get(sub, "action_type"), text.capitalize()
        if key in self.fields or key == NON_FIELD_ERRORS:
            return key, message
        return NON_FIELD_ERRORS, message


class SimulateForm(forms.Form):
    """A lead to simulate: a few fields, or pasted JSON (which wins), and optionally a source."""

    email = forms.CharField(required=False)
    company = forms.CharField(required=False)
    country = forms.CharField(required=False, help_text="A country name or code: Germany, DE")
    region = forms.CharField(required=False)
    postal_code = forms.CharField(required=False)
    employees = forms.IntegerField(required=False, min_value=0)
    lead_score = forms.FloatField(required=False)
    title = forms.CharField(required=False)
    lead_json = forms.CharField(
        required=False,
        label="Or paste the lead as JSON",
        widget=forms.Textarea(attrs={"rows": 6, "cols": 60}),
        help_text='As a source sends it, e.g. {"Email": "ana@acme.com", "Country": "DE"}',
    )
    source: forms.ModelChoiceField[Any] = forms.ModelChoiceField(
        queryset=None,  # set in __init__ (leads.Source)
        required=False,
        to_field_name="slug",
        help_text="Its field map is applied, and conditions on `source` see it.",
    )
    draft = forms.IntegerField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from leads.models import Source

        super().__init__(*args, **kwargs)
        source_field = self.fields["source"]
        assert isinstance(source_field, forms.ModelChoiceField)  # noqa: S101 - declared above
        source_field.queryset = Source.objects.order_by("slug")

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        raw = (data.get("lead_json") or "").strip()
        if raw:
            try:
                lead = json_loads_bounded(raw)
            except ValueError as exc:
                self.add_error("lead_json", f"Not valid JSON: {exc}")
                return data
            if not isinstance(lead, dict) or not lead:
                self.add_error("lead_json", "Enter a JSON object with at least one field.")
                return data
        else:
            lead = {
                name: data[name]
                for name in (
                    "email",
                    "company",
                    "country",
                    "region",
                    "postal_code",
                    "employees",
                    "lead_score",
                    "title",
                )
                if data.get(name) not in (None, "")
            }
            if not lead:
                raise ValidationError("Fill in at least one field, or paste the lead as JSON.")
        data["lead"] = lead
        return data


class RoutingTestCaseForm(forms.ModelForm):
    """A saved test case; the lead is edited as JSON."""

    class Meta:
        model = RoutingTestCase
        fields = (
            "name",
            "lead",
            "source",
            "expected_status",
            "expected_rep",
            "expected_team",
            "ruleset",
        )
        widgets = {"lead": forms.Textarea(attrs={"rows": 6, "cols": 60})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["expected_status"].initial = ExpectedStatus.ASSIGNED


class OutOfOfficeForm(forms.Form):
    """Until when the selected reps are away."""

    until = forms.DateTimeField(
        help_text="YYYY-MM-DD HH:MM in the server's time zone (UTC).",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
