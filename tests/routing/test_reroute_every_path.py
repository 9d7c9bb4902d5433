"""Every path that makes a rep unavailable re-routes their untouched leads, or leaves them when
the team chose so (``keep_leads_when_rep_away``): the rep's form, the list's two bulk actions,
an import, the roster API (deactivate, out of office), a planned absence starting."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from routing.config_api.tokens import api_token_create
from routing.configuration import configuration_import
from routing.decisions import clear_live_config_cache
from routing.models import Assignment, Rep, Team
from routing.rules_io import rules_import
from routing.timeoff.models import RepAbsence
from routing.timeoff.services import absences_start_due
from tests.routing.factories import user_with_perms
from tests.routing.test_lead_actions import _assigned
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db

ANA = "ana@example.com"


def _form(client: Client, ana: Rep) -> None:
    url = f"/admin/routing/rep/{ana.pk}/change/"
    form = client.get(url).context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k != "user"}
    data.update(
        {
            "active": "",
            "working_hours": "",
            "absences-TOTAL_FORMS": "0",
            "absences-INITIAL_FORMS": "0",
            "absences-MIN_NUM_FORMS": "0",
            "absences-MAX_NUM_FORMS": "1000",
        }
    )
    assert client.post(url, data).status_code == 302


def _bulk_out_of_office(client: Client, ana: Rep) -> None:
    until = (timezone.now() + timedelta(days=2)).strftime("%Y-%m-%d %H:%M")
    response = client.post(
        "/admin/routing/rep/",
        {"action": "set_out_of_office", "_selected_action": [ana.pk], "apply": "1", "until": until},
    )
    assert response.status_code == 302, response.content[:2000]


def _bulk_deactivate(client: Client, ana: Rep) -> None:
    response = client.post(
        "/admin/routing/rep/", {"action": "deactivate", "_selected_action": [ana.pk]}
    )
    assert response.status_code == 302


def _import(client: Client, ana: Rep) -> None:
    reps = [{**RULES["reps"][0], "active": False}, RULES["reps"][1]]
    configuration_import(data={**RULES, "reps": reps})


def _roster(method: str, body: dict[str, Any] | None) -> Callable[[Client, Rep], None]:
    def call(client: Client, ana: Rep) -> None:
        secret = api_token_create(
            user=user_with_perms("sync", "roster"), name="hr", scopes="roster", actor="t"
        ).secret
        response = getattr(client, method)(
            f"/api/v1/config/roster/reps/{ANA}/",
            body or {},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {secret}",
        )
        assert response.status_code == 200, response.content

    return call


def _absence_starting(client: Client, ana: Rep) -> None:
    now = timezone.now()
    RepAbsence.objects.create(
        rep=ana, starts_at=now - timedelta(minutes=1), ends_at=now + timedelta(days=2)
    )
    assert absences_start_due(now=now) == 1


PATHS: dict[str, Callable[[Client, Rep], None]] = {
    "form": _form,
    "bulk_out_of_office": _bulk_out_of_office,
    "bulk_deactivate": _bulk_deactivate,
    "import": _import,
    "roster_deactivate": _roster("delete", None),
    "roster_out_of_office": _roster(
        "patch", {"out_of_office_until": (timezone.now() + timedelta(days=3)).isoformat()}
    ),
    "absence_starting": _absence_starting,
}


@pytest.mark.parametrize("keep", [False, True], ids=["reroute", "team_keeps"])
@pytest.mark.parametrize("path", list(PATHS))
def test_a_rep_made_unavailable_loses_their_untouched_leads_unless_the_team_keeps_them(
    path: str, keep: bool, admin_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    leads = [_assigned(f"p{i}@acme.com") for i in range(4)]  # ana, ben, ana, ben
    ana = Rep.objects.get(email=ANA)
    held = [a.lead_id for a in Assignment.objects.filter(rep=ana, active=True)]
    assert len(held) == 2
    touched = Assignment.objects.get(lead_id=held[1], active=True)
    Assignment.objects.filter(pk=touched.pk).update(touched_at=timezone.now())
    if keep:
        Team.objects.filter(name="EMEA SDR").update(keep_leads_when_rep_away=True)
    with django_capture_on_commit_callbacks(execute=True):
        PATHS[path](admin_client, ana)
    owners = {
        a.lead_id: a.rep.email
        for a in Assignment.objects.filter(lead__in=leads, active=True).select_related("rep")
    }
    # The untouched lead moves to Ben (or stays); the touched one always stays with Ana.
    assert owners[held[0]] == (ANA if keep else "ben@example.com"), path
    assert owners[held[1]] == ANA
    clear_live_config_cache()
