"""The Salesforce org most CRM tests start from: three users in the stand-in (Ana and Ben are
reps, "ops" is the integration user), two reps linked to them by e-mail in one team, and a
connection to the stand-in. Tests differ only in the connection's settings and their rules."""

from __future__ import annotations

from typing import Any

from routing.crm.models import CrmConnection
from routing.crm.roster import crm_roster_sync
from routing.crm.secrets import secret_seal
from tests.routing.factories import RepFactory, published_ruleset, team_with
from tests.support.crm_salesforce import SalesforceStandIn


def salesforce_org(
    sf: SalesforceStandIn, *rules: dict[str, Any], **connection_fields: Any
) -> dict[str, Any]:
    """Build the org and publish ``rules`` followed by an "Everyone" rule to the team.

    ``connection_fields`` override the connection's defaults (write-back on, a pace the tests
    do not meet: 60,000 a minute with a burst of 100). Returns the stand-in, its users, the two
    reps, the team and the connection."""
    users = {
        "ana": sf.add_user(email="ana@example.com", name="Ana A"),
        "ben": sf.add_user(email="ben@example.com", name="Ben B"),
        "ops": sf.add_user(email="ops@example.com", name="Integration"),
    }
    ana = RepFactory(email="ana@example.com", name="Ana")
    ben = RepFactory(email="ben@example.com", name="Ben")
    team = team_with([ana, ben])
    fields: dict[str, Any] = {
        "writeback_enabled": True,
        "rate_per_minute": 60_000,
        "burst": 100,
        **connection_fields,
    }
    connection = CrmConnection.objects.create(
        kind="salesforce",
        name="Salesforce",
        base_url=sf.url,
        auth_flow="client_credentials",
        client_id=sf.client_id,
        secret_encrypted=secret_seal(sf.client_secret),
        **fields,
    )
    report = crm_roster_sync(connection, create_reps=False)
    assert sorted(report.linked) == ["ana@example.com", "ben@example.com"], report.summary()
    published_ruleset(*rules, {"name": "Everyone", "action": {"type": "team", "team": team.name}})
    return {
        "sf": sf,
        "users": users,
        "ana": ana,
        "ben": ben,
        "team": team,
        "connection": connection,
    }
