"""Every change of routing configuration through the admin is a config_changed audit event."""

from __future__ import annotations

from typing import Any

import pytest
from django.forms import JSONField, MultiWidget
from django.test import Client
from django.urls import reverse

from audit.models import Event, EventType
from routing.models import Rep, RoutingTestCase, Rule, RuleSet, Team, Territory, ValueList
from routing.versions import ruleset_new_draft
from tests.leads.factories import SourceFactory

pytestmark = pytest.mark.django_db


def _fields(form: Any, data: dict[str, Any]) -> None:
    for name, field in form.fields.items():
        if field.disabled:
            continue
        key = form.add_prefix(name)
        value = form[name].value()
        if isinstance(field.widget, MultiWidget):
            parts = field.widget.decompress(value) if value else []
            for i, part in enumerate(parts):
                data[f"{key}_{i}"] = "" if part is None else part
        elif isinstance(value, bool):
            if value:
                data[key] = "on"
        elif value is None:
            if isinstance(field, JSONField):
                data[key] = "null"
        elif isinstance(value, list | tuple):
            data[key] = list(value)
        else:
            data[key] = value


def _form_data(client: Client, url: str, **changes: Any) -> dict[str, Any]:
    """What the admin page's form posts unchanged, with ``changes``."""
    response = client.get(url)
    assert response.status_code == 200, url
    data: dict[str, Any] = {}
    _fields(response.context["adminform"].form, data)
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        management = formset.management_form
        for name in management.fields:
            data[management.add_prefix(name)] = management[name].value()
        for form in formset.forms:
            _fields(form, data)
    data.update(changes)
    return {key: value for key, value in data.items() if value is not None}


def _events(since: int) -> list[Event]:
    return list(Event.objects.filter(type=EventType.CONFIG_CHANGED, id__gt=since).order_by("id"))


def _last_id() -> int:
    last = Event.objects.order_by("-id").first()
    return last.pk if last else 0


def _check(client: Client, since: int, model: str, action: str, actor: str) -> dict[str, Any]:
    events = [e for e in _events(since) if e.data["model"] == model and e.data["action"] == action]
    assert events, f"no {action} event for {model}"
    assert (events[-1].actor, events[-1].chain) == (actor, "routing")
    data: dict[str, Any] = events[-1].data
    return data


@pytest.mark.parametrize(
    ("model", "admin_name", "factory", "change"),
    [
        ("routing.Rep", "rep", lambda emea: Rep.objects.get(email="ana@x.example"), {"name": "A"}),
        ("routing.Team", "team", lambda emea: emea, {"sla_minutes": "45"}),
        (
            "routing.Territory",
            "territory",
            lambda emea: Territory.objects.create(name="DACH", countries=["DE"], team=emea),
            {"countries": '["DE", "AT"]'},
        ),
        (
            "routing.ValueList",
            "valuelist",
            lambda emea: ValueList.objects.create(name="vip", values=["a.example"]),
            {"values": '["a.example", "b.example"]'},
        ),
        (
            "routing.RoutingTestCase",
            "routingtestcase",
            lambda emea: RoutingTestCase.objects.create(
                name="German", lead={"country": "DE"}, expected_status="assigned"
            ),
            {"name": "German lead"},
        ),
    ],
)
def test_changing_and_deleting_configuration_is_audited_with_values(
    client_revops: Client, emea: Team, model: str, admin_name: str, factory: Any, change: Any
) -> None:
    obj = factory(emea)
    since = _last_id()
    url = reverse(f"admin:routing_{admin_name}_change", args=[obj.pk])
    response = client_revops.post(url, _form_data(client_revops, url, **change))
    assert response.status_code == 302, response.context["adminform"].form.errors
    data = _check(client_revops, since, model, "changed", "user:rita")
    assert data["key"] == str(obj.pk)
    assert data["changes"], data
    for field, values in data["changes"].items():
        assert set(values) == {"before", "after"}, field
    if model == "routing.Team":
        assert data["changes"]["sla_minutes"] == {"before": 60, "after": 45}
    if model == "routing.Rep":
        return  # a team uses Ana: not deletable
    delete = reverse(f"admin:routing_{admin_name}_delete", args=[obj.pk])
    assert client_revops.post(delete, {"post": "yes"}).status_code == 302
    _check(client_revops, since, model, "deleted", "user:rita")


def test_adding_configuration_is_audited(client_revops: Client, emea: Team) -> None:
    since = _last_id()
    url = reverse("admin:routing_valuelist_add")
    client_revops.post(url, _form_data(client_revops, url, name="new", values='["x"]'))
    assert _check(client_revops, since, "routing.ValueList", "added", "user:rita")["changes"][
        "values"
    ] == {"before": None, "after": ["x"]}
    url = reverse("admin:routing_rep_add")
    client_revops.post(
        url, _form_data(client_revops, url, email="new@x.example", name="New", timezone="UTC")
    )
    _check(client_revops, since, "routing.Rep", "added", "user:rita")


def test_team_members_changed_in_the_inline_are_audited(client_revops: Client, emea: Team) -> None:
    since = _last_id()
    url = reverse("admin:routing_team_change", args=[emea.pk])
    data = _form_data(client_revops, url)
    data["memberships-0-weight"] = "3"
    assert client_revops.post(url, data).status_code == 302
    changed = _check(client_revops, since, "routing.TeamMembership", "changed", "user:rita")
    assert changed["changes"]["weight"] == {"before": 1, "after": 3}


def test_rules_and_their_moves_are_audited(client_revops: Client, live: RuleSet) -> None:
    draft = ruleset_new_draft(ruleset=live)
    Rule.objects.create(ruleset=draft, name="Hot", priority=20, action={"type": "exclude"})
    since = _last_id()
    hot = Rule.objects.get(ruleset=draft, name="Hot")
    client_revops.post(reverse("admin:routing_rule_move", args=[hot.pk, "up"]))
    moved = _check(client_revops, since, "routing.Rule", "move_up", "user:rita")
    assert moved["changes"]["priority"] == {"before": 20, "after": 10}
    url = reverse("admin:routing_rule_change", args=[hot.pk])
    response = client_revops.post(url, _form_data(client_revops, url, name="Hotter"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    renamed = _check(client_revops, since, "routing.Rule", "changed", "user:rita")
    assert renamed["changes"]["name"] == {"before": "Hot", "after": "Hotter"}
    client_revops.post(reverse("admin:routing_ruleset_new_draft"))
    _check(client_revops, since, "routing.RuleSet", "added", "user:rita")
    url = reverse("admin:routing_ruleset_change", args=[draft.pk])
    client_revops.post(url, _form_data(client_revops, url, note="why"))
    _check(client_revops, since, "routing.RuleSet", "changed", "user:rita")


def test_bulk_rep_actions_are_audited(client_revops: Client, emea: Team) -> None:
    since = _last_id()
    ana = Rep.objects.get(email="ana@x.example")
    changelist = reverse("admin:routing_rep_changelist")
    client_revops.post(changelist, {"action": "deactivate", "_selected_action": [ana.pk]})
    data = _check(client_revops, since, "routing.Rep", "deactivate", "user:rita")
    assert data["changes"]["active"] == {"before": True, "after": False}
    client_revops.post(
        changelist,
        {
            "action": "set_out_of_office",
            "_selected_action": [ana.pk],
            "apply": "1",
            "until": "2030-01-01 09:00",
        },
    )
    data = _check(client_revops, since, "routing.Rep", "set_out_of_office", "user:rita")
    assert data["changes"]["out_of_office_until"]["before"] is None


def test_source_changes_and_rotation_are_audited_with_secrets_redacted(
    admin_client: Client,
) -> None:
    source = SourceFactory(slug="webform")
    since = _last_id()
    changelist = reverse("admin:leads_source_changelist")
    response = admin_client.post(
        changelist, {"action": "rotate_token", "_selected_action": [source.pk]}
    )
    data = _check(admin_client, since, "leads.Source", "rotate_token", "user:admin")
    assert data["changes"]["token_hash"] == {"before": "[redacted]", "after": "[redacted]"}
    token = response.content.decode().split('class="new-secret">')[1].split("<")[0]
    assert token not in str([event.data for event in _events(since)])
    url = reverse("admin:leads_source_change", args=[source.pk])
    admin_client.post(url, _form_data(admin_client, url, rate_limit_per_minute="7"))
    data = _check(admin_client, since, "leads.Source", "changed", "user:admin")
    assert data["changes"]["rate_limit_per_minute"]["after"] == 7
