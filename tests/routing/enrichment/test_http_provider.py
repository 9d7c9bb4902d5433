"""The HTTP provider against a real local HTTP server: fills, retries, 429, breaker, hostility."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from werkzeug import Request, Response

from audit.models import Event
from leads.models import Lead
from routing.enrichment import enrichment_http_wanted, enrichment_trace_note, lead_enrich
from routing.enrichment.services import ENRICH_LEAD_TASK, enrichment_enqueue_after_commit
from tests.leads.factories import LeadFactory
from tests.routing.enrichment.conftest import make_due, parked_lead
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db

PROCESS_LEAD = "routing.process_lead"


def events(lead: Lead) -> list[tuple[str, dict]]:
    return [(e.type, e.data) for e in Event.objects.filter(lead_id=lead.id).order_by("seq")]


def test_wanted_only_when_configured_and_not_yet_enriched(settings, http):
    lead = LeadFactory.build(enrichment_status="")
    assert enrichment_http_wanted(lead)
    assert not enrichment_http_wanted(LeadFactory.build(enrichment_status="done"))
    settings.ENRICHMENT_HTTP_URL = ""
    assert not enrichment_http_wanted(lead)
    settings.ENRICHMENT_HTTP_URL = "http://127.0.0.1:9/x"
    settings.ENRICHMENT_PROVIDERS = ["account"]
    assert not enrichment_http_wanted(lead)


def test_parking_publishes_the_enrich_task_only_after_commit(
    sent, django_capture_on_commit_callbacks
):
    lead = parked_lead()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        enrichment_enqueue_after_commit(lead.id)
    assert sent == []
    for callback in callbacks:
        callback()
    assert sent.ids(ENRICH_LEAD_TASK) == [str(lead.id)]


def test_a_broker_failure_when_parking_is_swallowed(monkeypatch, sent):
    from config.celery import app

    def broken(*args, **kwargs):
        raise ConnectionError("broker down")

    monkeypatch.setattr(app, "send_task", broken)
    from routing.enrichment.services import enrichment_enqueue

    assert enrichment_enqueue([parked_lead().id]) == 0  # no exception: the sweeper repairs it


def test_success_fills_only_empty_fields_stores_what_it_got_and_hands_back(
    http, sent, django_capture_on_commit_callbacks
):
    http.expect_request(
        "/enrich",
        method="POST",
        headers={"Authorization": "Bearer provider-key"},
        json={"email": "ana@acme.com", "domain": "acme.com", "company": "Acme Given"},
    ).respond_with_json(
        {
            "company": "Acme From Provider",
            "industry": "  Software\u0000 ",
            "employees": "51-200",
            "annual_revenue": "$1.5M",
            "country": "United States",
            "region": "California",
            "favourite_colour": "blue",
        }
    )
    lead = parked_lead(company="Acme Given", country="")
    with django_capture_on_commit_callbacks(execute=True):
        assert lead_enrich(lead_id=lead.id) == "done"
    lead.refresh_from_db()
    assert lead.company == "Acme Given"  # never overwritten
    assert (lead.industry, lead.employees, lead.country, lead.region) == (
        "Software",
        51,
        "US",
        "CA",
    )
    assert lead.annual_revenue == Decimal("1500000.00")
    assert lead.enrichment_status == "done"
    record = lead.enrichment["http"]
    assert record["status"] == "done"
    assert sorted(record["filled"]) == [
        "annual_revenue",
        "country",
        "employees",
        "industry",
        "region",
    ]
    assert record["data"]["company"] == "Acme From Provider"  # kept, though not filled
    assert record["ignored"] == ["favourite_colour"]
    assert events(lead)[-1][0] == "enriched"
    assert sent.ids(PROCESS_LEAD) == [str(lead.id)]  # handed back to routing
    assert enrichment_trace_note(lead) is None
    # A duplicate message for a finished lead is a no-op.
    assert lead_enrich(lead_id=lead.id) is None
    assert len(http.log) == 1


def test_a_lead_that_is_not_due_or_not_parked_is_left_alone(http):
    http.expect_request("/enrich").respond_with_json({})
    later = parked_lead(enrichment_next_at=timezone.now() + timedelta(minutes=1))
    routing_has_it = parked_lead(claimed_until=timezone.now() + timedelta(minutes=1))
    assert lead_enrich(lead_id=later.id) is None
    assert lead_enrich(lead_id=routing_has_it.id) is None
    assert lead_enrich(lead_id="not-a-uuid") is None
    assert http.log == []
    later.refresh_from_db()
    assert later.enrichment_attempts == 0


def test_a_slow_provider_times_out_and_a_retry_is_scheduled_without_waiting(http):
    def slow(request: Request) -> Response:
        time.sleep(1.5)
        return Response("{}", content_type="application/json")

    http.expect_request("/enrich").respond_with_handler(slow)
    lead = parked_lead()
    started = time.monotonic()
    assert lead_enrich(lead_id=lead.id) == "retry"
    took = time.monotonic() - started
    assert took < 1.2, took  # bounded by the 0.5 s timeout, not by the provider
    lead.refresh_from_db()
    assert lead.enrichment_status == "pending"
    assert lead.enrichment_attempts == 1
    assert "timeout" in lead.enrichment["http"]["error"]
    delay = (lead.enrichment_next_at - timezone.now()).total_seconds()
    assert 1.0 < delay <= 2.6  # backoff base 2 s, +25 % jitter at most
    # Let the server finish its answer, so that it is not logged into the next test.
    wait_until(lambda: len(http.log) == 1, timeout=5, interval=0.05)


def test_5xx_retries_with_growing_delays_then_fails_and_the_trace_says_so(
    http, sent, django_capture_on_commit_callbacks, settings
):
    settings.ENRICHMENT_BREAKER_FAILURES = 10
    http.expect_request("/enrich").respond_with_data("down", status=503)
    lead = parked_lead()
    delays = []
    for attempt in range(1, 4):
        before = timezone.now()
        assert lead_enrich(lead_id=lead.id) == "retry"
        lead.refresh_from_db()
        assert lead.enrichment_attempts == attempt
        delays.append((lead.enrichment_next_at - before).total_seconds())
        assert lead_enrich(lead_id=lead.id) is None  # not due yet: no call
        make_due(lead)
    assert delays == sorted(delays)
    assert [d >= floor for d, floor in zip(delays, (2, 4, 8), strict=True)] == [True] * 3
    assert len(http.log) == 3
    with django_capture_on_commit_callbacks(execute=True):
        assert lead_enrich(lead_id=lead.id) == "failed"
    lead.refresh_from_db()
    assert lead.enrichment_status == "failed"
    assert lead.enrichment["http"]["reason"] == "HTTP 503 (attempt 4 of 4)"
    assert enrichment_trace_note(lead) == (
        "enrichment by http failed: HTTP 503 (attempt 4 of 4); routed without it"
    )
    kind, data = events(lead)[-1]
    assert kind == "enrichment_failed"
    assert data["reason"] == "HTTP 503 (attempt 4 of 4)"
    assert sent.ids(PROCESS_LEAD) == [str(lead.id)]
    assert (lead.status, lead.claimed_until) == ("processing", None)


def test_429_honours_retry_after_and_pauses_the_shared_budget(http, settings):
    http.expect_oneshot_request("/enrich").respond_with_data(
        "slow down", status=429, headers={"Retry-After": "30"}
    )
    http.expect_request("/enrich").respond_with_json({"industry": "Retail"})
    lead = parked_lead()
    before = timezone.now()
    assert lead_enrich(lead_id=lead.id) == "retry"
    other = parked_lead()  # parked after: the first task's batch did not take it
    lead.refresh_from_db()
    assert 29.5 <= (lead.enrichment_next_at - before).total_seconds() <= 31
    # Every worker backs off: the next lead waits for the pause, without a call or an attempt.
    assert lead_enrich(lead_id=other.id) == "waiting"
    other.refresh_from_db()
    assert other.enrichment_attempts == 0
    assert (other.enrichment_next_at - before).total_seconds() >= 29
    assert len(http.log) == 1


def test_the_rate_limit_makes_a_lead_wait_without_counting_an_attempt(http, settings):
    settings.ENRICHMENT_HTTP_RATE_PER_MINUTE = 1
    settings.ENRICHMENT_HTTP_BURST = 1
    http.expect_request("/enrich").respond_with_json({})
    first = parked_lead()
    assert lead_enrich(lead_id=first.id) == "done"
    second = parked_lead()
    assert lead_enrich(lead_id=second.id) == "waiting"
    second.refresh_from_db()
    assert second.enrichment_attempts == 0
    assert second.enrichment["http"]["note"] == "waiting for the rate limit"
    # Without Redis the limit counts fixed one-minute windows: the next try is at the next
    # window (anywhere from a moment to a minute away, by the clock), never at once.
    assert timezone.now() < second.enrichment_next_at <= timezone.now() + timedelta(seconds=61)
    assert len(http.log) == 1


def test_the_breaker_opens_after_n_failures_and_a_half_open_probe_closes_it(http, settings):
    settings.ENRICHMENT_HTTP_MAX_ATTEMPTS = 1
    settings.ENRICHMENT_BREAKER_COOLDOWN_SECONDS = 1.0
    http.expect_request("/enrich").respond_with_data("oops", status=500)
    for _ in range(3):  # one at a time (a batch would call them together)
        assert lead_enrich(lead_id=parked_lead().id) == "failed"
    assert len(http.log) == 3

    # Open: leads are routed without the provider, and no call is made.
    for _ in range(3):
        lead = parked_lead()
        assert lead_enrich(lead_id=lead.id) == "failed"
        lead.refresh_from_db()
        assert lead.enrichment["http"]["reason"].startswith("breaker open")
        assert enrichment_trace_note(lead).startswith("enrichment by http failed: breaker open")
    assert len(http.log) == 3

    # After the cool-down one probe goes through; its success closes the breaker.
    time.sleep(1.1)
    http.clear()
    http.expect_request("/enrich").respond_with_json({"industry": "Retail"})
    probe = parked_lead()
    assert lead_enrich(lead_id=probe.id) == "done"
    after = parked_lead()
    assert lead_enrich(lead_id=after.id) == "done"
    assert len(http.log) == 2


def test_a_half_open_batch_makes_one_probe_call_and_the_rest_wait_for_it(http, settings):
    settings.ENRICHMENT_HTTP_MAX_ATTEMPTS = 1
    settings.ENRICHMENT_BREAKER_COOLDOWN_SECONDS = 1.0
    http.expect_request("/enrich").respond_with_data("oops", status=500)
    for _ in range(3):
        lead_enrich(lead_id=parked_lead().id)
    time.sleep(1.1)
    http.clear()
    http.expect_request("/enrich").respond_with_json({"industry": "Retail"})
    probe, *others = [parked_lead() for _ in range(4)]
    assert lead_enrich(lead_id=probe.id) == "done"
    assert len(http.log) == 1  # the probe alone, though the task took all four
    for lead in others:
        lead.refresh_from_db()
        assert lead.enrichment_status == "pending"
        assert lead.enrichment["http"]["note"] == "breaker half-open: waiting for its probe"
        assert lead.enrichment_attempts == 0


def test_a_failed_half_open_probe_opens_the_breaker_again(http, settings):
    settings.ENRICHMENT_HTTP_MAX_ATTEMPTS = 1
    settings.ENRICHMENT_BREAKER_COOLDOWN_SECONDS = 1.0
    http.expect_request("/enrich").respond_with_data("oops", status=502)
    for _ in range(3):
        lead_enrich(lead_id=parked_lead().id)
    time.sleep(1.1)
    assert lead_enrich(lead_id=parked_lead().id) == "failed"  # the probe, which fails
    assert len(http.log) == 4
    blocked = parked_lead()
    assert lead_enrich(lead_id=blocked.id) == "failed"
    blocked.refresh_from_db()
    assert blocked.enrichment["http"]["reason"].startswith("breaker open")
    assert len(http.log) == 4


HOSTILE_BODIES = [
    b"not json at all",
    b"[1, 2, 3]",
    b'"just a string"',
    b"null",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"employees": ' + b"9" * 5000 + b"}",
    b"\xff\xfe\x00garbage",
    b"{" + b'"k": 1, ' * 1000 + b'"company": "x"',
]


@pytest.mark.parametrize("body", HOSTILE_BODIES, ids=range(len(HOSTILE_BODIES)))
def test_an_unusable_body_fails_the_lead_without_crashing(http, body):
    http.expect_request("/enrich").respond_with_data(body, content_type="application/json")
    lead = parked_lead(company="")
    assert lead_enrich(lead_id=lead.id) in ("failed", "done")
    lead.refresh_from_db()
    assert lead.company == ""
    assert lead.enrichment_status in ("failed", "done")


def test_hostile_values_in_a_json_object_are_ignored_not_stored(http):
    http.expect_request("/enrich").respond_with_json(
        {
            "company": {"$gt": ""},
            "industry": "x" * 10_000,
            "employees": -5,
            "annual_revenue": "1e400",
            "country": "Narnia",
            "region": ["CA"],
            "domain": "javascript:alert(1)",
            "city": "\u0000\u202e<script>alert(1)</script>",
            "title": 1e308,
            "postal_code": True,
            "status": "assigned",
            "id": "00000000-0000-0000-0000-000000000000",
        }
    )
    lead = parked_lead(company="", domain="", city="", industry="", title="", postal_code="")
    assert lead_enrich(lead_id=lead.id) == "done"
    lead.refresh_from_db()
    assert lead.status == "processing"  # a key named like a column is not a column
    assert lead.company == ""
    assert (lead.employees, lead.annual_revenue, lead.country) == (None, None, "")
    assert lead.domain == ""
    assert len(lead.industry) == 255
    assert "\u0000" not in lead.city
    ignored = set(lead.enrichment["http"]["ignored"])
    assert {"company", "employees", "annual_revenue", "country", "region", "domain"} <= ignored
    assert {"status", "id"} <= ignored
    json.dumps(lead.enrichment)


def test_a_body_over_the_size_cap_is_refused(http, settings):
    settings.ENRICHMENT_HTTP_MAX_BODY_BYTES = 1000
    http.expect_request("/enrich").respond_with_json({"industry": "x" * 5000})
    lead = parked_lead()
    assert lead_enrich(lead_id=lead.id) == "failed"
    lead.refresh_from_db()
    assert "larger than 1000 bytes" in lead.enrichment["http"]["reason"]


def test_404_means_no_match_and_other_4xx_fail_at_once(http):
    http.expect_oneshot_request("/enrich").respond_with_data("unknown", status=404)
    http.expect_oneshot_request("/enrich").respond_with_data("bad key", status=401)
    unknown = parked_lead()
    assert lead_enrich(lead_id=unknown.id) == "done"
    refused = parked_lead()
    assert lead_enrich(lead_id=refused.id) == "failed"
    unknown.refresh_from_db()
    refused.refresh_from_db()
    assert unknown.enrichment["http"]["status"] == "no_match"
    assert refused.enrichment["http"]["reason"] == "provider refused the request (HTTP 401)"
    assert refused.enrichment_attempts == 1


def test_a_connection_refused_is_retried(http, settings):
    settings.ENRICHMENT_HTTP_URL = "http://127.0.0.1:9/enrich"  # discard port: nothing listens
    lead = parked_lead()
    assert lead_enrich(lead_id=lead.id) == "retry"
    lead.refresh_from_db()
    assert lead.enrichment["http"]["error"].startswith("connection error")


def test_a_lead_waiting_longer_than_the_max_wait_is_routed_without_it(http, settings):
    settings.ENRICHMENT_HTTP_MAX_WAIT_SECONDS = 60
    http.expect_request("/enrich").respond_with_json({})
    since = (timezone.now() - timedelta(minutes=5)).isoformat()
    lead = parked_lead(enrichment={"http": {"since": since, "error": "HTTP 503"}})
    assert lead_enrich(lead_id=lead.id) == "failed"
    lead.refresh_from_db()
    assert lead.enrichment["http"]["reason"].startswith("no answer within 60 s")
    assert http.log == []


def test_a_try_whose_worker_died_counts_and_the_bound_quarantines_it(http, settings):
    settings.ENRICHMENT_HTTP_MAX_ATTEMPTS = 2
    http.expect_request("/enrich").respond_with_json({})
    # Two claims were made and never finished (the worker was killed): the lease ran out.
    lead = parked_lead(enrichment_attempts=2)
    assert lead_enrich(lead_id=lead.id) == "failed"
    lead.refresh_from_db()
    assert lead.enrichment["http"]["reason"] == (
        "gave up after 2 attempts; last error: none finished (worker crash or time limit)"
    )
    assert http.log == []


def test_switching_the_provider_off_releases_parked_leads(http, settings):
    lead = parked_lead()
    settings.ENRICHMENT_HTTP_URL = ""
    assert lead_enrich(lead_id=lead.id) == "failed"
    lead.refresh_from_db()
    assert "not configured" in enrichment_trace_note(lead)
