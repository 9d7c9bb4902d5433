"""seed_demo: the demo company is complete, its saved test cases pass, and a second run changes
nothing."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from leads.models import Source
from routing.demo import company
from routing.models import (
    Account,
    Rep,
    RoutingTestCase,
    RuleSet,
    RuleSetStatus,
    Team,
    Territory,
    ValueList,
)
from routing.versions import test_cases_run

pytestmark = pytest.mark.django_db


def _snapshot() -> dict[str, object]:
    return {
        "reps": list(Rep.objects.order_by("email").values_list("email", "out_of_office_until")),
        "teams": list(Team.objects.order_by("name").values_list("name", "strategy", "manager")),
        "territories": Territory.objects.count(),
        "accounts": Account.objects.count(),
        "rulesets": list(RuleSet.objects.values_list("version", "status")),
        "cases": list(RoutingTestCase.objects.order_by("name").values_list("name", "updated_at")),
        "users": get_user_model().objects.count(),
    }


def test_seed_demo_builds_the_demo_company(settings, tmp_path, capsys):
    settings.VAR_DIR = tmp_path
    call_command("seed_demo")
    out = capsys.readouterr().out

    teams = {t.name: t for t in Team.objects.all()}
    assert set(teams) == {"SDR EMEA", "SDR NA", "Enterprise AE", "Inbound"}
    assert Rep.objects.count() == 15
    assert len(set(Rep.objects.values_list("timezone", flat=True))) >= 8
    away = Rep.objects.filter(out_of_office_until__gt=timezone.now())
    assert away.count() == 2
    assert Rep.objects.filter(max_open__isnull=False).count() >= 10
    assert Account.objects.count() == 30
    assert Account.objects.filter(owner__isnull=True).count() == 0
    assert set(ValueList.objects.values_list("name", flat=True)) == {"competitors", "free-mail"}
    # Territories by country, by US state and by postal prefix.
    territories = list(Territory.objects.all())
    assert any("CA" in t.regions for t in territories)
    assert any(t.countries == ["DE", "AT", "CH"] and not t.regions for t in territories)
    assert sum(len(t.postal_prefixes) for t in territories) >= 30
    live = RuleSet.objects.get(status=RuleSetStatus.PUBLISHED)
    assert live.rules.count() >= 8

    # Every saved test case passes against the published version, so RevOps start green.
    results = test_cases_run(ruleset=live)
    assert len(results) == len(company.TEST_CASES)
    assert [r.case.name for r in results if not r.passed] == []

    # Logins: an administrator, a RevOps user in the admin, a sales manager of two teams.
    state = json.loads((tmp_path / "demo.json").read_text())
    users = get_user_model().objects
    for username, password in state["passwords"].items():
        assert users.get(username=username).check_password(password)
        assert f"{username} / {password}" in out
    assert users.get(username="revops").groups.filter(name="RevOps").exists()
    manager = users.get(username="manager")
    assert manager.groups.filter(name="Sales managers").exists()
    assert not manager.is_staff
    assert set(manager.managed_teams.values_list("name", flat=True)) == set(company.MANAGED_TEAMS)
    assert (tmp_path / "demo.json").stat().st_mode & 0o077 == 0

    # Both sources take the printed tokens.
    now = timezone.now()
    for slug in (company.FORM_SOURCE, company.WEBINAR_SOURCE):
        token = state["source_tokens"][slug]
        assert Source.objects.get(slug=slug).token_matches(token, now=now)
        assert token in out


def test_seed_demo_twice_changes_nothing_and_prints_the_same_secrets(settings, tmp_path, capsys):
    settings.VAR_DIR = tmp_path
    call_command("seed_demo")
    first_out = capsys.readouterr().out
    before = _snapshot()
    call_command("seed_demo")
    second_out = capsys.readouterr().out
    assert _snapshot() == before
    assert "(unchanged)" in second_out
    assert first_out.split("Logins:")[1] == second_out.split("Logins:")[1]


def test_seed_demo_without_its_secrets_file_gives_the_sources_new_tokens(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    call_command("seed_demo")
    old = json.loads((tmp_path / "demo.json").read_text())
    (tmp_path / "demo.json").unlink()
    call_command("seed_demo")
    new = json.loads((tmp_path / "demo.json").read_text())
    now = timezone.now()
    for slug, token in new["source_tokens"].items():
        assert token != old["source_tokens"][slug]
        assert Source.objects.get(slug=slug).token_matches(token, now=now)
    users = get_user_model().objects
    for username, password in new["passwords"].items():
        assert users.get(username=username).check_password(password)


def test_seed_demo_if_empty_leaves_a_used_database_alone(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    get_user_model().objects.create_user("someone", password="x")
    call_command("seed_demo", "--if-empty")
    assert not get_user_model().objects.filter(username="admin").exists()
    assert not Rep.objects.exists()
