"""A lead whose person key cannot be opened (a master key removed or lost; issue 21).

It failed on every attempt, went back to the queue each time, and its quarantine itself raised
(the `failed` event's error is sealed with the very key that cannot be opened): a crash loop.
Now it fails at once with the reason on the lead, a plain `failed` event, a count in /metrics,
a warning from `migrate`/`check --database` and the worker's start; routed again once the key
is back, it is assigned.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.test import Client, override_settings

from audit.models import Event, EventType
from config.celery import worker_privacy_keys_check
from config.checks import privacy_keys_open_check
from leads import privacy
from leads.models import LeadStatus
from routing.rules_io import rules_import
from routing.services import lead_process, lead_reroute
from tests.leads.factories import LeadFactory
from tests.routing.monitoring.test_metrics import scrape
from tests.routing.test_erasure import _rules  # noqa: F401 (autouse fixture)
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db

EMAIL = "ludmila.keyless@lostkey.example"


def test_a_lead_whose_key_cannot_be_opened_fails_once_clearly_and_is_counted(
    client: Client, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from routing.monitoring.metrics import COLLECTOR

    rules_import(RULES, publish=True)
    old, new = privacy.new_master_key(), privacy.new_master_key()
    with override_settings(PRIVACY_KEYS=[old]):
        assert privacy.person_key_for(email=EMAIL) is not None  # an earlier lead's key
    privacy.cache_clear()
    lead = LeadFactory(raw_payload={"email": EMAIL, "first_name": "Ludmila"})
    with override_settings(PRIVACY_KEYS=[new]):  # the old master key is gone
        assert lead_process(lead_id=lead.id) == LeadStatus.FAILED
        lead.refresh_from_db()
        assert lead.status == LeadStatus.FAILED
        assert lead.last_error.startswith("privacy key: ")
        assert "cannot be unwrapped" in lead.last_error
        assert lead.claimed_until is None
        assert lead.requeued_at is None  # not sent back to the queue
        failed = Event.objects.get(chain=str(lead.pk), type=EventType.FAILED)
        assert failed.data["reason"] == lead.last_error
        assert failed.sealed is None
        assert lead_process(lead_id=lead.id) is None  # nothing to retry in a loop

        settings.METRICS_TOKEN = "t0ken"
        COLLECTOR.clear()
        found = scrape(client, HTTP_AUTHORIZATION="Bearer t0ken")
        assert found[("leadrouter_leads_failed_privacy_key", ())] == 1

        # Said at start: `migrate` / `check --database`, and the worker's log.
        warnings = privacy_keys_open_check(databases=["default"])
        assert [w.id for w in warnings] == ["leadrouter.W001"]
        assert "1 person key(s)" in warnings[0].msg
        with caplog.at_level(logging.CRITICAL, logger="config.celery"):
            worker_privacy_keys_check()
        assert "cannot be opened with PRIVACY_KEYS" in caplog.text
        assert privacy_keys_open_check(databases=None) == []

    privacy.cache_clear()
    with override_settings(PRIVACY_KEYS=[new, old]):  # the key put back, after the first
        assert privacy_keys_open_check(databases=["default"]) == []
        lead_reroute(lead_id=lead.id, actor="user:ops")
        assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
