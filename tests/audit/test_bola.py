"""BOLA and BFLA (reliability guide, test plan row 18).

1. Manager A, scoped to team A (``HISTORY_SCOPE_TO_MANAGED_TEAMS``), enumerates 1,000 ids (250 in
   CI): every lead and assignment id of team B (among them a lead that team A owned before it
   was reassigned to B) and ids around them, on every URL a manager reaches with an id: the lead's
   page, its reassign and touch actions, the lead API and its touch/reassign/reroute, and the
   admin's lead, event and assignment pages. Every answer is 403 or 404 (or the admin's login
   redirect), and no body holds any of B's data. The URLs that take filters (history, the CSV
   export, the lead list) with B's team, rep, rule and e-mails answer only A's rows.
2. Staff users outside RevOps open the rule admin (ruleset and rule add/change/delete, publish,
   replay, rollback, new draft, move, simulate): 403 or the login redirect, and nothing changed.
"""

from __future__ import annotations

import csv
import io
import json
import time
import uuid
from collections import Counter
from typing import Any
from urllib.parse import quote, quote_plus

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from audit.models import Event
from audit.permissions import sales_managers_group_sync
from leads.models import Lead, LeadStatus
from routing.models import (
    AdminJob,
    Assignment,
    AssignmentKind,
    Rep,
    Rule,
    RuleSet,
    RuleSetStatus,
    Team,
    TeamMembership,
)
from routing.versions import ruleset_new_draft
from tests.leads.factories import LeadFactory, SourceFactory
from tests.reliability.harness import scaled
from tests.routing.factories import (
    AssignmentFactory,
    RepFactory,
    TeamFactory,
    publish_as_is,
    published_ruleset,
)

pytestmark = [pytest.mark.django_db, pytest.mark.reliability]

# The guide's 1,000 ids under `make reliability` (RELIABILITY_SCALE=10); 250 in `make test` and CI
# (B's real ids first, then their neighbours).
IDS = min(1_000, scaled(250, least=250))
B_LEADS = 30
OK = {403, 404}


def _user(name: str, *, staff: bool = False, group: bool = True) -> User:
    user = User.objects.create_user(name, password=f"pw-{name}-123", is_staff=staff)
    if group:
        user.groups.add(sales_managers_group_sync())
    return user


def _owned(rep: Rep, team: Team, n: int, prefix: str, source: Any) -> Lead:
    lead = LeadFactory(
        status=LeadStatus.ASSIGNED,
        source=source,
        email=f"{prefix}{n}@{prefix}-corp.example",
        company=f"{prefix.title()}Corp {n}",
        first_name=f"{prefix.title()}first{n}",
        last_name=f"{prefix.title()}last{n}",
        raw_payload={
            "email": f"{prefix}{n}@{prefix}-corp.example",
            "note": f"{prefix}-payload-{n}",
        },
    )
    AssignmentFactory(
        lead=lead,
        rep=rep,
        rep_name=rep.name,
        team=team,
        team_name=team.name,
        rule_name=f"{prefix} rule",
    )
    return lead


class World:
    """Team A (managed by ``manager``) and team B, each with a rep and leads."""

    def __init__(self, *, staff: bool) -> None:
        self.manager = _user("mia", staff=staff)
        self.manager_b = _user("bob")
        self.team_a = TeamFactory(name="Alpha Team", manager=self.manager)
        self.team_b = TeamFactory(name="Bravo Team", manager=self.manager_b)
        self.rep_a = RepFactory(name="Alpha Rep", email="alpha.rep@alpha-corp.example")
        self.rep_b = RepFactory(name="Bravissimo Rep", email="bravo.rep@bravo-corp.example")
        TeamMembership.objects.create(team=self.team_a, rep=self.rep_a, position=0)
        TeamMembership.objects.create(team=self.team_b, rep=self.rep_b, position=0)
        source = SourceFactory(slug="web")
        self.leads_a = [_owned(self.rep_a, self.team_a, n, "alpha", source) for n in range(5)]
        self.leads_b = [_owned(self.rep_b, self.team_b, n, "bravo", source) for n in range(B_LEADS)]
        # Team A owned this one, then it was reassigned to team B: A no longer owns it.
        moved = self.leads_b[0]
        first = Assignment.objects.get(lead=moved)
        Assignment.objects.filter(pk=first.pk).update(
            team=self.team_a, team_name=self.team_a.name, rep=self.rep_a, rep_name="Alpha Rep"
        )
        first.refresh_from_db()
        Assignment.objects.filter(pk=first.pk).update(active=False)
        Assignment.objects.create(
            lead=moved,
            rep=self.rep_b,
            rep_name=self.rep_b.name,
            team=self.team_b,
            team_name=self.team_b.name,
            rule_name="bravo rule",
            kind=AssignmentKind.REASSIGNMENT,
            supersedes=first,
            reason="bravo-reassign-reason",
        )
        self.assignments_b = list(
            Assignment.objects.filter(lead__in=self.leads_b).values_list("pk", flat=True)
        )

    def b_markers(self) -> list[str]:
        """Strings only B's data holds: any of them in a response is a leak."""
        found = ["bravo-corp.example", "BravoCorp", "Bravofirst", "Bravolast", "bravo-payload"]
        found += ["Bravissimo", "Bravo Team", "bravo-reassign-reason"]
        found += [str(lead.pk) for lead in self.leads_b]
        return found

    def a_ids(self) -> set[str]:
        return {str(lead.pk) for lead in self.leads_a}


def enumerated_ids(world: World) -> list[str]:
    """IDS ids: every real id of B's leads and assignments, then ids around them."""
    ids = [str(lead.pk) for lead in world.leads_b] + [str(pk) for pk in world.assignments_b]
    for lead in world.leads_b:  # a neighbour of each real id: its last hex digit changed
        text = str(lead.pk)
        for digit in "0123456789abcdef"[:8]:
            if text[-1] != digit:
                ids.append(text[:-1] + digit)
    top = max(world.assignments_b)
    ids += [str(pk) for pk in range(1, top + 40)]  # every assignment/lead pk near B's
    ids += [str(uuid.UUID(int=n)) for n in range(50)]  # low uuids
    own = world.a_ids()
    ids = [i for i in dict.fromkeys(ids) if i not in own][:IDS]
    while len(ids) < IDS:
        ids.append(str(uuid.uuid4()))
    assert len(set(ids)) == len(ids) == IDS
    return ids


def leaked(body: bytes, markers: list[str], echoed: dict[str, Any] | None = None) -> list[str]:
    """The markers found in ``body``; the filter values a page echoes in its form are not data."""
    text = body.decode("utf-8", "replace")
    for value in (echoed or {}).values():
        for form in (str(value), quote_plus(str(value)), quote(str(value))):
            text = text.replace(form, "")
    return [m for m in markers if m in text]


def _content(response: Any) -> bytes:
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content)
    return bytes(response.content)


@pytest.fixture
def scoped(settings: Any) -> None:
    settings.HISTORY_SCOPE_TO_MANAGED_TEAMS = True


@pytest.mark.slow  # ~2,500 requests through the test client: 20-60 s on the 2-core box
@pytest.mark.usefixtures("scoped")
@pytest.mark.parametrize("staff", [False, True], ids=["manager", "staff-manager"])
def test_manager_a_enumerating_team_b_ids_gets_403_or_404_and_no_rows(staff: bool) -> None:
    world = World(staff=staff)
    markers = world.b_markers()
    client = Client()
    client.force_login(world.manager)
    real_b = {str(lead.pk) for lead in world.leads_b} | {str(pk) for pk in world.assignments_b}
    # A staff manager reaches every URL a manager can (the admin too): they enumerate all the
    # ids; the manager who is not staff, B's real ids and 50 others.
    ids = enumerated_ids(world) if staff else [*real_b, *enumerated_ids(world)[-50:]]
    before_assignments = list(Assignment.objects.order_by("pk").values())
    before_events = Event.objects.count()

    started = time.monotonic()
    codes: Counter[int] = Counter()
    problems: list[str] = []

    def check(
        method: str, url: str, *, allowed: set[int] = OK, echoed: str = "", **data: Any
    ) -> None:
        response = getattr(client, method)(url, **data)
        codes[response.status_code] += 1
        # The admin sends a user who is not staff to its login page, and a staff user asking for
        # an object it cannot find to its index ("... with ID ... doesn't exist").
        location = response.get("Location", "")
        redirect = response.status_code == 302 and ("/login/" in location or location == "/admin/")
        if response.status_code not in allowed and not redirect:
            problems.append(f"{method.upper()} {url}: {response.status_code}")
        found = leaked(_content(response), markers, {"echoed": echoed} if echoed else None)
        if found:
            problems.append(f"{method.upper()} {url}: leaked {found[:3]}")

    admin_urls = [
        ("get", "/admin/leads/lead/{}/change/"),
        ("get", "/admin/leads/lead/{}/history/"),
        ("get", "/admin/audit/event/?lead__id__exact={}"),
        ("get", "/admin/leads/lead/?q={}"),
    ]
    for lead_id in ids:
        check("get", f"/history/{lead_id}/")
        check("get", f"/api/v1/leads/{lead_id}/")
        if lead_id not in real_b:
            continue
        # The actions, and the admin's pages, on every real id of B's.
        check("post", f"/history/{lead_id}/reassign/", data={"rep": world.rep_a.pk, "reason": "x"})
        check("post", f"/history/{lead_id}/touch/")
        check("post", f"/api/v1/leads/{lead_id}/touch/")
        check(
            "post",
            f"/api/v1/leads/{lead_id}/reassign/",
            data=json.dumps({"rep": world.rep_a.email, "reason": "mine"}),
            content_type="application/json",
        )
        check("post", f"/api/v1/leads/{lead_id}/reroute/")
        for method, pattern in admin_urls:
            # Not staff: the login redirect. Staff: 403, or "not found" (the redirect to the index).
            if "?" in pattern:  # a search or filter: the list, without B's rows
                check(method, pattern.format(lead_id), allowed=OK | {200}, echoed=lead_id)
            else:
                check(method, pattern.format(lead_id))

    # Filters: B's team, rep, rule and data as filters answer only A's own rows (a filter value
    # outside the manager's scope is left out, as a wrong one is: docs/managers.md).
    filters = [
        {"team": world.team_b.pk},
        {"rep": world.rep_b.pk},
        {"rule": "bravo rule"},
        {"q": "bravo"},
        {"q": world.leads_b[3].email},
        {"q": "BravoCorp 7"},
        {"status": "assigned", "source": "web"},
    ]
    own = world.a_ids()
    for params in filters:
        page = client.get("/history/", params)
        assert page.status_code == 200
        assert not leaked(page.content, markers, params), (params, page.content)
        assert {row.id for row in page.context["rows"]} <= own, params
        export = client.get("/history/export.csv", params)
        assert export.status_code == 200
        body = _content(export)
        assert not leaked(body, markers), (params, body)
        rows = list(csv.reader(io.StringIO(body.decode())))
        assert {row[0] for row in rows[1:]} <= own, params
    for params in (
        {"rep": world.rep_b.email},
        {"q": "bravo"},
        {"source": "web"},
        {"status": "assigned"},
    ):
        listed = client.get("/api/v1/leads/", params)
        assert listed.status_code in (200, 400), params
        assert not leaked(listed.content, markers, params), (params, listed.content)
        if listed.status_code == 200:
            assert {row["id"] for row in listed.json()["results"]} <= own, params
    dashboard = client.get("/dashboard/")
    assert dashboard.status_code == 200
    assert not leaked(dashboard.content, markers), leaked(dashboard.content, markers)

    print(
        f"[bola figures] staff={staff} ids={len(ids)} requests={sum(codes.values())} "
        f"statuses={dict(codes)} problems={len(problems)} took_s={time.monotonic() - started:.1f}"
    )
    assert problems == [], problems[:20]
    assert sum(codes.values()) >= 2 * len(ids) + 9 * B_LEADS
    # Nothing changed: no assignment, no event (a refused reassign or touch writes nothing).
    assert list(Assignment.objects.order_by("pk").values()) == before_assignments
    assert Event.objects.count() == before_events


# --- 2. The rule admin, for staff outside RevOps -------------------------------------------------


@pytest.fixture
def versions(db: Any) -> dict[str, Any]:
    rep = RepFactory(name="Ana", email="ana@x.example")
    team = TeamFactory(name="EMEA SDR")
    TeamMembership.objects.create(team=team, rep=rep, position=0)
    first = published_ruleset(
        {
            "name": "Germany",
            "when": {"field": "country", "op": "eq", "value": "DE"},
            "action": {"type": "team", "team": "EMEA SDR"},
        },
    )
    live = ruleset_new_draft(ruleset=first)
    RuleSet.objects.filter(pk=first.pk).update(status=RuleSetStatus.ARCHIVED)
    publish_as_is(live)
    draft = ruleset_new_draft(ruleset=live)
    return {
        "archived": first,
        "live": live,
        "draft": draft,
        "rule": Rule.objects.get(ruleset=draft),
        "team": team,
    }


def _state() -> dict[str, Any]:
    return {
        "rulesets": list(RuleSet.objects.order_by("pk").values()),
        "rules": list(Rule.objects.order_by("pk").values()),
        "jobs": AdminJob.objects.count(),
        "events": Event.objects.count(),
        "log": LogEntry.objects.count(),
    }


def _rule_post(v: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {
        "ruleset": v["draft"].pk,
        "name": "Sneaky",
        "priority": "5",
        "when": "",
        "action": "",
        "action_type": "team",
        "action_team": "EMEA SDR",
        "on_sla_breach": "notify",
        "active": "on",
        "_save": "Save",
        **changes,
    }


def _admin_requests(v: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    draft, live, archived, rule = v["draft"], v["live"], v["archived"], v["rule"]
    ruleset_form = {
        "name": "Renamed",
        "note": "x",
        "rules-TOTAL_FORMS": "0",
        "rules-INITIAL_FORMS": "0",
        "_save": "Save",
    }
    return [
        ("get", reverse("admin:routing_ruleset_changelist"), {}),
        ("get", reverse("admin:routing_rule_changelist"), {}),
        ("get", reverse("admin:routing_ruleset_add"), {}),
        ("post", reverse("admin:routing_ruleset_add"), ruleset_form),
        ("get", reverse("admin:routing_ruleset_change", args=[draft.pk]), {}),
        ("post", reverse("admin:routing_ruleset_change", args=[draft.pk]), ruleset_form),
        ("get", reverse("admin:routing_ruleset_delete", args=[draft.pk]), {}),
        ("post", reverse("admin:routing_ruleset_delete", args=[draft.pk]), {"post": "yes"}),
        (
            "post",
            reverse("admin:routing_ruleset_changelist"),
            {"action": "publish", "_selected_action": [draft.pk]},
        ),
        ("get", reverse("admin:routing_ruleset_publish", args=[draft.pk]), {}),
        (
            "post",
            reverse("admin:routing_ruleset_publish", args=[draft.pk]),
            {"note": "x", "confirm_failing": "on"},
        ),
        ("get", reverse("admin:routing_ruleset_replay", args=[live.pk]), {"run": "1"}),
        ("post", reverse("admin:routing_ruleset_replay", args=[draft.pk]), {"n": "100000"}),
        ("get", reverse("admin:routing_ruleset_rollback", args=[archived.pk]), {}),
        ("post", reverse("admin:routing_ruleset_rollback", args=[archived.pk]), {"note": "x"}),
        ("post", reverse("admin:routing_ruleset_new_draft"), {}),
        ("post", reverse("admin:routing_ruleset_copy", args=[archived.pk]), {}),
        ("get", reverse("admin:routing_ruleset_tests", args=[draft.pk]), {}),
        ("get", reverse("admin:routing_ruleset_simulate"), {}),
        ("post", reverse("admin:routing_ruleset_simulate"), {"lead_json": '{"country": "DE"}'}),
        ("get", reverse("admin:routing_rule_add"), {}),
        ("post", reverse("admin:routing_rule_add"), _rule_post(v)),
        ("get", reverse("admin:routing_rule_change", args=[rule.pk]), {}),
        (
            "post",
            reverse("admin:routing_rule_change", args=[rule.pk]),
            _rule_post(v, name="Mine", priority="10"),
        ),
        ("get", reverse("admin:routing_rule_delete", args=[rule.pk]), {}),
        ("post", reverse("admin:routing_rule_delete", args=[rule.pk]), {"post": "yes"}),
        ("post", reverse("admin:routing_rule_move", args=[rule.pk, "down"]), {}),
        ("post", reverse("admin:routing_rule_move", args=[rule.pk, "up"]), {}),
    ]


def _staff_outside_revops(kind: str) -> User:
    user = User.objects.create_user(f"staff-{kind}", password="pw-x-123", is_staff=True)
    if kind == "sales-manager":
        user.groups.add(sales_managers_group_sync())
    elif kind == "other-admin":  # may edit sources and webhooks, not routing
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label="leads")
            | Permission.objects.filter(codename__endswith="webhookendpoint")
        )
    return user


@pytest.mark.parametrize("kind", ["no-permissions", "sales-manager", "other-admin"])
def test_staff_outside_revops_cannot_use_the_rule_admin(
    versions: dict[str, Any], kind: str
) -> None:
    client = Client()
    client.force_login(_staff_outside_revops(kind))
    before = _state()
    refused: list[tuple[str, str, int]] = []
    problems = []
    for method, url, data in _admin_requests(versions):
        response = getattr(client, method)(url, data)
        location = response.get("Location", "")
        if response.status_code == 403 or (response.status_code == 302 and "/login/" in location):
            refused.append((method, url, response.status_code))
        else:
            problems.append(f"{method.upper()} {url}: {response.status_code} {location}")
    assert problems == [], problems
    assert _state() == before
    print(f"[bola figures] rule admin as {kind}: {len(refused)} of {len(refused)} refused")


def test_a_view_only_user_reads_the_rule_admin_but_changes_nothing(
    versions: dict[str, Any],
) -> None:
    """Staff with the routing view permissions (no RevOps): every change is refused (403 or
    the login redirect) and nothing is written; the reading pages may answer 200."""
    user = User.objects.create_user("vera", password="pw-x-123", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="routing", codename__startswith="view_")
    )
    client = Client()
    client.force_login(user)
    before = _state()
    readable = {"get"}
    problems = []
    for method, url, data in _admin_requests(versions):
        response = getattr(client, method)(url, data)
        if method in readable or "simulate" in url:
            continue  # reading pages (and the simulate page, which writes nothing)
        if response.status_code == 403:
            continue
        if response.status_code == 302 and "/login/" in response.get("Location", ""):
            continue
        if url == reverse("admin:routing_ruleset_changelist"):  # no action offered: the list
            assert response.status_code in (200, 302), response.status_code
            continue
        problems.append(f"{method.upper()} {url}: {response.status_code}")
    assert problems == [], problems
    assert _state() == before


def test_control_revops_can_make_the_same_changes(versions: dict[str, Any]) -> None:
    """The requests above are well-formed: RevOps making them do change the rules (so "nothing
    changed" above means refused, not malformed)."""
    from routing.editor.permissions import revops_group_sync

    user = User.objects.create_user("rita", password="pw-x-123", is_staff=True)
    user.groups.add(revops_group_sync())
    client = Client()
    client.force_login(user)
    rule = versions["rule"]
    wanted = {
        reverse("admin:routing_rule_change", args=[rule.pk]),
        reverse("admin:routing_rule_add"),
        reverse("admin:routing_ruleset_new_draft"),
    }
    for method, url, data in _admin_requests(versions):
        if method == "post" and url in wanted:
            assert getattr(client, method)(url, data).status_code == 302, url
    rule.refresh_from_db()
    assert rule.name == "Mine"
    assert Rule.objects.filter(ruleset=versions["draft"], name="Sneaky").exists()
    assert RuleSet.objects.filter(status=RuleSetStatus.DRAFT).count() == 2
