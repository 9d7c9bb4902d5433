"""A CSV imported into a draft names owners (teams, reps) as the draft has them, not as the live
tables do: a team or rep the draft adds may own rows, one the draft removes may not, and the
refusal is row-precise with nothing written."""

from __future__ import annotations

from typing import Any

import pytest

from routing.decisions import clear_live_config_cache
from routing.drafts.models import ConfigDraft
from routing.drafts.services import (
    config_draft_create,
    config_draft_import_table,
    config_draft_patch,
    config_draft_publish,
)
from routing.models import Account, Territory
from routing.rules_io import rules_import
from routing.tables_io import TableErrors
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db

TERRITORIES = "territory,country,region,postal_prefix,team,rep\n"
ACCOUNTS = "domain,name,owner_email,tier\n"


@pytest.fixture
def draft() -> Any:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    yield config_draft_create(actor="user:rita")
    clear_live_config_cache()


def _with_cai_and_dach(draft: ConfigDraft) -> None:
    config_draft_patch(
        draft_id=draft.pk,
        changes={
            "reps": {"Cai@Example.com": {"name": "Cai", "timezone": "Europe/Berlin"}},
            "teams": {
                "DACH AE": {"strategy": "round_robin", "members": [{"rep": "Cai@Example.com"}]}
            },
        },
        actor="user:rita",
    )


def test_a_team_and_a_rep_added_in_the_draft_may_own_csv_rows(draft: ConfigDraft) -> None:
    _with_cai_and_dach(draft)
    config_draft_import_table(
        draft_id=draft.pk,
        table="territories",
        content=TERRITORIES + "Bavaria,DE,BY,,DACH AE,\nAustria,AT,,,,cai@example.com\n",
        delete_missing=False,
        actor="user:rita",
    )
    config_draft_import_table(
        draft_id=draft.pk,
        table="accounts",
        content=ACCOUNTS + "acme.com,Acme,CAI@example.com,A\n",
        delete_missing=False,
        actor="user:rita",
    )
    draft.refresh_from_db()
    territories = {row["name"]: row for row in draft.document["territories"]}
    assert territories["Bavaria"]["team"] == "DACH AE"
    assert territories["Austria"]["rep"] == "Cai@Example.com"  # the draft's own spelling
    assert draft.document["accounts"] == [
        {"domain": "acme.com", "name": "Acme", "owner": "Cai@Example.com", "tier": "A"}
    ]
    config_draft_publish(draft_id=draft.pk, actor="user:rita")
    assert Territory.objects.get(name="Bavaria").team.name == "DACH AE"
    assert Account.objects.get(domain="acme.com").owner.email == "Cai@Example.com"


def test_a_team_or_rep_the_draft_removes_is_refused_row_by_row(draft: ConfigDraft) -> None:
    config_draft_patch(
        draft_id=draft.pk,
        changes={
            "teams": {
                "EMEA SDR": None,
                "Ana's": {"strategy": "round_robin", "members": [{"rep": "ana@example.com"}]},
            },
            "reps": {"ben@example.com": None},
            "rules": {"Everyone": {"priority": 20, "action": {"type": "team", "team": "Ana's"}}},
        },
        actor="user:rita",
    )
    draft.refresh_from_db()
    before = draft.document
    with pytest.raises(TableErrors) as caught:
        config_draft_import_table(
            draft_id=draft.pk,
            table="territories",
            content=TERRITORIES + "Bavaria,DE,BY,,EMEA SDR,\nAustria,AT,,,,ben@example.com\n",
            delete_missing=False,
            actor="user:rita",
        )
    assert list(caught.value.errors) == [
        'row 2, column team: no team named "EMEA SDR" in the draft',
        "row 3, column rep: no rep with e-mail ben@example.com in the draft",
    ]
    with pytest.raises(TableErrors) as caught:
        config_draft_import_table(
            draft_id=draft.pk,
            table="accounts",
            content=ACCOUNTS + "acme.com,Acme,,\nrival.io,Rival,ben@example.com,\n",
            delete_missing=False,
            actor="user:rita",
        )
    assert list(caught.value.errors) == [
        "row 3, column owner_email: no rep with e-mail ben@example.com in the draft"
    ]
    draft.refresh_from_db()
    assert draft.document == before
