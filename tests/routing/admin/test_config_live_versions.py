"""Every path that changes the routed configuration stores a numbered configuration version
(issue 19): the admin's saves of teams, memberships, reps' design, territories, value lists;
its ruleset-only publish; a CSV import; ``routing_import`` with or without ``--publish``. Each
version has a ruleset version of its own (what a lead's trace records), is audited like a
draft's publish, and can be rolled back. A rep's live state is no version."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from audit.models import Event, EventType
from leads.models import LeadStatus
from routing.configuration import configuration_import
from routing.decisions import clear_live_config_cache
from routing.drafts.models import ConfigSnapshot, ConfigSnapshotKind
from routing.drafts.services import config_rollback
from routing.models import Assignment, Rep, RuleSet, Team, TeamMembership, Territory
from routing.rules_io import rules_export
from routing.services import lead_process
from routing.tables_io import tables_import
from routing.versions import ruleset_new_draft, ruleset_publish_checked
from tests.leads.factories import LeadFactory
from tests.routing.admin.test_config_audit import _form_data

pytestmark = pytest.mark.django_db


def _versions() -> list[ConfigSnapshot]:
    return list(ConfigSnapshot.objects.order_by("number"))


def _published_events(number: int) -> list[Event]:
    return [
        event
        for event in Event.objects.filter(type=EventType.CONFIG_CHANGED)
        if event.data.get("action") == "published"
        and (event.data.get("changes") or {}).get("number", {}).get("after") == number
    ]


def _weight(team: Team, email: str) -> int:
    return TeamMembership.objects.get(team=team, rep__email=email).weight


def test_an_admin_team_save_is_a_version_that_rollback_undoes(
    client_revops: Client, live: RuleSet, emea: Team
) -> None:
    lead = LeadFactory(raw_payload={"email": "x@acme.com", "country": "DE"})  # and its source
    assert _versions() == []
    url = reverse("admin:routing_team_change", args=[emea.pk])
    data = _form_data(client_revops, url)
    weight_field = (
        next(
            key
            for key, value in data.items()
            if key.endswith("-rep") and str(value) == str(Rep.objects.get(email="ben@x.example").pk)
        ).removesuffix("-rep")
        + "-weight"
    )
    data[weight_field] = 7
    response = client_revops.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert _weight(emea, "ben@x.example") == 7
    baseline, version = _versions()
    assert (baseline.kind, version.kind) == (ConfigSnapshotKind.BASELINE, ConfigSnapshotKind.LIVE)
    assert (baseline.number, version.number) == (1, 2)
    # A ruleset version of its own: each lead's trace names the configuration that decided it.
    assert baseline.ruleset_version == live.version
    assert version.ruleset_version > live.version
    assert RuleSet.objects.get(status="published").version == version.ruleset_version
    assert version.published_by == "user:rita"
    (event,) = _published_events(2)
    assert event.data["kind"] == "live"
    assert event.data["changed"] >= 1
    assert any("EMEA SDR" in row for row in event.data["rows"])
    clear_live_config_cache()
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    assert Assignment.objects.get(lead=lead).ruleset_version == version.ruleset_version
    config_rollback(number=1, actor="t")
    assert _weight(emea, "ben@x.example") == 1


def test_a_reps_live_state_is_no_version_but_their_caps_are(
    client_revops: Client, live: RuleSet, emea: Team
) -> None:
    ana = Rep.objects.get(email="ana@x.example")
    url = reverse("admin:routing_rep_change", args=[ana.pk])
    response = client_revops.post(url, _form_data(client_revops, url, active=""))
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Rep.objects.get(pk=ana.pk).active is False
    assert [v.kind for v in _versions()] == [ConfigSnapshotKind.BASELINE]  # no new version
    response = client_revops.post(url, _form_data(client_revops, url, max_open=3))
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert [v.kind for v in _versions()] == [ConfigSnapshotKind.BASELINE, ConfigSnapshotKind.LIVE]


def test_an_admin_delete_and_an_add_are_versions(
    client_revops: Client, live: RuleSet, emea: Team
) -> None:
    territory = Territory.objects.create(name="DACH", countries=["DE"], team=emea)
    response = client_revops.post(
        reverse("admin:routing_territory_delete", args=[territory.pk]), {"post": "yes"}
    )
    assert response.status_code == 302
    assert not Territory.objects.filter(pk=territory.pk).exists()
    # The baseline holds the territory (created before any version), the next one does not.
    baseline, deleted = _versions()
    assert [t["name"] for t in baseline.document["territories"]] == ["DACH"]
    assert deleted.document["territories"] == []
    url = reverse("admin:routing_valuelist_add")
    response = client_revops.post(url, {"name": "vip", "values": '["a.io"]'})
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert len(_versions()) == 3


def test_a_ruleset_only_publish_is_a_version_with_its_own_ruleset_version(
    live: RuleSet,
) -> None:
    draft = ruleset_new_draft(ruleset=live)
    published = ruleset_publish_checked(ruleset=draft)
    _baseline, version = _versions()
    assert version.ruleset_version == published.version  # no copy: it is a new version
    assert RuleSet.objects.filter(status="published").get().pk == draft.pk


def test_a_csv_import_is_a_version(live: RuleSet, emea: Team) -> None:
    tables_import(
        table="territories",
        content="territory,country,region,postal_prefix,team,rep\nDACH,DE,,,EMEA SDR,\n",
    )
    baseline, version = _versions()
    assert [t["name"] for t in version.document["territories"]] == ["DACH"]
    assert version.ruleset_version > baseline.ruleset_version


@pytest.mark.parametrize("publish", [False, True])
def test_routing_import_is_a_version_with_or_without_publish(
    live: RuleSet, emea: Team, publish: bool
) -> None:
    document = rules_export()
    document["teams"][0]["sla_minutes"] = 15
    configuration_import(data=document, publish=publish)
    baseline, version = _versions()
    assert version.kind == ConfigSnapshotKind.IMPORT
    assert version.document["teams"][0]["sla_minutes"] == 15
    # The ruleset did not change: a new ruleset version all the same, so traces tell them apart.
    assert version.ruleset_version != baseline.ruleset_version
    configuration_import(data=document, publish=publish)  # the same again: no new version
    assert len(_versions()) == 2


def test_a_change_after_which_the_published_rules_no_longer_compile_is_refused(
    client_revops: Client, live: RuleSet, emea: Team
) -> None:
    from routing.drafts.live import LiveChangeRefused, config_live_change

    with pytest.raises(LiveChangeRefused), config_live_change(actor="t", what="a test"):
        Team.objects.filter(pk=emea.pk).update(name="Renamed")  # the rule names EMEA SDR
    assert Team.objects.get(pk=emea.pk).name == "EMEA SDR"
    assert _versions() == []  # the baseline it took first is rolled back with it


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_admin_save_while_a_publish_holds_the_lock_is_refused_with_the_reason(
    client_revops: Client, live: RuleSet, emea: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from django.db import connection, transaction

    from routing.configuration import configuration_lock
    from routing.editor import versioned

    monkeypatch.setattr(versioned, "LOCK_WAIT_SECONDS", 0.3)
    url = reverse("admin:routing_team_change", args=[emea.pk])
    data = _form_data(client_revops, url, sla_minutes=5)
    held, release = threading.Event(), threading.Event()

    def publishing() -> None:
        try:
            with transaction.atomic():
                configuration_lock()
                held.set()
                release.wait(20)
        finally:
            held.set()
            connection.close()

    thread = threading.Thread(target=publishing)
    thread.start()
    try:
        assert held.wait(20)
        response = client_revops.post(url, data, follow=True)
    finally:
        release.set()
        thread.join(30)
    assert response.status_code == 200
    shown = [str(message) for message in response.context["messages"]]
    assert any("in progress; nothing was written" in message for message in shown), shown
    assert Team.objects.get(pk=emea.pk).sla_minutes == 60
    assert _versions() == []
    response = client_revops.post(url, data)  # once it is over
    assert response.status_code == 302
    assert Team.objects.get(pk=emea.pk).sla_minutes == 5
    assert [v.kind for v in _versions()] == [ConfigSnapshotKind.BASELINE, ConfigSnapshotKind.LIVE]
