"""The stand-ins themselves: they answer as fast as the client can ask (no Nagle delay), and the
HubSpot one enforces the search limit HubSpot documents, so the tests and bench.crm measure our
client and our pace, not the stand-in."""

from __future__ import annotations

import statistics
import time

import requests

from tests.support.crm_hubspot import HubSpotStandIn, hubspot_standin
from tests.support.crm_salesforce import SalesforceStandIn, salesforce_standin

__all__ = ["hubspot_standin", "salesforce_standin"]


def _median_answer_seconds(session: requests.Session, url: str, **kwargs: object) -> float:
    session.get(url, **kwargs)  # the connection (and TLS) set up once, then kept alive
    times = []
    for _ in range(8):
        started = time.perf_counter()
        answer = session.get(url, **kwargs)
        times.append(time.perf_counter() - started)
        assert answer.status_code in (200, 401), answer.text
    return statistics.median(times)


def test_the_hubspot_standin_answers_without_nagles_delay(hubspot_standin: HubSpotStandIn):
    """Headers and body go in two sends; with Nagle's algorithm on, the body waits for the
    client's delayed ACK (~40 ms on Linux) on every kept-alive answer."""
    hs = hubspot_standin
    with requests.Session() as session:
        seconds = _median_answer_seconds(
            session,
            f"{hs.url}/account-info/v3/details",
            headers={"Authorization": f"Bearer {hs.token}"},
            verify=hs.ca_file,
        )
    assert seconds < 0.025, f"median answer {seconds * 1000:.1f} ms"


def test_the_salesforce_standin_answers_without_nagles_delay(
    salesforce_standin: SalesforceStandIn,
):
    sf = salesforce_standin
    with requests.Session() as session:
        seconds = _median_answer_seconds(
            session,
            f"{sf.url}/services/data/v62.0/query",
            params={"q": "SELECT Id FROM User LIMIT 1"},
            headers={"Authorization": "Bearer not-a-token"},  # 401: an answer all the same
            verify=sf.ca_file,
        )
    assert seconds < 0.025, f"median answer {seconds * 1000:.1f} ms"


def test_the_hubspot_standin_enforces_five_searches_a_second():
    """HubSpot: "the search endpoints are rate limited to five requests per second" per account,
    answered 429 with policyName SECONDLY and no Retry-After (API usage guidelines)."""
    hs = HubSpotStandIn(enforce_rate_limits=True).start()
    try:
        url = f"{hs.url}/crm/v3/objects/contacts/search"
        auth = {"Authorization": f"Bearer {hs.token}", "Content-Type": "application/json"}
        body = {"filterGroups": [], "limit": 1}
        with requests.Session() as session:
            started = time.monotonic()
            statuses = [
                session.post(url, json=body, headers=auth, verify=hs.ca_file) for _ in range(6)
            ]
            assert time.monotonic() - started < 1.0  # the six within one second
            assert [r.status_code for r in statuses] == [200] * 5 + [429]
            limited = statuses[-1]
            assert limited.json()["policyName"] == "SECONDLY"
            assert "Retry-After" not in limited.headers
            time.sleep(1.05)  # the window has passed
            assert session.post(url, json=body, headers=auth, verify=hs.ca_file).status_code == 200
    finally:
        hs.close()
