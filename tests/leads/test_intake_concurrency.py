"""Concurrent requests with one idempotency key store exactly one lead (PostgreSQL)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from leads.models import Lead
from tests.leads.conftest import auth
from tests.reliability.harness import WAIT_SCALE, scaled

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


# CI: 200 keyed leads; `make reliability` (scale 10): the guide's 2,000.
KEYED = scaled(200, least=20)


def test_keyed_leads_sent_three_times_two_at_once_make_one_lead_each(source, published):
    """Reliability guide, test 10: every keyed lead is sent three times, two of the copies at the
    same moment from two clients, the third after; then once more with its body changed by one
    byte. Every copy answers 202 with the original's id (the two later ones with
    ``Idempotent-Replayed: true``), the changed body 422 ``idempotency_key_reused``, and the
    database holds exactly one lead per key."""
    body = {k: json.dumps({"email": f"k{k}@example.com", "note": "x"}) for k in range(KEYED)}
    answers: dict[int, list] = {k: [] for k in range(KEYED)}
    lock = threading.Lock()

    def send(k: int, data: str, client: Client) -> Any:
        return client.post(
            "/api/v1/intake/webform/",
            data=data,
            content_type="application/json",
            **auth(),
            HTTP_IDEMPOTENCY_KEY=f"key-{k}",
        )

    def clients(work: list[tuple[int, str]], record: bool) -> list:
        """Eight clients take the work in order: the two copies of a key, side by side in the
        list, go to two clients at about the same moment."""
        todo = iter(work)
        refused: list = []

        def run() -> None:
            client = Client()
            try:
                while True:
                    with lock:
                        item = next(todo, None)
                    if item is None:
                        return
                    response = send(item[0], item[1], client)
                    with lock:
                        (answers[item[0]] if record else refused).append(response)
            finally:
                connection.close()

        threads = [threading.Thread(target=run) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120 * WAIT_SCALE)
        return refused

    clients([(k, body[k]) for k in range(KEYED) for _ in range(2)], record=True)
    clients([(k, body[k]) for k in range(KEYED)], record=True)
    changed = clients([(k, body[k].replace('"x"', '"y"')) for k in range(KEYED)], record=False)

    assert Lead.objects.count() == KEYED
    for k, responses in answers.items():
        assert [r.status_code for r in responses] == [202] * 3, (k, responses)
        assert len({r.json()["id"] for r in responses}) == 1, k
        assert sorted(r.get("Idempotent-Replayed") == "true" for r in responses) == [
            False,
            True,
            True,
        ], k
    assert [r.status_code for r in changed] == [422] * KEYED
    assert {r.json()["error"]["code"] for r in changed} == {"idempotency_key_reused"}
    stored = set(Lead.objects.values_list("id", flat=True))
    assert {str(i) for i in stored} == {r[0].json()["id"] for r in answers.values()}
