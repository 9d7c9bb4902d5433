"""Concurrent requests with one idempotency key store exactly one lead (PostgreSQL)."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connection
from django.test import Client

from leads.models import Lead
from tests.leads.conftest import auth

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.reliability,
    pytest.mark.django_db(transaction=True),
]


def _race(n: int, payload_for, headers_for) -> list:  # type: ignore[no-untyped-def]
    barrier = threading.Barrier(n)
    responses: list = [None] * n

    def send(i: int) -> None:
        client = Client()
        barrier.wait()
        try:
            responses[i] = client.post(
                "/api/v1/intake/webform/",
                data=json.dumps(payload_for(i)),
                content_type="application/json",
                **headers_for(i),
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return responses


def test_twenty_concurrent_requests_with_one_key_make_one_lead(source, published):
    responses = _race(
        20,
        lambda i: {"email": "same@example.com"},
        lambda i: {**auth(), "HTTP_IDEMPOTENCY_KEY": "k"},
    )
    assert [r.status_code for r in responses] == [202] * 20
    assert len({r.json()["id"] for r in responses}) == 1
    assert sum(r.get("Idempotent-Replayed") == "true" for r in responses) == 19
    assert Lead.objects.count() == 1
    assert len(published) == 1


def test_concurrent_reuse_with_different_bodies_gives_one_lead_and_422s(source, published):
    responses = _race(
        10,
        lambda i: {"email": f"p{i}@example.com"},
        lambda i: {**auth(), "HTTP_IDEMPOTENCY_KEY": "k"},
    )
    codes = sorted(r.status_code for r in responses)
    assert codes == [202] + [422] * 9
    assert Lead.objects.count() == 1


def test_concurrent_batches_sharing_keys_neither_deadlock_nor_duplicate(source, published):
    import random

    keys = [f"k{i}" for i in range(1000)]

    def batch(i: int) -> list[dict]:
        shuffled = keys[:]
        random.Random(i).shuffle(shuffled)
        return [{"email": f"{key}@example.com", "external_id": key} for key in shuffled]

    barrier = threading.Barrier(8)
    responses: list = [None] * 8

    def send(i: int) -> None:
        client = Client()
        barrier.wait()
        try:
            responses[i] = client.post(
                "/api/v1/intake/webform/batch/",
                data=json.dumps(batch(i)),
                content_type="application/json",
                **auth(),
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in responses] == [202] * 8, [r.content[:200] for r in responses]
    assert all(r.json()["accepted"] == 1000 for r in responses)
    assert Lead.objects.count() == 1000
    ids = {k: {res["id"] for r in responses for res in r.json()["results"]} for k in ["all"]}
    assert len(ids["all"]) == 1000
