"""A changed lead of a draft's replay in words: the draft's row changes its two decisions went
through ("because Territory "Bavaria": …"), else the draft's own reason. No database."""

from __future__ import annotations

from leads.models import Lead
from routing.drafts.checks import decision_change_words
from routing.drafts.diff import RowChange
from routing.versions import Outcome

ANA = Outcome(
    status="assigned",
    rep="ana@example.com",
    rep_name="Ana",
    team="EMEA SDR",
    rule="By territory",
    reason="By territory: territory Bavaria (country DE) → team EMEA SDR",
)
BO = Outcome(
    status="assigned",
    rep="bo@example.com",
    rep_name="Bo",
    team="AE",
    rule="By territory",
    reason="By territory: territory Bavaria (country DE) → team AE",
)


def _change(section: str, key: str, words: str) -> RowChange:
    return RowChange(section=section, key=key, change="changed", fields=(), words=words)


def test_the_row_changes_the_decisions_name_are_the_because() -> None:
    lead = Lead(email="max@firma.de", email_domain="firma.de")
    changes = [
        _change("territories", "Bavaria", 'Territory "Bavaria": team EMEA SDR → AE'),
        _change("territories", "Israel", 'Territory "Israel": countries IL → IL, PS'),
        _change("value_lists", "ria", 'Value list "ria": values a → b'),  # not "Bavaria"
        _change("accounts", "firma.de", 'Account "firma.de": tier B → A'),
        _change("accounts", "other.de", 'Account "other.de": tier B → A'),
        _change("test_cases", "Bavaria", 'Test case "Bavaria" added'),
    ]
    assert decision_change_words(lead=lead, before=ANA, after=BO, changes=changes) == (
        'lead max@firma.de: Ana → Bo because Territory "Bavaria": team EMEA SDR → AE; '
        'Account "firma.de": tier B → A'
    )


def test_without_a_named_row_the_drafts_reason_is_said() -> None:
    lead = Lead(email="max@firma.de")
    excluded = Outcome(status="excluded", reason="Exclude competitors: excluded: competitor")
    assert decision_change_words(lead=lead, before=ANA, after=excluded, changes=[]) == (
        "lead max@firma.de: Ana → excluded because with the draft: "
        "Exclude competitors: excluded: competitor"
    )
