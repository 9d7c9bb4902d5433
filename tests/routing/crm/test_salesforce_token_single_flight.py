"""Salesforce's token, refreshed once for many threads: the I/O worker runs up to
IO_WORKER_CONCURRENCY CRM calls at once in one process, and each of them seeing the same
expired session must not log in on its own (N logins at once hit the org's login rate limit).
Real simple-salesforce and requests against the stand-in org."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from routing.crm.base import CrmError
from routing.crm.salesforce import clear_token_cache
from tests.routing.crm.test_salesforce import client_for
from tests.support.crm_salesforce import SalesforceStandIn, salesforce_standin

__all__ = ["salesforce_standin"]

THREADS = 16


@pytest.fixture(autouse=True)
def _no_cached_tokens() -> Iterator[None]:
    clear_token_cache()
    yield
    clear_token_cache()


def _all_at_once(standin: SalesforceStandIn) -> list[object]:
    """``THREADS`` threads, each with its own client of the same connection (as the stages
    build one per call), call ``users()`` together; what each got back or raised."""
    barrier = threading.Barrier(THREADS)
    results: list[object] = [None] * THREADS

    def one(i: int) -> None:
        client = client_for(standin)
        barrier.wait(10)
        try:
            results[i] = client.users()
        except CrmError as exc:
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_sixteen_threads_on_an_expired_session_log_in_once(salesforce_standin):
    client_for(salesforce_standin).users()
    assert len(salesforce_standin.token_grants) == 1
    salesforce_standin.expire_tokens()
    salesforce_standin.set_login_delay(0.3)  # long enough for every thread to see the 401

    results = _all_at_once(salesforce_standin)

    assert all(isinstance(r, list) and r for r in results), results
    assert len(salesforce_standin.token_grants) == 2  # the first login, then one refresh
    logins = [r for r in salesforce_standin.requests if r.path == "/services/oauth2/token"]
    assert len(logins) == 2


def test_sixteen_threads_with_no_token_yet_log_in_once(salesforce_standin):
    salesforce_standin.set_login_delay(0.3)
    results = _all_at_once(salesforce_standin)
    assert all(isinstance(r, list) and r for r in results), results
    assert len(salesforce_standin.token_grants) == 1


def test_a_failed_login_is_not_shared_by_the_waiters_for_ever(salesforce_standin):
    """The login that fails raises for its caller; the next caller tries again itself."""
    salesforce_standin.fail_next(1, status=503)
    with pytest.raises(CrmError) as caught:
        client_for(salesforce_standin).users()
    assert caught.value.kind == "unavailable"
    assert client_for(salesforce_standin).users()
    assert len(salesforce_standin.token_grants) == 1


@pytest.mark.parametrize("odd", ["²", "١٢٠", "3600.5", "-5", "", "1e9", [3600], None])
def test_an_odd_expires_in_in_the_token_answer_falls_back_to_the_session_lifetime(
    salesforce_standin, odd
):
    """Salesforce's answer has no ``expires_in``; a proxy or a future version may add one in
    any shape. A superscript digit passed ``str.isdigit()`` and then broke ``float()``: the
    login raised ValueError instead of answering."""
    salesforce_standin.add_to_token_answer(expires_in=odd)
    assert client_for(salesforce_standin).users()
    assert client_for(salesforce_standin).users()  # the token was cached: one login
    assert len(salesforce_standin.token_grants) == 1


def test_a_short_expires_in_is_honoured(salesforce_standin):
    salesforce_standin.add_to_token_answer(expires_in=0)
    client_for(salesforce_standin).users()
    client_for(salesforce_standin).users()  # expired at once (80% of 0 s): logs in again
    assert len(salesforce_standin.token_grants) == 2
