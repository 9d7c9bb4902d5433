"""Real worker processes on PostgreSQL and Redis, with the CRM stages on, against the Salesforce
stand-in: a spike while the CRM rate-limits, the CRM down for a while, and an owner changed in
the CRM after our write. What beat does (the sweepers, the health check) the test does itself,
on a short loop, so that the timing is the test's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.db.models import Count

from leads.models import CrmLookupStatus, Lead, LeadStatus
from leads.services import leads_enqueue
from routing.crm.health import crm_health_check
from routing.crm.lookup import crm_sweep_due
from routing.crm.models import CrmConnection, CrmOwner
from routing.crm.roster import crm_roster_sync
from routing.crm.salesforce import clear_token_cache
from routing.crm.secrets import secret_seal
from routing.delivery.models import Delivery
from routing.delivery.services import deliveries_sweep_due
from routing.models import Assignment
from routing.monitoring.models import Alert
from tests.leads.factories import LeadFactory
from tests.routing.crm.orgs import salesforce_org
from tests.routing.factories import RepFactory, published_ruleset, team_with
from tests.support.crm_salesforce import SalesforceStandIn, salesforce_standin
from tests.support.processes import celery_worker, wait_until

__all__ = ["salesforce_standin"]

pytestmark = [
    pytest.mark.worker,
    pytest.mark.redis,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

RATE_PER_MINUTE = 300  # five requests a second, shared by every worker process
BURST = 3
SCALE = max(1, int(os.environ.get("RELIABILITY_SCALE", "1")))


@pytest.fixture
def org(salesforce_standin: SalesforceStandIn, settings: Any) -> Iterator[dict[str, Any]]:
    settings.CRM_CA_BUNDLE = salesforce_standin.ca_file
    clear_token_cache()
    found = salesforce_org(
        salesforce_standin, touches_enabled=True, rate_per_minute=RATE_PER_MINUTE, burst=BURST
    )
    salesforce_standin.reset_log()
    yield found
    clear_token_cache()


def _env(sf: SalesforceStandIn, **extra: str) -> dict[str, str]:
    return {
        "CRM_CA_BUNDLE": sf.ca_file,
        "CRM_TIMEOUT_SECONDS": "2",
        "CRM_LOOKUP_BACKOFF_SECONDS": "0.5",
        "CRM_CONFIG_CACHE_SECONDS": "1",
        "DELIVERY_BACKOFF_BASE_SECONDS": "1",
        "DELIVERY_BACKOFF_MAX_SECONDS": "3",
        "DELIVERY_EMAIL_ENABLED": "false",
        **extra,
    }


def _crm_deliveries() -> dict[str, int]:
    return dict(
        Delivery.objects.filter(channel="crm")
        .values_list("status")
        .annotate(n=Count("id"))
        .order_by()
    )


def _beat() -> None:
    """What beat runs on its own schedule: the CRM and delivery sweepers."""
    crm_sweep_due()
    deliveries_sweep_due()


def _outputs(*workers: Any) -> str:
    return "\n".join(worker.text()[-3000:] for worker in workers)


def test_a_spike_while_the_crm_rate_limits_routes_every_lead_within_the_limit(org, settings):
    sf = org["sf"]
    leads_n = 16 * SCALE
    leads = [
        LeadFactory(raw_payload={"email": f"spike{i}@fresh{i}.io", "last_name": f"S{i}"})
        for i in range(leads_n)
    ]
    sf.limit_next(3)  # Salesforce's own 403 REQUEST_LIMIT_EXCEEDED on the first calls
    env = _env(sf, CRM_LOOKUP_MAX_WAIT_SECONDS="300", CRM_LOOKUP_MAX_ATTEMPTS="10")
    queues = ["routing", "crm", "delivery"]
    with (
        celery_worker(concurrency=2, queues=queues, extra_env=env) as one,
        celery_worker(concurrency=2, queues=queues, extra_env=env) as two,
    ):
        assert leads_enqueue([lead.id for lead in leads]) >= 1

        def finished() -> bool:
            _beat()
            assigned = Lead.objects.filter(status=LeadStatus.ASSIGNED).count()
            return assigned == leads_n and _crm_deliveries() == {"delivered": leads_n}

        wait_until(
            finished,
            timeout=240,
            interval=0.5,
            message=lambda: f"{_crm_deliveries()} {_outputs(one, two)}",
        )
    # Every lead was looked up (none routed without the CRM: the wait is long enough) and
    # written once; the shared limit held across four worker processes.
    assert set(Lead.objects.values_list("crm_status", flat=True)) == {CrmLookupStatus.DONE}
    created = [
        r
        for r in sf.requests
        if r.method == "POST" and r.path.rstrip("/").endswith("/sobjects/Lead")
    ]
    assert len(created) == leads_n
    assert sf.max_per_second() <= BURST + RATE_PER_MINUTE / 60 + 1, sf.max_per_second()


def test_the_crm_down_routes_every_lead_and_writes_back_once_it_returns(org, settings):
    sf = org["sf"]
    settings.CRM_DOWN_ALERT_SECONDS = 3
    settings.CRM_HEALTH_PROBE_SECONDS = 1
    leads_n = 6 * SCALE
    sf.down()
    leads = [
        LeadFactory(raw_payload={"email": f"down{i}@fresh{i}.io", "last_name": f"D{i}"})
        for i in range(leads_n)
    ]
    env = _env(sf, CRM_LOOKUP_MAX_WAIT_SECONDS="4", CRM_BREAKER_FAILURES="3")
    queues = ["routing", "crm", "delivery"]
    with celery_worker(concurrency=2, queues=queues, extra_env=env) as worker:
        assert leads_enqueue([lead.id for lead in leads]) >= 1
        # Routed without the CRM, after the bounded wait.
        wait_until(
            lambda: (
                _beat(),
                Lead.objects.filter(status=LeadStatus.ASSIGNED).count() == leads_n,
            )[1],
            timeout=90,
            interval=0.5,
            message=lambda: _outputs(worker),
        )
        assert set(Lead.objects.values_list("crm_status", flat=True)) == {CrmLookupStatus.FAILED}
        assert set(_crm_deliveries()) == {"pending"}  # write-backs wait in the outbox
        # The alert opens (what the beat's health check does).
        wait_until(
            lambda: crm_health_check() == {"Salesforce": "down"},
            timeout=30,
            interval=0.5,
            message=lambda: str(list(Alert.objects.values("kind", "subject", "message"))),
        )
        sf.up()
        wait_until(
            lambda: (_beat(), _crm_deliveries() == {"delivered": leads_n})[1],
            timeout=120,
            interval=0.5,
            message=lambda: f"{_crm_deliveries()} {_outputs(worker)}",
        )
        wait_until(lambda: crm_health_check() == {}, timeout=30, interval=0.5)
    alerts = list(Alert.objects.filter(kind="crm").values_list("subject", "status"))
    assert alerts == [("Salesforce", "resolved")], alerts
    created = [
        r
        for r in sf.requests
        if r.method == "POST" and r.path.rstrip("/").endswith("/sobjects/Lead")
    ]
    assert len(created) == leads_n  # each written once, however many tries it took
    for assignment in Assignment.objects.filter(active=True).select_related("lead"):
        person_id = assignment.lead.crm["salesforce"]["written"]["id"]
        record = sf.record("Lead", person_id)
        assert record is not None
        owner = CrmOwner.objects.get(kind="salesforce", rep_id=assignment.rep_id).owner_id
        assert record["OwnerId"] == owner


def test_an_owner_changed_in_the_crm_after_our_write_is_not_overwritten(org, settings):
    from routing.crm.touches import crm_touches_run
    from routing.services import lead_reassign

    sf = org["sf"]
    lead = LeadFactory(raw_payload={"email": "mine@fresh.io", "last_name": "Mine"})
    queues = ["routing", "crm", "delivery"]
    with celery_worker(concurrency=1, queues=queues, extra_env=_env(sf)) as worker:
        leads_enqueue([lead.id])
        wait_until(
            lambda: (_beat(), _crm_deliveries() == {"delivered": 1})[1],
            timeout=60,
            interval=0.5,
            message=lambda: _outputs(worker),
        )
        lead.refresh_from_db()
        person_id = lead.crm["salesforce"]["written"]["id"]
        sf.edit("Lead", person_id, OwnerId=org["users"]["ops"])  # taken over in Salesforce
        first = Assignment.objects.get(lead=lead, active=True)
        other = org["ben"] if first.rep_id == org["ana"].pk else org["ana"]
        # A manager reassigns in LeadRouter before the first-touch job has seen the change.
        lead_reassign(lead_id=lead.id, rep_email=other.email, reason="cover", actor="manager")
        wait_until(
            lambda: (_beat(), _crm_deliveries() == {"delivered": 2})[1],
            timeout=60,
            interval=0.5,
            message=lambda: _outputs(worker),
        )
    record = sf.record("Lead", person_id)
    assert record is not None
    assert record["OwnerId"] == org["users"]["ops"]
    lead.refresh_from_db()
    assert lead.crm["salesforce"]["written"]["outcome"] == "kept"
    assert crm_touches_run()["Salesforce"]["reassigned"] == 0  # recorded once, not again


def test_an_owner_the_crm_had_is_not_overwritten_when_the_crm_was_down_at_lookup(org, settings):
    """The person is owned in Salesforce (by a user who is no rep) before the lead comes;
    Salesforce is down during the lookup, so the lead is routed without it; once Salesforce is
    back, the write-back finds that owner and leaves it (review finding B5)."""
    from audit.models import Event

    sf = org["sf"]
    person_id = sf.add_lead(
        Email="owned@acme.io", LastName="Owned", Company="Acme", OwnerId=org["users"]["ops"]
    )
    sf.down()
    lead = LeadFactory(raw_payload={"email": "owned@acme.io", "last_name": "Owned"})
    env = _env(sf, CRM_LOOKUP_MAX_WAIT_SECONDS="3")
    queues = ["routing", "crm", "delivery"]
    with celery_worker(concurrency=1, queues=queues, extra_env=env) as worker:
        leads_enqueue([lead.id])
        wait_until(
            lambda: (_beat(), Lead.objects.filter(status=LeadStatus.ASSIGNED).count() == 1)[1],
            timeout=60,
            interval=0.5,
            message=lambda: _outputs(worker),
        )
        lead.refresh_from_db()
        assert lead.crm_status == CrmLookupStatus.FAILED  # routed without Salesforce
        sf.up()
        wait_until(
            lambda: (_beat(), _crm_deliveries() == {"delivered": 1})[1],
            timeout=90,
            interval=0.5,
            message=lambda: f"{_crm_deliveries()} {_outputs(worker)}",
        )
    record = sf.record("Lead", person_id)
    assert record is not None
    assert record["OwnerId"] == org["users"]["ops"]
    assert "PATCH" not in [r.method for r in sf.requests]
    lead.refresh_from_db()
    assert lead.crm["salesforce"]["written"]["outcome"] == "owned"
    reasons = list(
        Event.objects.filter(lead=lead, type="reassigned").values_list("data__reason", flat=True)
    )
    assert len(reasons) == 1
    assert reasons[0].startswith("already owned in Salesforce by ops@example.com"), reasons


def test_a_spike_against_hubspot_with_its_limits_enforced_stays_within_them(settings):
    """Real workers, the HubSpot stand-in enforcing HubSpot's documented limits (search 5 a
    second, 100 per 10 s for the rest), the connection at its default pace: every lead is looked
    up, routed and written back, HubSpot never answers 429, and no second sees more searches
    than HubSpot allows (the Salesforce spike above only meets the stand-in's canned 403s)."""
    from routing.crm.hubspot import clear_account_cache
    from tests.support.crm_hubspot import HubSpotStandIn

    hs = HubSpotStandIn(enforce_rate_limits=True).start()
    try:
        settings.CRM_CA_BUNDLE = hs.ca_file
        clear_account_cache()
        hs.add_owner("ana@example.com", "Ana", "A")
        hs.add_owner("ben@example.com", "Ben", "B")
        ana = RepFactory(email="ana@example.com", name="Ana")
        ben = RepFactory(email="ben@example.com", name="Ben")
        team = team_with([ana, ben])
        connection = CrmConnection.objects.create(
            kind="hubspot",
            name="HubSpot",
            base_url=hs.url,
            secret_encrypted=secret_seal(hs.token),
            writeback_enabled=True,
            touches_enabled=False,
            # rate_per_minute and burst left empty: HubSpot's documented pace (180/min, 2)
        )
        crm_roster_sync(connection, create_reps=False)
        published_ruleset({"name": "Everyone", "action": {"type": "team", "team": team.name}})
        leads_n = 12 * SCALE
        leads = [
            LeadFactory(raw_payload={"email": f"hs{i}@fresh{i}.io", "last_name": f"H{i}"})
            for i in range(leads_n)
        ]
        hs.reset_log()
        env = {
            "CRM_CA_BUNDLE": hs.ca_file,
            "CRM_TIMEOUT_SECONDS": "5",
            "CRM_LOOKUP_BACKOFF_SECONDS": "0.5",
            "CRM_CONFIG_CACHE_SECONDS": "1",
            "CRM_LOOKUP_MAX_WAIT_SECONDS": "300",
            "CRM_LOOKUP_MAX_ATTEMPTS": "10",
            "DELIVERY_BACKOFF_BASE_SECONDS": "1",
            "DELIVERY_BACKOFF_MAX_SECONDS": "3",
            "DELIVERY_EMAIL_ENABLED": "false",
        }
        queues = ["routing", "crm", "delivery"]
        with (
            celery_worker(concurrency=2, queues=queues, extra_env=env) as one,
            celery_worker(concurrency=2, queues=queues, extra_env=env) as two,
        ):
            assert leads_enqueue([lead.id for lead in leads]) >= 1

            def finished() -> bool:
                _beat()
                assigned = Lead.objects.filter(status=LeadStatus.ASSIGNED).count()
                return assigned == leads_n and _crm_deliveries() == {"delivered": leads_n}

            wait_until(
                finished,
                timeout=240,
                interval=0.5,
                message=lambda: f"{_crm_deliveries()} {_outputs(one, two)}",
            )
        assert set(Lead.objects.values_list("crm_status", flat=True)) == {CrmLookupStatus.DONE}
        answered = [r.status for r in hs.requests]
        assert 429 not in answered, [r.path for r in hs.requests if r.status == 429]
        searches = sorted(
            r.at
            for r in hs.requests
            if r.method == "POST" and r.path.rstrip("/").endswith("/search")
        )
        assert searches, "the lookups searched"
        busiest = max(sum(1 for t in searches if start <= t < start + 1.0) for start in searches)
        assert busiest <= hs.search_per_second, busiest
        # Every request of any kind: within the pace (burst 2 + 3 a second), so within the
        # search limit too; HubSpot's 100 per 10 s is far off.
        assert hs.max_per_second() <= hs.search_per_second, hs.max_per_second()
    finally:
        clear_account_cache()
        hs.close()
