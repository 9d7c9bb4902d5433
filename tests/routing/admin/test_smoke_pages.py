"""Every editor page renders for RevOps (a first net; the flows have their own tests)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from routing.models import Rule
from routing.versions import ruleset_new_draft


@pytest.mark.parametrize(
    "name",
    [
        "admin:routing_ruleset_changelist",
        "admin:routing_rule_changelist",
        "admin:routing_ruleset_simulate",
        "admin:routing_ruleset_diff",
        "admin:routing_rule_add",
        "admin:routing_team_changelist",
        "admin:routing_routingtestcase_add",
    ],
)
def test_page_renders(client_revops, live, name):
    response = client_revops.get(reverse(name))
    assert response.status_code == 200, response.content[:2000]


def test_version_pages_render(client_revops, live):
    draft = ruleset_new_draft(ruleset=live)
    rule = Rule.objects.get(ruleset=draft)
    for name, pk in [
        ("admin:routing_ruleset_change", draft.pk),
        ("admin:routing_ruleset_change", live.pk),
        ("admin:routing_ruleset_replay", draft.pk),
        ("admin:routing_ruleset_tests", draft.pk),
        ("admin:routing_ruleset_publish", draft.pk),
        ("admin:routing_rule_change", rule.pk),
        ("admin:routing_rule_change", Rule.objects.get(ruleset=live).pk),
    ]:
        response = client_revops.get(reverse(name, args=[pk]))
        assert response.status_code == 200, (name, response.content[:3000])
    response = client_revops.get(
        reverse("admin:routing_ruleset_replay", args=[draft.pk]) + "?run=1"
    )
    assert response.status_code == 200
