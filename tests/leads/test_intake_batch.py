"""POST /api/v1/intake/<slug>/batch/ — arrays, CSV bodies and CSV uploads."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from leads.models import Lead
from tests.leads.conftest import auth

pytestmark = pytest.mark.django_db
URL = "/api/v1/intake/webform/batch/"


def post(client, body, content_type="application/json"):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post(URL, data=data, content_type=content_type, **auth())


def test_each_record_is_judged_on_its_own(
    client, source, published, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = post(
            client,
            [
                {"email": "a@b.co"},
                {"note": "no contact"},
                "not an object",
                {"phone": "+14155550100"},
            ],
        )
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["accepted"] == 2
    assert body["rejected"] == 2
    results = body["results"]
    assert [r["index"] for r in results] == [0, 1, 2, 3]
    assert results[0]["status"] == "received"
    assert results[1]["error"]["code"] == "not_a_lead"
    assert results[2]["error"]["code"] == "invalid_body"
    ids = {r["id"] for r in results if "id" in r}
    assert set(map(str, Lead.objects.values_list("id", flat=True))) == ids
    assert sorted(published) == sorted(ids)


@pytest.mark.parametrize("keyed", [True, False])
def test_a_full_batch_is_a_few_bulk_statements(client, source, published, keyed):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.leads.test_intake import data_queries

    records = [{"email": f"p{i}@example.com"} for i in range(1000)]
    if keyed:
        for i, record in enumerate(records):
            record["external_id"] = f"x{i}"
    with CaptureQueriesContext(connection) as ctx:
        response = post(client, records)
    assert response.json()["accepted"] == 1000
    assert Lead.objects.count() == 1000
    queries = data_queries(ctx.captured_queries)
    if connection.vendor == "postgresql":
        # the source; with keys, one lookup of earlier uses; then one statement writes the
        # leads and their events and returns the ids stored (leads.batch_sql)
        writes = [q for q in queries if '"leads_lead"' in q and '"audit_event"' in q]
        assert len(writes) == 1, queries
        assert writes[0].startswith("WITH batch AS")
        assert len(queries) == (3 if keyed else 2), queries
        return
    inserts = [q for q in queries if q.startswith("INSERT")]
    lead_inserts = [q for q in inserts if '"leads_lead"' in q]
    event_inserts = [q for q in inserts if '"audit_event"' in q]
    assert len(lead_inserts) + len(event_inserts) == len(inserts)
    # SQLite caps bound parameters per statement, so its INSERTs come in chunks of what fits:
    # bulk all the same (one statement per chunk, never one per lead), more as the lead grows.
    batch = connection.ops.bulk_batch_size(list(Lead._meta.concrete_fields), [None] * 1000)
    chunks = -(-1000 // batch)
    assert len(lead_inserts) <= chunks + 1
    assert len(event_inserts) <= 40
    # the source; with keys, one lookup of earlier uses and one check of what got inserted
    assert len(queries) - len(inserts) == (3 if keyed else 1), queries


def test_external_ids_replay_across_and_within_batches(client, source, published):
    first = post(client, [{"email": "a@b.co", "external_id": "1"}]).json()["results"][0]
    body = post(
        client,
        [
            {"email": "a@b.co", "external_id": "1"},  # replay of an earlier batch
            {"email": "c@b.co", "external_id": "2"},
            {"email": "c@b.co", "external_id": "2"},  # replay inside this batch
            {"email": "d@b.co", "external_id": "2"},  # same key, other body
        ],
    ).json()
    r = body["results"]
    assert r[0] == {"index": 0, "id": first["id"], "status": "received", "replayed": True}
    assert r[2]["id"] == r[1]["id"]
    assert r[2]["replayed"] is True
    assert r[3]["error"]["code"] == "idempotency_key_reused"
    assert body["accepted"] == 3
    assert Lead.objects.count() == 2


def test_csv_body(client, source, published):
    csv_body = (
        "Email Address,Company,Country\r\nana@acme.com,Acme,Germany\r\n,,\r\nbo@beta.io,Beta,US\r\n"
    )
    body = post(client, csv_body, content_type="text/csv").json()
    assert body["accepted"] == 2
    assert Lead.objects.filter(raw_payload__Company="Acme").exists()


def test_csv_upload(client, source, published):
    upload = SimpleUploadedFile(
        "leads.csv", b"\xef\xbb\xbfemail,company\na@b.co,A\nb@b.co,B\n", "text/csv"
    )
    response = client.post(URL, data={"file": upload}, **auth())
    assert response.status_code == 202, response.content
    assert response.json()["accepted"] == 2
    assert sorted(Lead.objects.values_list("raw_payload__email", flat=True)) == ["a@b.co", "b@b.co"]


def test_upload_without_a_file_is_400(client, source):
    response = client.post(URL, data={"other": "x"}, **auth())
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_body"


@pytest.mark.parametrize("kind", ["json", "csv"])
def test_over_the_batch_limit_is_413_and_stores_nothing(client, source, kind):
    if kind == "json":
        response = post(client, [{"email": f"p{i}@x.io"} for i in range(1001)])
    else:
        rows = "\n".join(f"p{i}@x.io" for i in range(10_000))
        response = post(client, f"email\n{rows}\n", content_type="text/csv")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "batch_too_large"
    assert not Lead.objects.exists()


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        (b"{}", "application/json", 400),
        (b"[]", "application/json", 400),
        (b"\n", "text/csv", 400),
        (b'email\n"unterminated', "text/csv", 400),
        (b"email,email\na,b\n", "text/csv", 400),
        (b"email\n\xff\xfe\n", "text/csv", 400),
        (b"<xml/>", "application/xml", 415),
    ],
)
def test_bad_batches_are_json_errors(client, source, body, content_type, status):
    response = post(client, body, content_type=content_type)
    assert response.status_code == status
    assert "error" in response.json()
    assert not Lead.objects.exists()


def test_batch_rate_limit_counts_records(client, source, published):
    source.rate_limit_per_minute = 5
    source.save()
    assert post(client, [{"email": f"{i}@b.co"} for i in range(5)]).status_code == 202
    response = post(client, [{"email": "x@b.co"}])
    assert response.status_code == 429
    assert response["Retry-After"]


def test_a_bad_record_does_not_sink_the_batch(client, source, published):
    body = post(
        client,
        [{"email": "a@b.co"}, {"email": "b\u0000@b.co"}, {"email": "c@b.co", "x": "y" * 70_000}],
    ).json()
    assert body["accepted"] == 1
    assert [r.get("error", {}).get("code") for r in body["results"]] == [
        None,
        "invalid_body",
        "invalid_body",
    ]


def test_batches_are_enqueued_in_chunks(
    client, source, published, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        assert post(client, [{"email": f"p{i}@b.co"} for i in range(250)]).json()["accepted"] == 250
    assert len(published) == 250
    assert published.messages == ["routing.process_leads"] * 3
