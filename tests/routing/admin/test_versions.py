"""Versions from the admin: reorder, compare, simulate, replay, test cases, publish, roll back."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone

from leads.models import LeadStatus
from routing.models import (
    Assignment,
    ExpectedStatus,
    Rep,
    RoutingTestCase,
    Rule,
    RuleSet,
    RuleSetStatus,
    Team,
    TeamMembership,
)
from routing.versions import (
    rule_move,
    rules_reorder,
    ruleset_diff,
    ruleset_new_draft,
    ruleset_replay,
    ruleset_rollback,
    team_next_up,
)
from tests.leads.factories import LeadFactory
from tests.routing.factories import AssignmentFactory, make_rep, team_with


def _rules(ruleset: RuleSet) -> list[tuple[str, int]]:
    return list(ruleset.rules.order_by("priority").values_list("name", "priority"))


@pytest.fixture
def draft(live: RuleSet) -> RuleSet:
    draft = ruleset_new_draft(ruleset=live)
    Rule.objects.create(ruleset=draft, name="Catch-all", priority=1000, action={"type": "exclude"})
    Rule.objects.create(ruleset=draft, name="Hot", priority=20, action={"type": "tag"})
    return draft


def test_move_up_and_down_swaps_priorities_without_breaking_uniqueness(client_revops, draft):
    hot = Rule.objects.get(ruleset=draft, name="Hot")
    response = client_revops.post(reverse("admin:routing_rule_move", args=[hot.pk, "up"]))
    assert response.status_code == 302
    assert _rules(draft) == [("Hot", 10), ("Germany", 20), ("Catch-all", 1000)]
    rule_move(rule=hot, direction="up")  # already first: nothing moves
    rule_move(rule=Rule.objects.get(ruleset=draft, name="Catch-all"), direction="up")
    assert _rules(draft) == [("Hot", 10), ("Catch-all", 20), ("Germany", 1000)]


def test_reorder_renumbers_and_published_versions_refuse(draft, live):
    ids = dict(draft.rules.values_list("name", "id"))
    rules_reorder(ruleset=draft, rule_ids=[ids["Catch-all"], ids["Germany"], ids["Hot"]])
    assert _rules(draft) == [("Catch-all", 10), ("Germany", 20), ("Hot", 30)]
    with pytest.raises(ValidationError, match="must list every rule"):
        rules_reorder(ruleset=draft, rule_ids=[ids["Hot"]])
    with pytest.raises(ValidationError, match="only drafts can change"):
        rule_move(rule=live.rules.get(), direction="down")


def test_diff_names_added_removed_changed_and_reordered(live, draft):
    Rule.objects.filter(ruleset=draft, name="Germany").update(
        when={"all": [{"field": "country", "op": "in", "value": ["DE", "AT"]}]}
    )
    diff = ruleset_diff(old=live, new=draft)
    assert [r.name for r in diff.added] == ["Hot", "Catch-all"]
    assert diff.removed == ()
    assert [(c.name, c.changes) for c in diff.changed] == [
        ("Germany", (("condition", "country is DE", "country in DE, AT"),))
    ]
    back = ruleset_diff(old=draft, new=live)
    assert [r.name for r in back.removed] == ["Hot", "Catch-all"]
    swapped = ruleset_new_draft(ruleset=draft)
    ids = dict(swapped.rules.values_list("name", "id"))
    rules_reorder(ruleset=swapped, rule_ids=[ids["Germany"], ids["Catch-all"], ids["Hot"]])
    assert ruleset_diff(old=draft, new=swapped).reordered == ("Catch-all",)
    assert ruleset_diff(old=draft, new=ruleset_new_draft(ruleset=draft)).is_empty


def test_compare_page_shows_the_differences(client_revops, live, draft):
    url = reverse("admin:routing_ruleset_diff")
    body = client_revops.get(url, {"old": live.version, "new": draft.version}).content.decode()
    assert "Added" in body
    assert "Catch-all" in body


def test_simulate_page_shows_draft_and_published_side_by_side_and_writes_nothing(
    client_revops, live, emea
):
    draft = ruleset_new_draft(ruleset=live)
    Rule.objects.filter(ruleset=draft).update(action={"type": "exclude", "reason": "paused"})
    response = client_revops.post(
        reverse("admin:routing_ruleset_simulate"),
        {"draft": draft.version, "email": "max@firma.de", "country": "Germany"},
    )
    assert response.status_code == 200
    columns = response.context["columns"]
    assert [(ruleset.version, outcome.status) for ruleset, outcome in columns] == [
        (draft.version, "excluded"),
        (live.version, "assigned"),
    ]
    published = columns[1][1]
    assert (published.owner_label, published.team, published.rule) == (
        "Ana <ana@x.example>",
        "EMEA SDR",
        "Germany",
    )
    assert published.sla_minutes == 60
    assert any(line.startswith("→ Germany") for line in published.trace)
    emea.refresh_from_db()
    assert emea.rotation_state == {}
    assert not Assignment.objects.exists()


def test_simulate_page_takes_pasted_json_and_reports_bad_json(client_revops, live):
    url = reverse("admin:routing_ruleset_simulate")
    bad = client_revops.post(url, {"lead_json": "{nope"})
    assert "Not valid JSON" in bad.content.decode()
    good = client_revops.post(url, {"lead_json": '{"Email": "a@b.de", "Country": "DE"}'})
    assert good.context["columns"][0][1].status == "assigned"


def _processed_lead(rep: Rep, team: Team, country: str = "DE") -> None:
    lead = LeadFactory(
        status=LeadStatus.ASSIGNED,
        country=country,
        email=f"x{rep.pk}{country}@firma.de",
        processed_at=timezone.now(),
    )
    AssignmentFactory(lead=lead, rep=rep, team=team, team_name=team.name)


def test_replay_lists_the_leads_that_would_change_and_counts_per_rep(client_revops, live, emea):
    ana = Rep.objects.get(email="ana@x.example")
    cai = make_rep(email="cai@x.example", name="Cai")
    team_with([cai], name="DACH AE")
    _processed_lead(ana, emea)
    _processed_lead(ana, emea, country="FR")
    draft = ruleset_new_draft(ruleset=live)
    Rule.objects.filter(ruleset=draft).update(action={"type": "team", "team": "DACH AE"})
    result = ruleset_replay(ruleset=draft, limit=500)
    assert result.considered == 2
    assert sorted((row.lead.country, row.after.rep, row.changed) for row in result.rows) == [
        ("DE", "cai@x.example", ("owner", "team")),
        ("FR", "", ("owner", "team", "status")),  # no rule yields any more
    ]
    assert {rep: (b, a) for rep, b, a, _d in result.per_rep} == {
        "Ana <ana@x.example>": (2, 0),
        "Cai <cai@x.example>": (0, 1),
    }
    page = client_revops.get(
        reverse("admin:routing_ruleset_replay", args=[draft.pk]), {"run": "1", "n": "10"}
    )
    assert "2 of 2 leads would change" in page.content.decode()
    assert Assignment.objects.filter(rep=cai).count() == 0
    emea.refresh_from_db()
    assert emea.rotation_state == {}


def test_replay_counts_each_replayed_lead_against_its_new_owner(live, emea):
    """Routing the leads one after another raises each owner's load for the next lead: a
    least-loaded team spreads them, and a cap stops a rep (one rep took all 30 before)."""
    ana = Rep.objects.get(email="ana@x.example")
    reps = [make_rep(email=f"ll{i}@x.example", name=f"LL{i}") for i in range(3)]
    Rep.objects.filter(pk=reps[2].pk).update(max_open=1)
    team_with(reps, name="Least loaded", strategy="least_loaded")
    for i in range(9):
        _processed_lead(ana, emea, country=f"D{i}")
    draft = ruleset_new_draft(ruleset=live)
    Rule.objects.filter(ruleset=draft).update(action={"type": "team", "team": "Least loaded"})
    Rule.objects.filter(ruleset=draft).update(when=None)
    result = ruleset_replay(ruleset=draft, limit=500)
    after = {rep: a for rep, _b, a, _d in result.per_rep if a}
    assert after == {"LL0 <ll0@x.example>": 4, "LL1 <ll1@x.example>": 4, "LL2 <ll2@x.example>": 1}


def test_replaying_the_same_rules_changes_nothing_for_a_rep_at_their_cap(live, emea):
    """A replayed lead is routed again as if it were new: its own open assignment no longer
    counts against its holder. Ana (cap 1) holds one open lead; replaying the live rules must
    leave it with her, not report it as moving because she is "full" with that very lead."""
    ana = Rep.objects.get(email="ana@x.example")
    Rep.objects.filter(pk=ana.pk).update(max_open=1, max_per_day=1)
    _processed_lead(ana, emea)
    result = ruleset_replay(ruleset=live, limit=500)
    assert result.considered == 1
    assert [(row.before.rep, row.after.rep, row.changed) for row in result.rows] == []
    assert {rep: (b, a) for rep, b, a, _d in result.per_rep} == {"Ana <ana@x.example>": (1, 1)}


def test_publish_with_failing_test_cases_needs_a_confirmation(client_revops, revops, live, emea):
    draft = ruleset_new_draft(ruleset=live)
    Rule.objects.filter(ruleset=draft).update(action={"type": "exclude", "reason": "paused"})
    RoutingTestCase.objects.create(
        name="German lead goes to EMEA",
        lead={"email": "a@firma.de", "country": "DE"},
        expected_status=ExpectedStatus.ASSIGNED,
        expected_team=emea,
    )
    tests = client_revops.get(reverse("admin:routing_ruleset_tests", args=[draft.pk]))
    assert "1 of 1 failing" in tests.content.decode()
    assert "status is excluded, expected assigned" in tests.content.decode()
    assert (
        "All 1 passing"
        in client_revops.get(
            reverse("admin:routing_ruleset_tests", args=[live.pk])
        ).content.decode()
    )
    url = reverse("admin:routing_ruleset_publish", args=[draft.pk])
    refused = client_revops.post(url, {"note": "pause routing"})
    assert refused.status_code == 200
    assert "Tick the box to publish anyway" in refused.content.decode()
    draft.refresh_from_db()
    assert draft.status == RuleSetStatus.DRAFT
    done = client_revops.post(url, {"note": "pause routing", "confirm_failing": "on"})
    assert done.status_code == 302
    draft.refresh_from_db()
    live.refresh_from_db()
    assert (draft.status, draft.published_by, live.status) == (
        RuleSetStatus.PUBLISHED,
        revops,
        RuleSetStatus.ARCHIVED,
    )
    assert "pause routing" in draft.note


def test_the_version_list_shows_the_note_given_at_publish(client_revops, live):
    draft = ruleset_new_draft(ruleset=live)  # its note: "Copy of version 1"
    client_revops.post(
        reverse("admin:routing_ruleset_publish", args=[draft.pk]),
        {"note": "DACH companies go to Enterprise AE"},
    )
    page = client_revops.get(reverse("admin:routing_ruleset_changelist")).content.decode()
    assert "DACH companies go to Enterprise AE" in page


def test_roll_back_republishes_an_old_version_as_a_new_one(client_revops, live):
    draft = ruleset_new_draft(ruleset=live)
    Rule.objects.filter(ruleset=draft).update(name="Renamed")
    client_revops.post(reverse("admin:routing_ruleset_publish", args=[draft.pk]), {})
    response = client_revops.post(
        reverse("admin:routing_ruleset_rollback", args=[live.pk]), {"note": "bad Friday"}
    )
    assert response.status_code == 302
    current = RuleSet.objects.get(status=RuleSetStatus.PUBLISHED)
    assert current.version > draft.version
    assert _rules(current) == [("Germany", 10)]
    assert current.note == f"Rollback to version {live.version}: bad Friday"


def test_new_draft_from_the_published_version(client_revops, live):
    response = client_revops.post(reverse("admin:routing_ruleset_new_draft"))
    draft = RuleSet.objects.get(status=RuleSetStatus.DRAFT)
    assert response["Location"] == reverse("admin:routing_ruleset_change", args=[draft.pk])
    assert _rules(draft) == _rules(live)


def test_next_up_follows_the_rotation_and_skips_the_unavailable(live, emea):
    ana, ben = Rep.objects.get(email="ana@x.example"), Rep.objects.get(email="ben@x.example")
    assert team_next_up(team=emea).rep == "Ana <ana@x.example>"
    # The turn moves as route_lead moves it (a team's save() never writes it).
    Team.objects.filter(pk=emea.pk).update(rotation_state={"last_rep_id": ana.pk})
    emea.refresh_from_db()
    assert team_next_up(team=emea).rep == "Ben <ben@x.example>"
    ben.out_of_office_until = timezone.now() + timezone.timedelta(days=1)
    ben.save()
    nxt = team_next_up(team=emea)
    assert nxt.rep == "Ana <ana@x.example>"
    assert nxt.skipped
    assert "Ben" in nxt.skipped[0]


def test_team_members_reorder_by_position_numbers(client_revops, emea):
    ana_m, ben_m = TeamMembership.objects.filter(team=emea).order_by("position")
    url = reverse("admin:routing_team_change", args=[emea.pk])
    data = {
        "name": emea.name,
        "strategy": emea.strategy,
        "sla_minutes": "60",
        "memberships-TOTAL_FORMS": "2",
        "memberships-INITIAL_FORMS": "2",
        "memberships-0-id": ana_m.pk,
        "memberships-0-team": emea.pk,
        "memberships-0-rep": ana_m.rep_id,
        "memberships-0-position": "5",
        "memberships-0-weight": "1",
        "memberships-1-id": ben_m.pk,
        "memberships-1-team": emea.pk,
        "memberships-1-rep": ben_m.rep_id,
        "memberships-1-position": "0",
        "memberships-1-weight": "2",
        "_save": "Save",
    }
    response = client_revops.post(url, data)
    assert response.status_code == 302, response.context["errors"] if response.context else ""
    assert list(
        TeamMembership.objects.filter(team=emea)
        .order_by("position")
        .values_list("rep__name", "position", "weight")
    ) == [("Ben", 0, 2), ("Ana", 1, 1)]
    assert "Next up" in client_revops.get(url).content.decode()


def test_team_weights_adding_up_past_the_cap_are_refused_in_the_form(client_revops, emea):
    ana_m, ben_m = TeamMembership.objects.filter(team=emea).order_by("position")
    url = reverse("admin:routing_team_change", args=[emea.pk])
    data = {
        "name": emea.name,
        "strategy": "weighted",
        "sla_minutes": "60",
        "memberships-TOTAL_FORMS": "2",
        "memberships-INITIAL_FORMS": "2",
        "memberships-0-id": ana_m.pk,
        "memberships-0-team": emea.pk,
        "memberships-0-rep": ana_m.rep_id,
        "memberships-0-position": "0",
        "memberships-0-weight": "600",
        "memberships-1-id": ben_m.pk,
        "memberships-1-team": emea.pk,
        "memberships-1-rep": ben_m.rep_id,
        "memberships-1-position": "1",
        "memberships-1-weight": "600",
        "_save": "Save",
    }
    response = client_revops.post(url, data)
    assert response.status_code == 200
    assert "The weights add up to 1200" in response.content.decode()
    assert set(TeamMembership.objects.filter(team=emea).values_list("weight", flat=True)) != {600}


def test_reps_bulk_out_of_office_and_deactivate(client_revops, emea):
    reps = list(Rep.objects.order_by("email"))
    url = reverse("admin:routing_rep_changelist")
    ids = [str(rep.pk) for rep in reps]
    form = client_revops.post(url, {"action": "set_out_of_office", "_selected_action": ids})
    assert "Out of office until when" in form.content.decode()
    client_revops.post(
        url,
        {
            "action": "set_out_of_office",
            "_selected_action": ids,
            "apply": "1",
            "until": "2031-01-02 09:00",
        },
    )
    assert all(rep.out_of_office_until.year == 2031 for rep in Rep.objects.all())
    client_revops.post(url, {"action": "deactivate", "_selected_action": ids[:1]})
    assert list(Rep.objects.order_by("email").values_list("active", flat=True)) == [False, True]


def test_only_an_archived_version_can_be_rolled_back_to(client_revops, live, emea):
    """A draft is published with Publish…, which runs the saved test cases and asks to confirm
    failures; a roll back to it would skip that."""
    draft = ruleset_new_draft(ruleset=live)
    RoutingTestCase.objects.create(
        name="German lead goes to EMEA",
        lead={"email": "x@y.example", "country": "FR"},
        expected_status=ExpectedStatus.ASSIGNED,
        expected_team=emea,
    )  # fails against every version: it must not be published without a confirmation
    response = client_revops.post(
        reverse("admin:routing_ruleset_rollback", args=[draft.pk]), {"note": "sneaky"}
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:routing_ruleset_change", args=[draft.pk])
    assert RuleSet.objects.get(status=RuleSetStatus.PUBLISHED) == live
    assert RuleSet.objects.count() == 2
    with pytest.raises(ValidationError, match="only an archived version"):
        ruleset_rollback(ruleset=draft)
    with pytest.raises(ValidationError, match="only an archived version"):
        ruleset_rollback(ruleset=live)


def test_a_stale_admin_save_of_a_draft_does_not_undo_a_publish(client_revops, revops, live):
    """The draft's page was opened, then someone published the draft: saving the page's note
    must neither write status "draft" back (leaving nothing published) nor fail with a 500."""
    from django.contrib import admin
    from django.test import RequestFactory

    from routing.models import VersionReadOnly
    from routing.versions import ruleset_publish_checked

    draft = ruleset_new_draft(ruleset=live)
    stale = RuleSet.objects.get(pk=draft.pk)
    ruleset_publish_checked(ruleset=draft)
    stale.note = "typo fixed"
    request = RequestFactory().post("/")
    request.user = revops
    with pytest.raises(VersionReadOnly):
        admin.site._registry[RuleSet].save_model(request, stale, None, change=True)
    draft.refresh_from_db()
    assert (draft.status, draft.note) == (
        RuleSetStatus.PUBLISHED,
        f"Copy of version {live.version}",
    )


def test_a_version_published_between_check_and_save_is_a_message(client_revops, live, monkeypatch):
    from routing.admin import RuleSetAdmin
    from routing.versions import ruleset_publish_checked

    draft = ruleset_new_draft(ruleset=live)
    url = reverse("admin:routing_ruleset_change", args=[draft.pk])
    save_model = RuleSetAdmin.save_model

    def published_meanwhile(self, request, obj, form, change):  # after the form's checks
        ruleset_publish_checked(ruleset=RuleSet.objects.get(pk=obj.pk))
        save_model(self, request, obj, form, change)

    monkeypatch.setattr(RuleSetAdmin, "save_model", published_meanwhile)
    data = {"name": "Renamed", "note": "x"}
    for formset in client_revops.get(url).context["inline_admin_formsets"]:
        management = formset.formset.management_form
        data.update({management.add_prefix(k): v for k, v in management.initial.items()})
        for form in formset.formset.forms:
            data[form.add_prefix("id")] = form.instance.pk
            data[form.add_prefix("ruleset")] = draft.pk
    response = client_revops.post(url, data, follow=True)
    assert response.status_code == 200
    assert "only drafts can change" in response.content.decode()
    draft.refresh_from_db()
    assert draft.name == live.name  # (the publish, in the same test transaction, rolled back)
