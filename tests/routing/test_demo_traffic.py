"""simulate_traffic: demo leads are realistic enough for the intake and routing to treat each kind
as intended, and the HTTP driver reports what happened."""

from __future__ import annotations

import io
import json
from collections import Counter
from itertools import islice
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from leads.models import Lead, LeadStatus
from routing.demo import company
from routing.demo.traffic import (
    FINAL,
    KIND_SHARES,
    LeadMaker,
    summary_lines,
    traffic_outcomes,
    traffic_post,
)
from routing.services import lead_process


def test_lead_maker_is_repeatable_and_mixes_the_kinds() -> None:
    first = list(islice(LeadMaker(seed=3), 3000))
    assert first == list(islice(LeadMaker(seed=3), 3000))
    assert first != list(islice(LeadMaker(seed=4), 3000))
    kinds = Counter(lead.kind for lead in first)
    for kind, share in KIND_SHARES:
        assert abs(kinds[kind] / 3000 - share) < 0.025, (kind, kinds[kind])
    sources = Counter(lead.source for lead in first)
    assert 0.2 < sources[company.WEBINAR_SOURCE] / 3000 < 0.4
    # Each source speaks its own tool's field names, which its field map undoes.
    for lead in first[:200]:
        names = company.WEBINAR_FIELD_MAP if lead.source == "webinar" else company.FORM_FIELD_MAP
        assert set(lead.payload) <= set(names) | {"title"}, lead.payload


@pytest.mark.django_db
def test_each_kind_of_demo_lead_is_routed_as_intended(settings, tmp_path) -> None:
    settings.VAR_DIR = tmp_path
    call_command("seed_demo", stdout=io.StringIO())
    tokens = json.loads((tmp_path / "demo.json").read_text())["source_tokens"]
    client = APIClient()
    made = list(islice(LeadMaker(seed=11), 250))
    ids: dict[int, str] = {}
    for i, lead in enumerate(made):
        response = client.post(
            f"/api/v1/intake/{lead.source}/",
            lead.payload,
            format="json",
            HTTP_AUTHORIZATION=f"Bearer {tokens[lead.source]}",
        )
        if lead.kind == "rejected":
            assert response.status_code == 422, response.content
            assert response.json()["error"]["code"] == "not_a_lead"
        else:
            assert response.status_code == 202, (lead, response.content)
            ids[i] = response.json()["id"]
    for lead_id in ids.values():
        lead_process(lead_id=lead_id)
    leads = {str(k): v for k, v in Lead.objects.in_bulk(list(ids.values())).items()}
    by_kind: dict[str, Counter[str]] = {}
    for i, lead_id in ids.items():
        by_kind.setdefault(made[i].kind, Counter())[leads[lead_id].status] += 1
    assert set(by_kind["competitor"]) == {LeadStatus.EXCLUDED}
    assert set(by_kind["junk"]) == {LeadStatus.EXCLUDED}
    assert set(by_kind["duplicate"]) <= {LeadStatus.DUPLICATE, LeadStatus.EXCLUDED}
    assert by_kind["duplicate"][LeadStatus.DUPLICATE] > 0
    assert by_kind["new"][LeadStatus.ASSIGNED] > 100
    assert LeadStatus.UNASSIGNED not in by_kind["new"]
    owner_of = {domain: company.rep_email(owner) for domain, _, owner, _ in company.ACCOUNTS}
    named = [leads[ids[i]] for i in ids if made[i].kind == "named_account"]
    assert len(named) > 10
    for row in named:
        assert row.assignments.get(active=True).rep.email == owner_of[row.email_domain]


@pytest.mark.slow
def test_simulated_traffic_over_http_is_summarised(
    live_server: Any, transactional_db: Any, settings: Any, tmp_path: Any
) -> None:
    settings.VAR_DIR = tmp_path
    call_command("seed_demo", stdout=io.StringIO())
    state = json.loads((tmp_path / "demo.json").read_text())
    made = list(islice(LeadMaker(seed=5), 60))
    out = io.StringIO()
    posted = traffic_post(
        base_url=live_server.url,
        tokens=state["source_tokens"],
        leads=made,
        rate=None,
        concurrency=4,
        out=out,
    )
    rejected = sum(lead.kind == "rejected" for lead in made)
    assert len(posted.accepted) == 60 - rejected
    assert "60/60" in out.getvalue()
    # Stand in for the worker, then read the outcome back over the lead API.
    for sent in posted.accepted:
        assert sent.lead_id
        lead_process(lead_id=sent.lead_id)
    outcomes = traffic_outcomes(
        base_url=live_server.url,
        api_token=state["api_token"],
        lead_ids=[s.lead_id for s in posted.accepted if s.lead_id],
        wait_seconds=5,
        out=out,
    )
    assert len(outcomes) == len(posted.accepted)
    assert {o.status for o in outcomes.values()} <= FINAL
    statuses = Counter(o.status for o in outcomes.values())
    lines = summary_lines(posted, outcomes)
    text = "\n".join(lines)
    assert f"accepted {len(posted.accepted)}" in text
    assert f"excluded {statuses['excluded']}," in text
    assert "still waiting 0" in text
    assert "accept to assigned: p50" in text
    per_team = Counter(o.team for o in outcomes.values() if o.team)
    for team, n in per_team.items():
        assert f"{team} {n}" in text
    # Every lead with an owner is counted once: in its team, or as going straight to a rep.
    owned = [o for o in outcomes.values() if o.rep]
    to_rep = sum(1 for o in owned if not o.team)
    assert sum(per_team.values()) + to_rep == len(owned)
    assert (f"straight to a named rep {to_rep}" in text) == (to_rep > 0)


@pytest.mark.django_db
def test_simulate_traffic_without_a_seeded_demo_says_what_to_do(settings, tmp_path) -> None:
    settings.VAR_DIR = tmp_path
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="seed_demo"):
        call_command("simulate_traffic", "--spike", "5")


@pytest.mark.django_db
def test_simulate_traffic_with_nothing_listening_fails_clearly(settings, tmp_path) -> None:
    settings.VAR_DIR = tmp_path
    call_command("seed_demo", stdout=io.StringIO())
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="Could not reach"):
        call_command(
            "simulate_traffic",
            "--spike",
            "3",
            "--url",
            "http://127.0.0.1:9",
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )


def test_the_first_steps_hints_name_the_pages_and_logins(tmp_path) -> None:
    from routing.demo.hints import _logins, hints_text

    (tmp_path / "demo-login.txt").write_text(
        "admin / a1  - administrator\nrevops / r2  - RevOps\nmanager / m3  - sales manager\n"
    )
    text = hints_text("http://127.0.0.1:8000", _logins(tmp_path))
    assert "http://127.0.0.1:8000/dashboard/  (login manager / m3)" in text
    assert "make spike     (or:" in text
    assert "/admin/routing/ruleset/simulate/  (login revops / r2)" in text
    assert "make spike PORT=8001 " in hints_text("http://127.0.0.1:8001", {})
    assert "login" not in hints_text("http://h:1", _logins(tmp_path / "missing"))
