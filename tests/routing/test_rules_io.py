"""Rules as code: import checks everything and writes nothing on error; export round-trips."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import models

from leads.models import Source, token_digest
from routing.engine import RuleErrors
from routing.models import (
    Account,
    Rep,
    Rule,
    RuleSet,
    RuleSetStatus,
    Team,
    TeamMembership,
    Territory,
    ValueList,
)
from routing.rules_io import (
    RulesFileErrors,
    rules_export,
    rules_import,
    rules_parse,
    ruleset_add_draft,
    ruleset_copy,
    ruleset_publish,
)
from routing.selectors import ruleset_published
from tests.routing.factories import RepFactory, RuleFactory, RuleSetFactory, TeamFactory

pytestmark = pytest.mark.django_db

# rules-format.md's example, plus the reps and teams it refers to without defining them.
EXAMPLE: dict[str, Any] = {
    "sources": [
        {
            "slug": "webinar",
            "name": "Webinar platform",
            "token": "optional-plain-token",
            "field_map": {"Email Address": "email", "Org": "company"},
            "rate_limit_per_minute": 6000,
        }
    ],
    "reps": [
        {
            "email": "ana@example.com",
            "name": "Ana",
            "active": True,
            "out_of_office_until": None,
            "timezone": "Europe/Berlin",
            "working_hours": {"days": [1, 2, 3, 4, 5], "start": "08:00", "end": "18:00"},
            "max_open": 50,
            "max_per_day": 20,
        },
        {"email": "ben@example.com", "name": "Ben"},
        {"email": "bob@example.com", "name": "Bob", "timezone": "America/New_York"},
        {"email": "cai@example.com", "name": "Cai", "timezone": "America/Los_Angeles"},
    ],
    "teams": [
        {
            "name": "EMEA SDR",
            "strategy": "round_robin",
            "respect_working_hours": False,
            "sla_minutes": 60,
            "members": [
                {"rep": "ana@example.com", "weight": 1},
                {"rep": "ben@example.com", "weight": 2},
            ],
        },
        {
            "name": "Enterprise AE",
            "strategy": "least_loaded",
            "members": [{"rep": "bob@example.com"}],
        },
        {
            "name": "Inbound SDR",
            "strategy": "weighted",
            "members": [{"rep": "ana@example.com", "weight": 3}],
        },
        {"name": "US West AE", "members": [{"rep": "cai@example.com"}]},
    ],
    "territories": [
        {"name": "DACH", "countries": ["DE", "AT", "CH"], "team": "EMEA SDR"},
        {
            "name": "US West",
            "countries": ["US"],
            "regions": ["CA", "WA", "OR"],
            "team": "US West AE",
        },
        {
            "name": "Bay Area",
            "countries": ["US"],
            "postal_prefixes": ["940", "941", "945"],
            "rep": "cai@example.com",
        },
    ],
    "accounts": [
        {"domain": "acme.com", "name": "Acme", "owner": "bob@example.com", "tier": "enterprise"}
    ],
    "value_lists": [{"name": "competitors", "values": ["rival.io", "othercorp.com"]}],
    "ruleset": {
        "name": "Inbound routing",
        "rules": [
            {
                "name": "Exclude competitors",
                "priority": 10,
                "when": {
                    "all": [{"field": "email_domain", "op": "in_list", "value": "competitors"}]
                },
                "action": {"type": "exclude", "reason": "competitor"},
            },
            {
                "name": "Hot leads",
                "priority": 20,
                "when": {"all": [{"field": "lead_score", "op": "gte", "value": 80}]},
                "action": {"type": "tag", "priority": "hot", "sla_minutes": 5, "tags": ["hot"]},
            },
            {"name": "Named accounts", "priority": 30, "action": {"type": "account_owner"}},
            {
                "name": "Enterprise",
                "priority": 40,
                "when": {
                    "any": [
                        {"field": "employees", "op": "gte", "value": 1000},
                        {"field": "account.tier", "op": "eq", "value": "enterprise"},
                    ]
                },
                "action": {"type": "team", "team": "Enterprise AE"},
                "sla_minutes": 30,
                "on_sla_breach": "reassign",
            },
            {"name": "By territory", "priority": 50, "action": {"type": "territory"}},
            {
                "name": "Catch-all",
                "priority": 1000,
                "action": {"type": "team", "team": "Inbound SDR"},
            },
        ],
    },
}

MODELS: tuple[type[models.Model], ...] = (
    Source,
    Rep,
    Team,
    TeamMembership,
    Territory,
    Account,
    ValueList,
    RuleSet,
    Rule,
)


def example(change: Callable[[dict[str, Any]], object] | None = None) -> dict[str, Any]:
    """A deep copy of EXAMPLE, changed in place by ``change``."""
    data = copy.deepcopy(EXAMPLE)
    if change is not None:
        change(data)
    return data


def row_counts() -> dict[str, int]:
    return {model.__name__: model._default_manager.count() for model in MODELS}


def import_errors(data: Any) -> list[str]:
    """Every ``path: message`` an import reports, after checking that it wrote nothing."""
    before = row_counts()
    with pytest.raises(RulesFileErrors) as caught:
        rules_import(data, publish=True)
    assert row_counts() == before
    return [str(error) for error in caught.value.errors]


# --- Round trip and idempotence ----------------------------------------------------------------


def test_the_spec_example_imports_and_round_trips() -> None:
    result = rules_import(example(), publish=True)
    assert result.created
    assert (result.ruleset.version, result.ruleset.status) == (1, RuleSetStatus.PUBLISHED)
    first = rules_export()
    assert first["ruleset"] == EXAMPLE["ruleset"]
    assert [rep["email"] for rep in first["reps"]] == [
        "ana@example.com",
        "ben@example.com",
        "bob@example.com",
        "cai@example.com",
    ]
    assert first["teams"][0] == {
        "name": "EMEA SDR",
        "strategy": "round_robin",
        "respect_working_hours": False,
        "sla_minutes": 60,
        "members": [
            {"rep": "ana@example.com", "weight": 1},
            {"rep": "ben@example.com", "weight": 2},
        ],
    }
    assert first["territories"][2] == {
        "name": "Bay Area",
        "countries": ["US"],
        "regions": [],
        "postal_prefixes": ["940", "941", "945"],
        "rep": "cai@example.com",
    }
    assert "token" not in first["sources"][0]

    second_import = rules_import(json.loads(json.dumps(first)), publish=True)
    assert not second_import.created  # identical to the live version: reused
    second = rules_export()
    assert json.dumps(second) == json.dumps(first)


def test_an_export_rebuilds_the_same_configuration_in_an_empty_database() -> None:
    rules_import(example(), publish=True)
    first = rules_export()
    from django.db import connection

    from routing.version_triggers import version_triggers_create, version_triggers_drop

    version_triggers_drop(connection)  # empty the database (published versions are frozen)
    for model in (Rule, RuleSet, Territory, Account, TeamMembership, Team, Rep, ValueList, Source):
        model._default_manager.all().delete()
    version_triggers_create(connection)
    rules_import(first, publish=True)
    assert json.dumps(rules_export()) == json.dumps(first)


def test_importing_the_same_file_twice_changes_nothing() -> None:
    rules_import(example(), publish=False)
    snapshot = {
        model.__name__: list(model._default_manager.order_by("pk").values()) for model in MODELS
    }
    result = rules_import(example(), publish=False)
    assert not result.created
    assert result.ruleset.version == 1
    assert {
        model.__name__: list(model._default_manager.order_by("pk").values()) for model in MODELS
    } == snapshot


def test_a_draft_identical_to_the_file_is_published_rather_than_copied() -> None:
    draft = rules_import(example(), publish=False).ruleset
    assert draft.status == RuleSetStatus.DRAFT
    result = rules_import(example(), publish=True)
    assert not result.created
    assert (result.ruleset.pk, result.ruleset.status) == (draft.pk, RuleSetStatus.PUBLISHED)


def test_publish_archives_the_previous_version() -> None:
    v1 = rules_import(example(), publish=True).ruleset

    def raise_the_bar(data: dict[str, Any]) -> None:
        data["ruleset"]["rules"][1]["when"]["all"][0]["value"] = 90

    v2 = rules_import(example(raise_the_bar), publish=True).ruleset
    assert v2.version == 2
    assert dict(RuleSet.objects.values_list("version", "status")) == {
        1: RuleSetStatus.ARCHIVED,
        2: RuleSetStatus.PUBLISHED,
    }
    assert ruleset_published() == v2
    assert rules_export(version=v1.version)["ruleset"] == EXAMPLE["ruleset"]
    # Without --publish a changed file is a new draft; the live version stays.
    v3 = rules_import(example(), publish=False).ruleset
    assert (v3.version, v3.status) == (3, RuleSetStatus.DRAFT)
    assert ruleset_published() == v2


def test_keys_left_out_keep_their_value_and_nothing_is_deleted() -> None:
    rules_import(example(), publish=True)
    ana = Rep.objects.get(email="ana@example.com")
    ana.out_of_office_until = ana.created_at
    ana.save()
    RepFactory(email="zoe@example.com")

    def slim(data: dict[str, Any]) -> None:
        data["reps"] = [{"email": "ANA@example.com", "name": "Ana B."}]
        data["teams"] = [{"name": "EMEA SDR", "members": [{"rep": "ben@example.com"}]}]
        del data["territories"], data["accounts"], data["sources"]

    rules_import(example(slim), publish=True)
    ana.refresh_from_db()
    assert (ana.email, ana.name, ana.timezone) == ("ANA@example.com", "Ana B.", "Europe/Berlin")
    assert ana.out_of_office_until == ana.created_at
    assert Rep.objects.filter(email="zoe@example.com").exists()
    assert Territory.objects.count() == 3
    emea = Team.objects.get(name="EMEA SDR")
    assert emea.sla_minutes == 60
    assert list(emea.memberships.values_list("rep__email", "weight", "position")) == [
        ("ben@example.com", 1, 0)
    ]


def test_members_are_replaced_in_file_order_and_the_rotation_state_kept() -> None:
    rules_import(example(), publish=True)
    Team.objects.filter(name="EMEA SDR").update(rotation_state={"team_id": 1, "last_rep_id": 1})

    def reorder(data: dict[str, Any]) -> None:
        data["teams"][0]["members"] = [
            {"rep": "cai@example.com", "weight": 1},
            {"rep": "ben@example.com", "weight": 2},
            {"rep": "ana@example.com", "weight": 1},
        ]

    rules_import(example(reorder), publish=True)
    emea = Team.objects.get(name="EMEA SDR")
    assert list(emea.memberships.values_list("rep__email", "position")) == [
        ("cai@example.com", 0),
        ("ben@example.com", 1),
        ("ana@example.com", 2),
    ]
    assert emea.rotation_state == {"team_id": 1, "last_rep_id": 1}


def test_a_territory_can_move_from_a_team_to_a_rep() -> None:
    rules_import(example(), publish=True)

    def move(data: dict[str, Any]) -> None:
        data["territories"][0] = {
            "name": "DACH",
            "countries": ["de", "at"],
            "rep": "ana@example.com",
        }

    rules_import(example(move), publish=True)
    dach = Territory.objects.get(name="DACH")
    assert (dach.team_id, dach.rep.email, dach.countries) == (None, "ana@example.com", ["DE", "AT"])


def test_sources_get_the_files_token_or_a_fresh_one_shown_once() -> None:
    def two_sources(data: dict[str, Any]) -> None:
        data["sources"].append({"slug": "webform", "name": "Web form"})

    result = rules_import(example(two_sources), publish=True)
    webinar, webform = Source.objects.get(slug="webinar"), Source.objects.get(slug="webform")
    assert webinar.token_hash == token_digest("optional-plain-token")
    assert set(result.source_tokens) == {"webform"}
    assert webform.token_hash == token_digest(result.source_tokens["webform"])
    assert webinar.field_map == {"Email Address": "email", "Org": "company"}

    def rotate_in_file(data: dict[str, Any]) -> None:
        two_sources(data)
        data["sources"][0].update(token="another-plain-token", rate_limit_per_minute=60)

    again = rules_import(example(rotate_in_file), publish=True)
    assert again.source_tokens == {}
    webinar.refresh_from_db()
    # An import never replaces a working token (that is the admin's rotate, with an overlap).
    assert webinar.token_hash == token_digest("optional-plain-token")
    assert webinar.rate_limit_per_minute == 60


def test_the_actor_is_recorded() -> None:
    user = get_user_model().objects.create_user("revops")
    ruleset = rules_import(example(), publish=True, actor=user).ruleset
    assert (ruleset.created_by, ruleset.published_by) == (user, user)
    assert ruleset.published_at is not None


# --- Errors: every one reported with its path, nothing written -------------------------------


def test_every_kind_of_error_is_reported_with_its_path_and_nothing_is_written() -> None:
    rules_import(example(), publish=True)  # existing rows must stay exactly as they are

    def break_everything(data: dict[str, Any]) -> None:
        data["reps"][0]["timezone"] = "Mars/Olympus_Mons"
        data["reps"][2]["email"] = "not-an-email"
        data["teams"][0]["members"][1]["rep"] = "x@y.example"
        data["territories"][0]["team"] = "Nobody"
        rules = data["ruleset"]["rules"]
        rules[0]["when"]["all"][0]["value"] = "no-such-list"
        rules[1]["priority"] = 10
        rules[3]["when"] = {"all": [{"field": "country", "op": "equalz", "value": "DE"}]}
        rules[4]["when"] = {"all": [{"field": "email", "op": "matches", "value": "(unclosed"}]}
        rules[5]["action"]["team"] = "Outbound SDR"

    errors = import_errors(example(break_everything))
    assert errors[:4] == [
        'reps[0].timezone: unknown time zone "Mars/Olympus_Mons"',
        'reps[2].email: must be an e-mail address, got "not-an-email"',
        'teams[0].members[1].rep: unknown rep "x@y.example"',
        'territories[0].team: unknown team "Nobody"',
    ]
    rule_errors = errors[4:]
    assert 'ruleset.rules[0].when.all[0].value: unknown value list "no-such-list"' in rule_errors
    assert "ruleset.rules[1].priority: duplicate priority 10 (also rules[0])" in rule_errors
    assert 'ruleset.rules[3].when.all[0].op: unknown operator "equalz"' in rule_errors
    assert any(
        error.startswith("ruleset.rules[4].when.all[0].value: bad regular expression")
        for error in rule_errors
    )
    assert 'ruleset.rules[5].action.team: unknown team "Outbound SDR"' in rule_errors
    assert len(errors) == 9
    # The first import is untouched: still one version, Ana still in Berlin.
    assert Rep.objects.get(email="ana@example.com").timezone == "Europe/Berlin"
    assert RuleSet.objects.count() == 1


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d.update(sources={"slug": "x"}), "sources: must be a list, got an object"),
        (lambda d: d["reps"].append("ana"), 'reps[4]: must be an object, got "ana"'),
        (lambda d: d["reps"][1].pop("name"), "reps[1].name: is required"),
        (lambda d: d["reps"][1].update(nickname="B"), 'reps[1].nickname: unknown key "nickname"'),
        (lambda d: d.update(rulez=[]), 'rulez: unknown section "rulez"'),
        (lambda d: d.pop("ruleset"), "ruleset: is required"),
        (lambda d: d["ruleset"].update(rules={}), "ruleset.rules: must be a list of rules"),
        (
            lambda d: d["reps"].append({"email": "ANA@example.com", "name": "Ana 2"}),
            'reps[4]: duplicate "ANA@example.com" (also reps[0])',
        ),
        (
            lambda d: d["reps"][0].update(max_open=0),
            "reps[0].max_open: must be a whole number of at least 1 or null, got 0",
        ),
        (
            lambda d: d["reps"][0].update(out_of_office_until="2026-05-04 18:00"),
            "reps[0].out_of_office_until: must be an ISO 8601 date-time with a UTC offset",
        ),
        (
            lambda d: d["reps"][0]["working_hours"].update(end="25:00"),
            'reps[0].working_hours.end: must be a time "HH:MM"',
        ),
        (
            lambda d: d["teams"][1].update(strategy="random"),
            'teams[1].strategy: must be one of "round_robin", "weighted", "least_loaded"',
        ),
        (
            lambda d: d["teams"][0]["members"].append({"rep": "ana@example.com"}),
            'teams[0].members[2].rep: "ana@example.com" is already a member (teams[0].members[0])',
        ),
        (
            lambda d: d["teams"][0]["members"][0].update(weight=0),
            "teams[0].members[0].weight: must be a whole number of at least 1, got 0",
        ),
        (
            lambda d: d["territories"][0].update(countries=["DE", "XX"]),
            "territories[0].countries[1]: unknown country code 'XX'",
        ),
        (
            lambda d: d["territories"][2].update(team="EMEA SDR"),
            "territories[2]: has both a team and a rep: give one",
        ),
        (
            lambda d: d["territories"][2].pop("rep"),
            "territories[2]: needs a team or a rep",
        ),
        (
            lambda d: d["accounts"][0].update(owner="nobody@example.com"),
            'accounts[0].owner: unknown rep "nobody@example.com"',
        ),
        (
            lambda d: d["accounts"][0].update(domain="https://acme.com"),
            "accounts[0].domain: must be a lower-case domain",
        ),
        (
            lambda d: d["value_lists"][0].update(values=["a", ""]),
            "value_lists[0].values[1]: must be non-empty text",
        ),
        (
            lambda d: d["sources"][0].update(slug="web inar"),
            "sources[0].slug: must be a slug",
        ),
        (
            lambda d: d["sources"][0].update(token="short"),
            "sources[0].token: must be text of 16 to 512 characters",
        ),
        (
            lambda d: d["ruleset"]["rules"][2]["action"].update(type="round_robin"),
            'ruleset.rules[2].action.type: unknown action type "round_robin"',
        ),
        (
            lambda d: d["ruleset"]["rules"][2].update(name="Hot leads"),
            'ruleset.rules[2].name: duplicate name "Hot leads" (also rules[1])',
        ),
    ],
)
def test_each_error_names_its_path(
    change: Callable[[dict[str, Any]], object], expected: str
) -> None:
    errors = import_errors(example(change))
    assert any(error.startswith(expected) for error in errors), errors
    assert len(errors) == 1, errors


def test_a_definition_with_an_error_does_not_also_break_its_references() -> None:
    def bad_team(data: dict[str, Any]) -> None:
        data["teams"][1]["strategy"] = "random"  # "Enterprise AE", used by rules[3]

    assert import_errors(example(bad_team)) == [
        'teams[1].strategy: must be one of "round_robin", "weighted", "least_loaded", got "random"'
    ]


def test_references_may_point_at_rows_already_in_the_database() -> None:
    TeamFactory(name="Existing team")
    RepFactory(email="old@example.com")
    rules_import(
        {
            "teams": [{"name": "New team", "members": [{"rep": "OLD@example.com"}]}],
            "ruleset": {
                "name": "Small",
                "rules": [
                    {
                        "name": "A",
                        "priority": 1,
                        "action": {"type": "team", "team": "Existing team"},
                    },
                    {
                        "name": "B",
                        "priority": 2,
                        "action": {"type": "rep", "rep": "old@example.com"},
                    },
                ],
            },
        },
        publish=True,
    )
    assert Team.objects.get(name="New team").members.get().email == "old@example.com"


def test_a_document_that_is_not_an_object_is_one_error() -> None:
    assert import_errors([1, 2]) == ["must be an object, got a list"]


# --- Parsing ------------------------------------------------------------------------------------


def test_json_parse_errors_have_a_position() -> None:
    with pytest.raises(RulesFileErrors, match=r"not valid JSON: .*\(line 1, column 2\)"):
        rules_parse("{,}")
    with pytest.raises(RulesFileErrors, match="NaN is not a JSON number"):
        rules_parse('{"x": NaN}')


def test_yaml_reads_plain_scalars_as_yaml_1_2_does() -> None:
    data = rules_parse(
        "territories:\n"
        "  - {name: Nordics, countries: [NO, SE], postal_prefixes: [010, 0150], team: Nordics}\n"
        "reps:\n"
        "  - email: ana@example.com\n"
        "    out_of_office_until: 2026-05-04T18:00:00Z\n"
        "    working_hours: {days: [1, 2], start: 08:00, end: 18:30}\n"
        "    max_open: 5\n"
        "    active: yes\n",
        yaml_format=True,
    )
    assert data["territories"][0]["countries"] == ["NO", "SE"]
    assert data["territories"][0]["postal_prefixes"] == ["010", "0150"]
    rep = data["reps"][0]
    assert rep["working_hours"] == {"days": [1, 2], "start": "08:00", "end": "18:30"}
    assert rep["out_of_office_until"] == "2026-05-04T18:00:00Z"
    assert (rep["max_open"], rep["active"]) == (5, "yes")  # "yes" is text: reported, not guessed


def test_yaml_syntax_errors_are_reported() -> None:
    with pytest.raises(RulesFileErrors, match="not valid YAML"):
        rules_parse("reps: [", yaml_format=True)
    with pytest.raises(RulesFileErrors, match="not valid YAML"):
        rules_parse("!!python/object:os.system {}", yaml_format=True)


# --- Ruleset versions --------------------------------------------------------------------------


def test_only_a_draft_can_be_published() -> None:
    live = RuleSetFactory(published=True)
    with pytest.raises(RuleErrors, match="is published, not a draft"):
        ruleset_publish(ruleset=live)


def test_a_draft_whose_rules_no_longer_compile_is_not_published() -> None:
    team = TeamFactory(name="Gone")
    rule = RuleFactory(action={"type": "team", "team": "Gone"})
    team.delete()
    with pytest.raises(RuleErrors) as caught:
        ruleset_publish(ruleset=rule.ruleset)
    assert str(caught.value) == 'ruleset.rules[0].action.team: unknown team "Gone"'
    assert not RuleSet.objects.filter(status=RuleSetStatus.PUBLISHED).exists()


def test_rolling_back_copies_an_old_version_and_publishes_the_copy() -> None:
    v1 = rules_import(example(), publish=True).ruleset
    rules_import(example(lambda d: d["ruleset"]["rules"].pop()), publish=True)
    v3 = ruleset_publish(ruleset=ruleset_copy(ruleset=v1))
    assert v3.version == 3
    assert rules_export()["ruleset"] == EXAMPLE["ruleset"]
    assert dict(RuleSet.objects.values_list("version", "status")) == {
        1: RuleSetStatus.ARCHIVED,
        2: RuleSetStatus.ARCHIVED,
        3: RuleSetStatus.PUBLISHED,
    }


def test_a_version_number_taken_meanwhile_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    RuleSetFactory(version=1)
    real = RuleSet.objects.aggregate
    stale = iter([{"latest": 0}])  # as if another import took 1 after we looked

    def aggregate(*args: Any, **kwargs: Any) -> Any:
        return next(stale, None) or real(*args, **kwargs)

    monkeypatch.setattr(RuleSet.objects, "aggregate", aggregate)
    draft = ruleset_add_draft(ruleset=RuleSet(name="Mine"))
    assert draft.version == 2


def test_the_published_ruleset_selector_prefetches_rules_in_priority_order(
    django_assert_num_queries: Any,
) -> None:
    rules_import(example(), publish=True)
    with django_assert_num_queries(2):
        live = ruleset_published()
        assert live is not None
        priorities = [rule.priority for rule in live.rules.all()]
    assert priorities == [10, 20, 30, 40, 50, 1000]


def test_export_without_a_published_version_says_so() -> None:
    with pytest.raises(RuleSet.DoesNotExist, match="no published ruleset"):
        rules_export()
    with pytest.raises(RuleSet.DoesNotExist, match="no ruleset version 4"):
        rules_export(version=4)


# --- Commands -----------------------------------------------------------------------------------


def test_import_command_publishes_and_export_command_writes_the_same_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(example()))
    call_command("routing_import", str(path), "--publish")
    out = capsys.readouterr().out
    assert "ruleset new version 1 (published)" in out
    call_command("routing_export")
    exported = json.loads(capsys.readouterr().out)
    assert exported == rules_export()

    output = tmp_path / "out.json"
    call_command("routing_export", "--version", "1", "--output", str(output))
    assert json.loads(output.read_text()) == exported


def test_an_export_to_a_yaml_file_is_yaml_that_imports_back_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--output rules.yaml` wrote JSON; it writes YAML now, which the import reads back."""
    from routing.rules_io import rules_parse

    data = example()
    data["territories"][0]["postal_prefixes"] = ["01067", "1010", "no", "yes"]
    rules_import(data, publish=True)
    exported = rules_export()
    output = tmp_path / "rules.yaml"
    call_command("routing_export", "--output", str(output))
    text = output.read_text()
    assert not text.lstrip().startswith("{")
    assert rules_parse(text, yaml_format=True) == exported
    call_command("routing_export", "--format", "yaml")
    assert rules_parse(capsys.readouterr().out, yaml_format=True) == exported


def test_import_command_prints_every_error_and_exits_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def two_errors(data: dict[str, Any]) -> None:
        data["reps"][0]["timezone"] = "Nowhere"
        data["ruleset"]["rules"][3]["when"] = {"all": [{"field": "x", "op": "equalz"}]}

    path = tmp_path / "rules.json"
    path.write_text(json.dumps(example(two_errors)))
    before = row_counts()
    with pytest.raises(CommandError, match=r"errors in .*; nothing written") as caught:
        call_command("routing_import", str(path))
    assert caught.value.returncode == 1
    err = capsys.readouterr().err
    assert 'reps[0].timezone: unknown time zone "Nowhere"' in err
    assert 'ruleset.rules[3].when.all[0].op: unknown operator "equalz"' in err
    assert row_counts() == before


def test_import_command_reads_yaml_and_shows_new_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(
        "sources:\n"
        "  - {slug: webform, name: Web form}\n"
        "reps:\n"
        "  - {email: ana@example.com, name: Ana}\n"
        "ruleset:\n"
        "  name: Simple\n"
        "  rules:\n"
        "    - {name: Everyone to Ana, priority: 1, action: {type: rep, rep: ana@example.com}}\n"
    )
    call_command("routing_import", str(path), "--publish")
    out = capsys.readouterr().out
    assert "ruleset new version 1 (published)" in out
    assert "Token for new source webform:" in out
    call_command("routing_import", str(path), "--publish")
    assert "unchanged; reused version 1 (published)" in capsys.readouterr().out


def test_import_check_validates_against_the_database_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "reps:\n"
        "  - {email: ana@example.com, name: Ana}\n"
        "ruleset:\n"
        "  name: Simple\n"
        "  rules:\n"
        "    - {name: Everyone to Ana, priority: 1, action: {type: rep, rep: ana@example.com}}\n"
    )
    call_command("routing_import", str(path), "--check")
    assert "is valid; its ruleset differs from the no published version" in capsys.readouterr().out
    assert (Rep.objects.count(), RuleSet.objects.count()) == (0, 0)

    call_command("routing_import", str(path), "--publish")
    capsys.readouterr()
    call_command("routing_import", str(path), "--check")
    assert "its ruleset is the published version 1. Nothing written." in capsys.readouterr().out

    path.write_text(path.read_text().replace("priority: 1", "priority: 2"))
    call_command("routing_import", str(path), "--check")
    assert "differs from the published version 1" in capsys.readouterr().out
    assert RuleSet.objects.count() == 1

    path.write_text(path.read_text().replace("rep: ana@example.com}", "rep: bo@example.com}"))
    with pytest.raises(CommandError, match=r"1 error in .*nothing written"):
        call_command("routing_import", str(path), "--check")
    assert 'unknown rep "bo@example.com"' in capsys.readouterr().err
    with pytest.raises(CommandError, match="cannot be combined"):
        call_command("routing_import", str(path), "--check", "--publish")


def test_commands_report_a_missing_file_or_version(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="1 error in"):
        call_command("routing_import", str(tmp_path / "missing.json"))
    with pytest.raises(CommandError, match="no published ruleset"):
        call_command("routing_export")


# --- Admin --------------------------------------------------------------------------------------


def test_admin_shows_published_rulesets_read_only(admin_client: Any) -> None:
    live = rules_import(example(), publish=True).ruleset
    draft = ruleset_copy(ruleset=live)
    page = admin_client.get(f"/admin/routing/ruleset/{live.pk}/change/")
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    assert b'name="_save"' in admin_client.get(f"/admin/routing/ruleset/{draft.pk}/change/").content
    for model in ("rep", "team", "territory", "account", "valuelist", "ruleset", "rule"):
        assert admin_client.get(f"/admin/routing/{model}/").status_code == 200
    team = Team.objects.get(name="EMEA SDR")
    assert admin_client.get(f"/admin/routing/team/{team.pk}/change/").status_code == 200


def test_admin_publish_action_publishes_the_selected_draft(admin_client: Any) -> None:
    live = rules_import(example(), publish=True).ruleset
    draft = ruleset_copy(ruleset=live)
    response = admin_client.post(
        "/admin/routing/ruleset/",
        {"action": "publish", "_selected_action": [draft.pk]},
        follow=True,
    )
    assert response.status_code == 200
    draft.refresh_from_db()
    live.refresh_from_db()
    assert (draft.status, live.status) == (RuleSetStatus.PUBLISHED, RuleSetStatus.ARCHIVED)


def _ruleset_form(**rule: str) -> dict[str, str]:
    return {
        "name": "Hand-made",
        "note": "",
        "rules-TOTAL_FORMS": "1",
        "rules-INITIAL_FORMS": "0",
        "rules-MIN_NUM_FORMS": "0",
        "rules-MAX_NUM_FORMS": "1000",
        "rules-0-priority": "10",
        "rules-0-name": "Germany",
        "rules-0-on_sla_breach": "notify",
        "rules-0-active": "on",
        **{f"rules-0-{key}": value for key, value in rule.items()},
    }


def test_admin_adds_a_draft_with_the_next_version_and_checks_its_rules(admin_client: Any) -> None:
    RuleSetFactory(version=4, published=True)
    TeamFactory(name="EMEA SDR")
    bad = admin_client.post(
        "/admin/routing/ruleset/add/",
        _ruleset_form(
            when='{"all": [{"field": "country", "op": "equalz", "value": "DE"}]}',
            action='{"type": "team", "team": "EMEA SDR"}',
        ),
    )
    assert bad.status_code == 200
    assert "when.all[0].op: unknown operator &quot;equalz&quot;" in bad.content.decode()
    assert RuleSet.objects.count() == 1

    good = admin_client.post(
        "/admin/routing/ruleset/add/",
        _ruleset_form(
            when='{"all": [{"field": "country", "op": "eq", "value": "DE"}]}',
            action='{"type": "team", "team": "EMEA SDR"}',
        ),
    )
    assert good.status_code == 302
    draft = RuleSet.objects.get(name="Hand-made")
    assert (draft.version, draft.status, draft.created_by.username) == (
        5,
        RuleSetStatus.DRAFT,
        "admin",
    )
    assert list(draft.rules.values_list("name", flat=True)) == ["Germany"]


@pytest.mark.django_db
def test_a_member_weight_over_the_cap_is_refused_with_its_path():
    from routing.engine import MAX_MEMBER_WEIGHT
    from routing.rules_io import RulesFileErrors, rules_import

    document = {
        "reps": [{"email": "a@example.com", "name": "A"}],
        "teams": [
            {
                "name": "T",
                "strategy": "weighted",
                "members": [{"rep": "a@example.com", "weight": MAX_MEMBER_WEIGHT + 1}],
            }
        ],
    }
    with pytest.raises(RulesFileErrors) as caught:
        rules_import(document, publish=False)
    assert "teams[0].members[0].weight" in str(caught.value)
    assert f"at most {MAX_MEMBER_WEIGHT}" in str(caught.value)


@pytest.mark.django_db
def test_a_teams_weights_adding_up_past_the_cap_are_refused_with_the_path():
    from routing.engine import MAX_TEAM_WEIGHT
    from routing.rules_io import RulesFileErrors, rules_import

    document = {
        "reps": [{"email": f"r{i}@example.com", "name": f"R{i}"} for i in range(3)],
        "teams": [
            {
                "name": "T",
                "strategy": "weighted",
                "members": [{"rep": f"r{i}@example.com", "weight": 400} for i in range(3)],
            }
        ],
    }
    with pytest.raises(RulesFileErrors) as caught:
        rules_import(document, publish=False)
    assert f"teams[0].members: the weights add up to 1200; at most {MAX_TEAM_WEIGHT}" in str(
        caught.value
    )


def test_a_secret_kind_option_is_not_exported_and_survives_an_import_of_the_export():
    from tests.leads.factories import SourceFactory

    rules_import(example(), publish=True)
    source = SourceFactory(
        slug="meta", kind="meta_lead_ads", kind_options={"verify_token": "vt-secret", "x": 1}
    )
    exported = rules_export()
    (entry,) = [s for s in exported["sources"] if s["slug"] == "meta"]
    assert entry["kind_options"] == {"x": 1}
    assert "vt-secret" not in json.dumps(exported)
    rules_import(exported, publish=False)
    source.refresh_from_db()
    assert source.kind_options == {"verify_token": "vt-secret", "x": 1}
    assert Source.objects.get(slug="meta").kind == "meta_lead_ads"
