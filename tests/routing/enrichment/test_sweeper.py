"""The enrichment sweeper: due leads re-sent (bounded by the rate limit), stragglers handed back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from leads.models import Lead
from routing.enrichment import enrichment_sweep_due
from routing.enrichment.services import ENRICH_LEAD_TASK
from routing.enrichment.store import redis_url
from tests.routing.enrichment.conftest import parked_lead

pytestmark = pytest.mark.django_db


def test_due_leads_are_sent_with_an_expiry_and_others_are_not(http, sent, settings):
    due = [parked_lead() for _ in range(3)]
    later = parked_lead(enrichment_next_at=timezone.now() + timedelta(minutes=5))
    routed = parked_lead(claimed_until=timezone.now() + timedelta(minutes=1))
    assert enrichment_sweep_due() == 3
    assert sorted(sent.ids(ENRICH_LEAD_TASK)) == sorted(str(lead.id) for lead in due)
    assert str(later.id) not in sent.ids(ENRICH_LEAD_TASK)
    assert str(routed.id) not in sent.ids(ENRICH_LEAD_TASK)
    interval = settings.ENRICHMENT_SWEEP_INTERVAL_SECONDS
    assert all(options["expires"] >= 2 * interval for _, _, options in sent)


def test_the_sweep_sends_no_more_than_the_rate_limit_can_serve_and_spreads_them(
    http, sent, settings
):
    settings.ENRICHMENT_HTTP_RATE_PER_MINUTE = 60  # one a second
    settings.ENRICHMENT_HTTP_BURST = 2
    settings.ENRICHMENT_SWEEP_INTERVAL_SECONDS = 10
    for _ in range(30):
        parked_lead()
    sent_now = enrichment_sweep_due()
    countdowns = sorted(options.get("countdown", 0) for _, _, options in sent)
    if redis_url() is not None:  # the bucket in Redis (the cache's, or REDIS_URL without one)
        # The bucket holds 2 tokens and refills 10 before the next sweep: 12 sent, the first two
        # at once, the others one second apart.
        assert sent_now == 12
        assert countdowns == [0, 0, *range(1, 11)]
    else:
        # The cache's one-minute window has 60 free: all 30 at once.
        assert sent_now == 30
        assert countdowns == [0] * 30


def test_with_the_provider_off_every_due_lead_is_sent_to_be_released(sent, settings):
    settings.ENRICHMENT_HTTP_URL = ""
    for _ in range(5):
        parked_lead()
    assert enrichment_sweep_due(batch_size=3) == 3


def test_a_finished_lead_routing_never_took_is_handed_back_once_per_period(sent, settings):
    past = timezone.now() - timedelta(seconds=1)
    done = parked_lead(enrichment_status="done", enrichment_next_at=past)
    parked_lead(enrichment_status="done", enrichment_next_at=timezone.now() + timedelta(hours=1))
    taken = parked_lead(
        enrichment_status="failed",
        enrichment_next_at=past,
        claimed_until=timezone.now() + timedelta(minutes=1),
    )
    assert enrichment_sweep_due() == 1
    assert sent.ids("routing.process_lead") == [str(done.id)]
    assert str(taken.id) not in sent.ids("routing.process_lead")
    done.refresh_from_db()
    assert done.enrichment_next_at > timezone.now() + timedelta(seconds=30)
    assert enrichment_sweep_due() == 0  # not again before the period


def test_the_management_command_sweeps(http, sent, capsys):
    lead = parked_lead()
    call_command("enrichment_sweep")
    assert "Sent 1 lead(s)." in capsys.readouterr().out
    assert sent.ids(ENRICH_LEAD_TASK) == [str(lead.id)]
    assert Lead.objects.get(id=lead.id).enrichment_status == "pending"
