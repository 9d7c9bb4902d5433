"""Absurd input in the admin is a form or row error, never a server error."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from leads.models import Source
from routing.models import RoutingTestCase, Rule, RuleSet, Territory, ValueList
from routing.tables_io import TableErrors, tables_import
from routing.versions import ruleset_new_draft

pytestmark = pytest.mark.django_db

DEEP = "[" * 5000
DEEPISH = "[" * 200 + "]" * 200  # valid JSON, but deeper than any configuration


@pytest.mark.parametrize("text", [DEEP, DEEPISH])
def test_the_simulate_page_refuses_deeply_nested_json(client_revops: Client, live, text) -> None:
    response = client_revops.post(reverse("admin:routing_ruleset_simulate"), {"lead_json": text})
    assert response.status_code == 200
    assert "nested more than" in response.content.decode()


@pytest.mark.parametrize("text", [DEEP, '{"a": ' + DEEPISH + "}"])
def test_admin_json_fields_refuse_deeply_nested_json(
    client_revops: Client, admin_client: Client, live: RuleSet, text: str
) -> None:
    draft = ruleset_new_draft(ruleset=live)
    rule = Rule.objects.get(ruleset=draft)
    posts = [
        (
            client_revops,
            reverse("admin:routing_valuelist_add"),
            {"name": "deep", "values": text},
        ),
        (
            client_revops,
            reverse("admin:routing_routingtestcase_add"),
            {"name": "deep", "lead": text, "expected_status": "assigned"},
        ),
        (
            client_revops,
            reverse("admin:routing_rule_change", args=[rule.pk]),
            {
                "ruleset": draft.pk,
                "name": "x",
                "priority": "10",
                "active": "on",
                "when": text,
                "action_type": "exclude",
                "action": text,
                "on_sla_breach": "notify",
            },
        ),
        (
            admin_client,
            reverse("admin:leads_source_add"),
            {
                "slug": "deep",
                "name": "Deep",
                "auth_mode": "token",
                "field_map": text,
                "rate_limit_per_minute": "60",
            },
        ),
    ]
    for client, url, data in posts:
        response = client.post(url, data)
        assert response.status_code == 200, url  # the form again, with its error
        assert "nested more than" in response.content.decode() or (
            "Enter a valid JSON" in response.content.decode()
        ), url
    assert not ValueList.objects.filter(name="deep").exists()
    assert not RoutingTestCase.objects.exists()
    assert not Source.objects.filter(slug="deep").exists()
    assert Rule.objects.get(pk=rule.pk).name == rule.name


def test_a_csv_cell_with_a_nul_byte_is_a_row_error(emea) -> None:
    content = "territory,country,region,postal_prefix,team,rep\nDA\x00CH,DE,,,EMEA SDR,\n"
    with pytest.raises(TableErrors) as caught:
        tables_import(table="territories", content=content)
    assert list(caught.value.errors) == [
        "row 2, column territory: contains a NUL character (not text)"
    ]
    assert not Territory.objects.exists()
