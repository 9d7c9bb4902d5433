"""The rule editor: rows and fields in, a valid rule out, every error on its field in words."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from routing.models import Rule, RuleSet
from routing.versions import ruleset_new_draft
from tests.routing.factories import ValueListFactory

ADD = "admin:routing_rule_add"


def _post(client: Client, ruleset: RuleSet, when: Any, **fields: Any) -> Any:
    data = {
        "ruleset": ruleset.pk,
        "name": "Big DACH",
        "priority": "",
        "when": json.dumps(when) if when is not None else "",
        "action": "",
        "action_type": "team",
        "action_team": "EMEA SDR",
        "on_sla_breach": "notify",
        "active": "on",
        "_save": "Save",
        **fields,
    }
    return client.post(reverse(ADD), data)


@pytest.fixture
def draft(live: RuleSet) -> RuleSet:
    return ruleset_new_draft(ruleset=live)


def test_a_rule_with_two_conditions_is_saved_at_the_end_with_its_action_built(client_revops, draft):
    when = {
        "all": [
            {"field": "country", "op": "in", "value": ["DE", "AT", "CH"]},
            {"field": "employees", "op": "gte", "value": 1000},
        ]
    }
    response = _post(client_revops, draft, when, sla_minutes="30")
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert response["Location"].endswith(
        reverse("admin:routing_ruleset_change", args=[draft.pk]) + "#rules-group"
    )
    rule = Rule.objects.get(ruleset=draft, name="Big DACH")
    assert rule.when == when
    assert rule.action == {"type": "team", "team": "EMEA SDR"}
    assert rule.priority == 20  # after the copied "Germany" rule at 10
    assert rule.sla_minutes == 30
    page = client_revops.get(reverse("admin:routing_ruleset_change", args=[draft.pk]))
    assert "country in DE, AT, CH and employees ≥ 1000" in page.content.decode()


def _errors(response: Any) -> dict[str, list[str]]:
    assert response.status_code == 200
    return {k: list(v) for k, v in response.context["adminform"].form.errors.items()}


@pytest.mark.parametrize(
    ("leaf", "message"),
    [
        (
            {"field": "title", "op": "matches", "value": "(vp"},
            "Condition 2 (title), value: bad regular expression",
        ),
        (
            {"field": "colour", "op": "eq", "value": "red"},
            'Condition 2 (colour), field: unknown field "colour"',
        ),
        (
            {"field": "employees", "op": "contains", "value": "10"},
            'Condition 2 (employees), operator: operator "contains" does not apply to number field',
        ),
        (
            {"field": "email_domain", "op": "in_list", "value": "nope"},
            'Condition 2 (email_domain), value: unknown value list "nope"',
        ),
    ],
)
def test_a_bad_condition_is_reported_on_the_condition_in_words(client_revops, draft, leaf, message):
    when = {"all": [{"field": "country", "op": "eq", "value": "DE"}, leaf]}
    errors = _errors(_post(client_revops, draft, when))
    assert list(errors) == ["when"]
    assert errors["when"][0].startswith(message), errors
    assert not Rule.objects.filter(ruleset=draft, name="Big DACH").exists()


def test_nested_paths_are_numbered_like_the_rows(client_revops, draft):
    when = {
        "any": [
            {"field": "country", "op": "eq", "value": "DE"},
            {"not": {"any": [{"field": "title", "op": "matches", "value": "["}]}},
        ]
    }
    errors = _errors(_post(client_revops, draft, when))
    assert errors["when"][0].startswith("Condition 2.1 (title), value: bad regular expression")


def _row_errors(response: Any) -> dict[str, list[str]]:
    """The errors the condition editor shows on its rows (its options, as the page has them)."""
    found = re.search(
        r'<script id="id_when_options" type="application/json">(.*?)</script>',
        response.content.decode(),
    )
    assert found is not None
    return dict(json.loads(found.group(1))["rowErrors"])


def test_condition_errors_are_shown_on_their_row_too(client_revops, draft):
    when = {
        "all": [
            {"field": "country", "op": "eq", "value": "DE"},
            {
                "any": [
                    {"field": "employees", "op": "gte", "value": 5},
                    {"field": "title", "op": "matches", "value": "([a-z"},
                ]
            },
        ]
    }
    response = _post(client_revops, draft, when)
    rows = _row_errors(response)
    assert list(rows) == ["2.2"]
    assert rows["2.2"][0].startswith("value: bad regular expression")
    assert _row_errors(client_revops.get(reverse(ADD))) == {}


def test_action_errors_land_on_the_action_fields(client_revops, draft):
    errors = _errors(_post(client_revops, draft, None, action_team=""))
    assert errors == {"action_team": ["Choose the team."]}
    errors = _errors(_post(client_revops, draft, None, action_type="rep", action_rep="x@y.z"))
    assert "action_rep" in errors  # not a known rep: the choice itself is refused
    errors = _errors(_post(client_revops, draft, None, action_type=""))
    assert "action_type" in errors


def test_a_duplicate_name_is_refused_on_the_form(client_revops, draft):
    errors = _errors(_post(client_revops, draft, None, name="Germany"))
    assert any("Germany" in m or "already exists" in m for ms in errors.values() for m in ms)


def test_tag_and_exclude_actions_are_built_from_fields(client_revops, draft):
    ValueListFactory(name="competitors", values=["rival.io"])
    _post(
        client_revops,
        draft,
        {"all": [{"field": "email_domain", "op": "in_list", "value": "competitors"}]},
        name="Competitors",
        action_type="exclude",
        action_reason="competitor",
    )
    _post(
        client_revops,
        draft,
        None,
        name="Hot",
        action_type="tag",
        tag_priority="hot",
        tag_sla_minutes="5",
        tag_tags="hot, webinar",
    )
    rules = {rule.name: rule.action for rule in Rule.objects.filter(ruleset=draft)}
    assert rules["Competitors"] == {"type": "exclude", "reason": "competitor"}
    assert rules["Hot"] == {
        "type": "tag",
        "priority": "hot",
        "sla_minutes": 5,
        "tags": ["hot", "webinar"],
    }


def test_published_rules_refuse_edits_and_say_so(client_revops, live):
    rule = Rule.objects.get(ruleset=live)
    url = reverse("admin:routing_rule_change", args=[rule.pk])
    page = client_revops.get(url)
    assert page.status_code == 200
    assert "country is DE" in page.content.decode()  # shown in words, read-only
    response = client_revops.post(url, {"name": "Changed", "_save": "Save"})
    assert response.status_code == 403
    rule.refresh_from_db()
    assert rule.name == "Germany"
    banner = client_revops.get(reverse("admin:routing_ruleset_change", args=[live.pk]))
    assert "is published and read-only" in banner.content.decode()


def test_people_outside_revops_cannot_open_the_editor(live, db):
    user = User.objects.create_user("sam", password="pw", is_staff=True)
    client = Client()
    client.force_login(user)
    rule = Rule.objects.get(ruleset=live)
    for url in (
        reverse(ADD),
        reverse("admin:routing_rule_change", args=[rule.pk]),
        reverse("admin:routing_ruleset_simulate"),
        reverse("admin:routing_ruleset_publish", args=[live.pk]),
    ):
        assert client.get(url).status_code == 403, url


def test_a_new_rule_goes_before_the_catch_all(live: RuleSet) -> None:
    from routing.versions import rule_next_priority

    draft = ruleset_new_draft(ruleset=live)  # Germany (10), with a condition: new rules go last
    assert rule_next_priority(ruleset=draft) == 20
    Rule.objects.create(
        ruleset=draft, name="Catch-all", priority=1000, action={"type": "team", "team": "EMEA SDR"}
    )
    assert rule_next_priority(ruleset=draft) == 990
    Rule.objects.create(ruleset=draft, name="Just before", priority=995, action={"type": "tag"})
    Rule.objects.filter(ruleset=draft, name="Just before").update(priority=999)
    assert rule_next_priority(ruleset=draft) == 1010  # no room: last, to be moved up
    Rule.objects.filter(ruleset=draft, name="Just before").update(priority=990)
    assert rule_next_priority(ruleset=draft) == 995
    Rule.objects.filter(ruleset=draft, name="Catch-all").update(action={"type": "territory"})
    assert rule_next_priority(ruleset=draft) == 1010  # a territory rule may not decide
