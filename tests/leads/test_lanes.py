"""Lanes (leads.lanes): each lead is accepted in a lane, and every enqueue sends it to that lane's
queue: the kickoff, a batch, the stale sweeper, a re-route, enrichment and the CRM lookup."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from leads import lanes
from leads.models import Lead, LeadStatus, Source
from leads.services import lead_ingest_batch, leads_requeue_stale
from tests.leads.conftest import Published, auth
from tests.leads.factories import LeadFactory, SourceFactory

URL = "/api/v1/intake/webform/"


# --- the pure rules ----------------------------------------------------------------------------


@given(
    source_lane=st.one_of(st.sampled_from(["", *lanes.LANES]), st.text(max_size=12)),
    path=st.one_of(st.sampled_from([lanes.SINGLE, lanes.BATCH, lanes.OTHER]), st.text()),
)
def test_the_source_lane_wins_else_the_path_decides_and_the_answer_is_always_a_lane(
    source_lane: str, path: str
) -> None:
    lane = lanes.lane_for(source_lane, path)
    assert lane in lanes.LANES
    if source_lane in lanes.LANES:
        assert lane == source_lane
    elif path == lanes.SINGLE:
        assert lane == lanes.REALTIME
    elif path == lanes.BATCH:
        assert lane == lanes.BULK
    else:
        assert lane == lanes.NORMAL


@given(st.one_of(st.none(), st.text(max_size=12), st.sampled_from(lanes.LANES)))
def test_every_value_maps_to_a_declared_queue(value: str | None) -> None:
    from config.celery import app

    declared = {q.name for q in app.conf.task_queues}
    assert lanes.routing_queue(value) in declared
    assert lanes.stage_queue("enrichment", value) in declared
    assert lanes.stage_queue("crm", value) in declared
    assert lanes.lane_of_queue(lanes.routing_queue(value)) == lanes.lane_clean(value)


def test_normal_keeps_the_old_queue_names_and_every_lane_queue_is_declared() -> None:
    from config.celery import app

    assert lanes.routing_queue(lanes.NORMAL) == "routing"
    assert lanes.stage_queue("enrichment", lanes.BULK) == "enrichment"
    assert lanes.stage_queue("crm", lanes.REALTIME) == "crm.realtime"
    assert set(lanes.all_queues()) <= {q.name for q in app.conf.task_queues}
    with pytest.raises(ValueError, match="unknown stage"):
        lanes.stage_queue("delivery", lanes.REALTIME)


def test_the_procfile_workers_consume_every_lane_realtime_first() -> None:
    from pathlib import Path

    procfile = (Path(__file__).resolve().parents[2] / "Procfile").read_text(encoding="utf-8")
    consumed: dict[str, list[str]] = {}
    for line in procfile.splitlines():
        name, _, command = line.partition(":")
        words = command.split()
        if "--queues" in words:
            consumed[name] = words[words.index("--queues") + 1].split(",")
    worker, io = consumed["worker"], consumed["io"]
    assert worker[0] == "routing.realtime"
    assert worker.index("routing") < worker.index("routing.bulk")
    assert io[:2] == ["enrichment.realtime", "crm.realtime"]
    assert set(lanes.all_queues()) <= set(worker) | set(io)


# --- intake paths ------------------------------------------------------------------------------


def _post(client: Any, body: Any, url: str = URL) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json", **auth())


@pytest.mark.django_db
def test_a_form_post_is_realtime_and_goes_to_the_realtime_queue(
    client: Any, source: Source, published: Published, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        lead_id = _post(client, {"email": "ana@acme.com"}).json()["id"]
    assert Lead.objects.get(pk=lead_id).lane == lanes.REALTIME
    assert published.queues == {lead_id: "routing.realtime"}


@pytest.mark.django_db
def test_a_batch_request_is_bulk_even_with_one_record(
    client: Any, source: Source, published: Published, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        assert _post(client, [{"email": "ana@acme.com"}], f"{URL}batch/").status_code == 202
    assert list(Lead.objects.values_list("lane", flat=True)) == [lanes.BULK]
    assert list(published.queues.values()) == ["routing.bulk"]


@pytest.mark.django_db
def test_several_leads_in_one_message_to_the_single_url_are_bulk(
    client: Any, published: Published, django_capture_on_commit_callbacks: Any
) -> None:
    SourceFactory(slug="seg", kind="segment")
    body = {
        "batch": [
            {"type": "identify", "messageId": "m1", "traits": {"email": "ana@acme.de"}},
            {"type": "identify", "messageId": "m2", "traits": {"email": "ben@beta.de"}},
        ]
    }
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            "/api/v1/intake/seg/", json.dumps(body), content_type="application/json", **auth("seg")
        )
    assert response.status_code == 202, response.content
    assert list(Lead.objects.values_list("lane", flat=True)) == [lanes.BULK] * 2
    assert list(published.queues.values()) == ["routing.bulk"] * 2


@pytest.mark.django_db
@pytest.mark.parametrize("lane", lanes.LANES)
def test_the_source_lane_overrides_the_intake_path(
    client: Any,
    published: Published,
    django_capture_on_commit_callbacks: Any,
    lane: str,
) -> None:
    SourceFactory(slug="webform", lane=lane)
    with django_capture_on_commit_callbacks(execute=True):
        single = _post(client, {"email": "ana@acme.com"}).json()["id"]
        batch = _post(client, [{"email": "ben@acme.com"}], f"{URL}batch/").json()
    [batch_id] = [row["id"] for row in batch["results"]]
    assert Lead.objects.get(pk=single).lane == lane == Lead.objects.get(pk=batch_id).lane
    assert published.queues == dict.fromkeys([single, batch_id], lanes.routing_queue(lane))


@pytest.mark.django_db
def test_the_lead_document_names_its_lane(client: Any, source: Source, admin_user: Any) -> None:
    lead = LeadFactory(source=source, lane=lanes.BULK)
    client.force_login(admin_user)
    assert client.get(f"/api/v1/leads/{lead.pk}/").json()["lane"] == "bulk"


# --- every later enqueue keeps the lane ------------------------------------------------------


@pytest.mark.django_db
def test_the_stale_sweeper_sends_each_lead_to_its_own_lane(
    source: Source, published: Published
) -> None:
    old = timezone.now() - timedelta(hours=1)
    by_lane = {
        lane: [LeadFactory(source=source, lane=lane, queued_at=old).pk for _ in range(3)]
        for lane in lanes.LANES
    }
    assert leads_requeue_stale() == 9
    for lane, ids in by_lane.items():
        assert {published.queues[str(i)] for i in ids} == {lanes.routing_queue(lane)}
    assert Lead.objects.filter(requeued_at__isnull=True).count() == 0


@pytest.mark.django_db
def test_a_reroute_and_a_delayed_retry_stay_in_the_lane(
    source: Source,
    published: Published,
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from leads import services
    from leads.services import lead_enqueue_later
    from routing.services import lead_reroute

    lead = LeadFactory(source=source, lane=lanes.REALTIME, status=LeadStatus.UNASSIGNED)
    with django_capture_on_commit_callbacks(execute=True):
        lead_reroute(lead_id=lead.pk, actor="revops")
    assert published.queues == {str(lead.pk): "routing.realtime"}

    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(
        services.celery_app, "send_task", lambda name, **kw: sent.append({"name": name, **kw})
    )
    assert lead_enqueue_later(lead.pk, delay=1.0)
    assert sent[0]["queue"] == "routing.realtime"
    assert sent[0]["countdown"] == 1.0


@pytest.mark.django_db
def test_a_batch_service_call_defaults_to_bulk(source: Source, published: Published) -> None:
    [accepted] = lead_ingest_batch(source=source, records=[{"email": "ana@acme.com"}])
    assert Lead.objects.get(pk=accepted.lead_id).lane == lanes.BULK  # type: ignore[union-attr]


@pytest.mark.django_db
def test_enrichment_and_crm_lookups_of_realtime_leads_go_to_their_realtime_queues(
    source: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    import contextlib

    from config.celery import app
    from routing.crm.lookup import crm_enqueue
    from routing.enrichment.services import enrichment_enqueue

    sent: list[tuple[str, str, str]] = []

    def send_task(name: str, args: list[Any], **kwargs: Any) -> None:
        sent.append((name, args[0], kwargs["queue"]))

    monkeypatch.setattr(app, "send_task", send_task)
    monkeypatch.setattr(app, "producer_or_acquire", lambda *a, **k: contextlib.nullcontext())
    fast = LeadFactory(source=source, lane=lanes.REALTIME)
    slow = LeadFactory(source=source, lane=lanes.BULK)
    assert enrichment_enqueue([fast.pk, slow.pk]) == 2
    assert crm_enqueue([fast.pk, slow.pk]) == 2
    assert sent == [
        ("enrichment.enrich_lead", str(fast.pk), "enrichment.realtime"),
        ("enrichment.enrich_lead", str(slow.pk), "enrichment"),
        ("crm.lookup_lead", str(fast.pk), "crm.realtime"),
        ("crm.lookup_lead", str(slow.pk), "crm"),
    ]


@pytest.mark.django_db
def test_the_source_admin_shows_and_saves_the_lane(
    client: Any, source: Source, admin_user: Any
) -> None:
    client.force_login(admin_user)
    page = client.get(f"/admin/leads/source/{source.pk}/change/")
    assert page.status_code == 200
    assert b'name="lane"' in page.content
    listing = client.get("/admin/leads/source/")
    assert b"by intake (form: realtime, batch: bulk)" in listing.content
