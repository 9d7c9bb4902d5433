"""``routing.crm.hubspot`` through ``hubspot-api-client`` against the HubSpot stand-in: what it
asks, what it makes of the answers, and each way HubSpot can fail (expired or under-scoped
token, 429 with and without Retry-After, 5xx, an HTML page, a slow answer, a refused
connection)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest

from routing.crm.base import CrmError, CrmSettings, PersonUpdate
from routing.crm.hubspot import HubSpotClient, clear_account_cache
from tests.support.crm_hubspot import HubSpotStandIn, hubspot_standin

__all__ = ["hubspot_standin"]

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)  # HubSpot keeps milliseconds
HOUR = dt.timedelta(hours=1)


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    clear_account_cache()
    yield
    clear_account_cache()


class Spend:
    def __init__(self) -> None:
        self.n = 0
        self.refuse = False

    def __call__(self, n: int) -> None:
        if self.refuse:
            raise CrmError("rate_limited", "our shared limit", retry_after=2.0)
        self.n += n


@pytest.fixture
def spend() -> Spend:
    return Spend()


def client_for(
    hs: HubSpotStandIn, spend: Spend | None = None, *, token: str = "", timeout: float = 3.0
) -> HubSpotClient:
    return HubSpotClient(
        CrmSettings(
            kind="hubspot",
            base_url=hs.url,
            secret=token or hs.token,
            timeout_seconds=timeout,
            ca_bundle=hs.ca_file,
            spend=spend or (lambda n: None),
            connection_id=1,
        )
    )


@pytest.fixture
def hs(hubspot_standin: HubSpotStandIn) -> HubSpotStandIn:
    return hubspot_standin


def test_check_probes_what_the_stages_read_and_names_each_missing_scope(hs):
    """A private app without the companies scope answers 403 MISSING_SCOPES on the company
    search only: the check makes that call too and says which scope is missing."""
    client_for(hs).check()
    assert [p for p in hs.paths() if "/objects/" in p] == [
        "/crm/v3/objects/contacts/search",
        "/crm/v3/objects/companies/search",
    ]
    assert all(r.body.get("limit") == 1 for r in hs.requests if r.path.endswith("/search"))
    hs.revoke_scope("crm.objects.companies.read")
    with pytest.raises(CrmError) as caught:
        client_for(hs).check()
    assert (caught.value.kind, caught.value.status) == ("auth", 403)
    assert "crm.objects.companies.read" in str(caught.value)
    assert "contacts" not in str(caught.value)
    hs.revoke_scope("crm.objects.contacts.read")
    with pytest.raises(CrmError) as caught:
        client_for(hs).check()
    assert "crm.objects.contacts.read" in str(caught.value)
    assert "crm.objects.companies.read" in str(caught.value)


def test_check_says_which_portal_and_sends_the_token_only_as_a_bearer_header(hs, spend):
    client = client_for(hs, spend)
    said = client.check()
    assert said.startswith("HubSpot: private app token accepted (portal ")
    assert hs.token not in said
    assert spend.n == len(hs.requests) >= 1  # one rate-limit token per HTTP request
    assert all(hs.token not in repr(r) for r in hs.requests)


def test_a_person_is_found_by_email_case_insensitively_most_recently_modified_first(hs):
    ana = hs.add_owner("ana@example.com", "Ana", "A")
    hs.add_contact(email="pat@acme.com", hubspot_owner_id=ana, hs_lead_status="NEW")
    client = client_for(hs)
    person = client.find_person("  Pat@ACME.com ")
    assert person is not None
    assert (person.object, person.email, person.owner_id, person.status) == (
        "contact",
        "pat@acme.com",
        ana,
        "NEW",
    )
    assert person.owner_changed_at is not None  # HubSpot stamps hubspot_owner_assigneddate
    assert person.modified_at is not None
    assert person.url.endswith(f"/record/0-1/{person.id}")
    assert person.url.startswith("https://")
    assert client.find_person("nobody@acme.com") is None
    assert client.find_person("not an email") is None


def test_a_person_is_found_by_an_additional_email(hs):
    contact = hs.add_contact(email="pat@old.com", hs_additional_emails="pat@acme.com;p@x.io")
    person = client_for(hs).find_person("pat@acme.com")
    assert person is not None
    assert person.id == contact


def test_the_most_recently_modified_of_two_contacts_wins(hs):
    first = hs.add_contact(email="pat@old.com", hs_additional_emails="pat@acme.com")
    second = hs.add_contact(email="pat@acme.com")
    hs.edit_contact(first, jobtitle="CTO")  # modified after the second one
    person = client_for(hs).find_person("pat@acme.com")
    assert person is not None
    assert person.id == first
    assert second != first


def test_a_company_is_found_by_domain_with_or_without_www(hs):
    ben = hs.add_owner("ben@example.com", "Ben", "B")
    acme = hs.add_company(name="Acme", domain="www.acme.com", hubspot_owner_id=ben)
    client = client_for(hs)
    company = client.find_company("https://Acme.com/pricing")
    assert company is not None
    assert (company.object, company.id, company.name, company.owner_id, company.domain) == (
        "company",
        acme,
        "Acme",
        ben,
        "acme.com",
    )
    assert client.find_company("other.com") is None
    assert client.find_company("") is None


def test_get_person_is_none_for_a_deleted_contact_and_refuses_a_foreign_id(hs):
    contact = hs.add_contact(email="gone@acme.com")
    client = client_for(hs)
    assert client.get_person(contact) is not None
    hs.delete_contact(contact)
    assert client.get_person(contact) is None
    with pytest.raises(CrmError) as info:
        client.get_person("00Q5e000000abcdEAA")
    assert info.value.kind == "rejected"


def test_write_back_creates_a_contact_with_the_owner_and_the_lead_fields(hs):
    ana = hs.add_owner("ana@example.com")
    update = PersonUpdate(
        owner_id=ana,
        email="new@acme.com",
        fields={"first_name": "Nia", "last_name": "New", "company": "Acme", "title": "VP"},
    )
    result = client_for(hs).write_owner(update, known_owner_id="")
    assert result.outcome == "created"
    stored = hs.contact(result.person.id)
    assert stored is not None
    assert stored["hubspot_owner_id"] == ana
    assert (stored["firstname"], stored["lastname"], stored["jobtitle"]) == ("Nia", "New", "VP")
    assert stored["email"] == "new@acme.com"


def test_write_back_updates_the_known_contact_and_is_safe_to_repeat(hs):
    ana, ben = hs.add_owner("ana@example.com"), hs.add_owner("ben@example.com")
    contact = hs.add_contact(email="pat@acme.com", hubspot_owner_id=ana)
    client = client_for(hs)
    update = PersonUpdate(owner_id=ben, email="pat@acme.com", person_id=contact)
    assert client.write_owner(update, known_owner_id=ana).outcome == "updated"
    assert hs.contact(contact)["hubspot_owner_id"] == ben
    hs.reset_log()
    again = client.write_owner(update, known_owner_id=ben)
    assert again.outcome == "updated"
    assert [r.method for r in hs.requests] == ["GET"]  # already right: nothing patched


def test_an_owner_changed_in_hubspot_after_our_write_is_kept(hs):
    ana, ben, ops = (hs.add_owner(f"{n}@example.com") for n in ("ana", "ben", "ops"))
    contact = hs.add_contact(email="pat@acme.com", hubspot_owner_id=ana)
    client = client_for(hs)
    update = PersonUpdate(owner_id=ben, email="pat@acme.com", person_id=contact)
    # We wrote ana before, and someone moved it to ops in HubSpot: kept, whatever the time.
    hs.edit_contact(contact, hubspot_owner_id=ops)
    kept = client.write_owner(update, known_owner_id=ana)
    assert kept.outcome == "kept"
    assert kept.person.owner_id == ops
    assert hs.contact(contact)["hubspot_owner_id"] == ops
    assert "PATCH" not in [r.method for r in hs.requests]


def test_an_owner_hubspot_had_before_the_assignment_is_kept_when_the_lookup_did_not_see_it(hs):
    """The lookup failed or timed out (no owner known): an owner set in HubSpot long before our
    assignment is HubSpot's all the same, and is not overwritten (review finding B5)."""
    ana, ben = hs.add_owner("ana@example.com"), hs.add_owner("ben@example.com")
    hs.add_contact(email="pat@acme.com", hubspot_owner_id=ana)  # owned since before
    update = PersonUpdate(owner_id=ben, email="pat@acme.com")
    kept = client_for(hs).write_owner(update, known_owner_id="")
    assert kept.outcome == "kept"
    assert kept.person.owner_id == ana
    assert kept.person.owner_changed_at is not None
    assert "PATCH" not in [r.method for r in hs.requests]
    # A contact nobody owns is ours to write.
    free = hs.add_contact(email="free@acme.com")
    update = PersonUpdate(owner_id=ben, email="free@acme.com")
    assert client_for(hs).write_owner(update, known_owner_id="").outcome == "updated"
    assert hs.contact(free)["hubspot_owner_id"] == ben


def test_before_write_is_called_before_the_patch_and_can_stop_it(hs):
    ana, ben = hs.add_owner("ana@example.com"), hs.add_owner("ben@example.com")
    contact = hs.add_contact(email="pat@acme.com", hubspot_owner_id=ana)
    update = PersonUpdate(owner_id=ben, email="pat@acme.com", person_id=contact)

    class Superseded(Exception):
        pass

    def stop() -> None:
        raise Superseded

    with pytest.raises(Superseded):
        client_for(hs).write_owner(update, known_owner_id=ana, before_write=stop)
    assert "PATCH" not in [r.method for r in hs.requests]
    assert hs.contact(contact)["hubspot_owner_id"] == ana


def test_a_create_that_conflicts_updates_the_existing_contact(hs):
    """Search is eventually consistent: a contact created a moment ago is not found yet, and
    the create answers 409 'Existing ID: N'; the write goes to N, and no duplicate is made."""
    ana = hs.add_owner("ana@example.com")
    contact = hs.add_contact(email="pat@acme.com")
    hs.respond_next({"total": 0, "results": []})  # the search has not indexed it yet
    update = PersonUpdate(owner_id=ana, email="pat@acme.com")
    result = client_for(hs).write_owner(update, known_owner_id="")
    assert result.outcome == "updated"
    assert result.person.id == contact
    assert hs.contact(contact)["hubspot_owner_id"] == ana
    creates = [r for r in hs.requests if r.method == "POST" and r.path.endswith("/contacts")]
    assert len(creates) == 1


def test_write_back_to_an_owner_hubspot_does_not_know_is_rejected(hs):
    contact = hs.add_contact(email="pat@acme.com")
    update = PersonUpdate(owner_id="123456", email="pat@acme.com", person_id=contact)
    with pytest.raises(CrmError) as info:
        client_for(hs).write_owner(update, known_owner_id="")
    assert info.value.kind == "rejected"
    assert info.value.status == 400


def test_activity_reports_the_first_touch_after_the_assignment_and_leaves_out_the_deleted(hs):
    ana = hs.add_owner("ana@example.com")
    since = NOW - HOUR
    touched = hs.add_contact(
        email="a@acme.com",
        hubspot_owner_id=ana,
        hs_lead_status="IN_PROGRESS",
        notes_last_contacted=(since + dt.timedelta(minutes=20)).isoformat(),
        hs_last_sales_activity_timestamp=(since + dt.timedelta(minutes=5)).isoformat(),
    )
    before = hs.add_contact(email="b@acme.com", notes_last_contacted=(since - HOUR).isoformat())
    gone = hs.add_contact(email="c@acme.com")
    hs.delete_contact(gone)
    found = client_for(hs).activity(
        [("contact", touched), ("contact", before), ("contact", gone), ("Lead", "00Q")], since
    )
    by_id = {a.person_id: a for a in found}
    assert set(by_id) == {touched, before}
    first = by_id[touched]
    assert first.touched_at == since + dt.timedelta(minutes=5)
    assert first.touch_kind == "hs_last_sales_activity_timestamp"
    assert (first.owner_id, first.status) == (ana, "IN_PROGRESS")
    assert first.owner_changed_at is not None
    assert by_id[before].touched_at is None


def test_users_reads_every_page_of_active_and_archived_owners(hs):
    for i in range(503):
        hs.add_owner(f"rep{i}@example.com", f"Rep{i}", "X")
    gone = hs.add_owner("gone@example.com", "Gone", "G", archived=True)
    users = client_for(hs).users()
    assert len(users) == 504
    by_id = {u.id: u for u in users}
    assert by_id[gone].active is False
    assert by_id[gone].email == "gone@example.com"
    assert sum(u.active for u in users) == 503
    assert by_id[users[0].id].name == "Rep0 X"


@pytest.mark.parametrize(
    ("break_it", "kind", "status"),
    [
        (lambda hs: hs.expire_tokens(), "auth", 401),
        (lambda hs: hs.revoke_scope(), "auth", 403),
        (lambda hs: hs.fail_next(1, 503), "unavailable", 503),
        (lambda hs: hs.fail_next(1, 502), "unavailable", 502),
        (lambda hs: hs.garbage_next(1), "malformed", None),
    ],
    ids=["expired-token", "missing-scope", "503", "502-html", "garbage-200"],
)
def test_each_failure_is_a_crm_error_of_its_kind_without_the_token(hs, break_it, kind, status):
    hs.add_contact(email="pat@acme.com")
    client = client_for(hs)
    break_it(hs)
    with pytest.raises(CrmError) as info:
        client.find_person("pat@acme.com")
    assert info.value.kind == kind, str(info.value)
    if status is not None:
        assert info.value.status == status
    assert hs.token not in str(info.value)


def test_a_429_is_rate_limited_with_hubspots_retry_after_or_a_default(hs):
    client = client_for(hs)
    hs.limit_next(1, retry_after=7)
    with pytest.raises(CrmError) as info:
        client.find_person("pat@acme.com")
    assert (info.value.kind, info.value.status, info.value.retry_after) == ("rate_limited", 429, 7)
    # HubSpot sends no Retry-After on a 429: the policy it names says how long its window is.
    for policy, seconds in (("SECONDLY", 1.0), ("TEN_SECONDLY_ROLLING", 10.0), ("DAILY", 3600.0)):
        hs.limit_next(1, retry_after=None, policy=policy)
        with pytest.raises(CrmError) as info:
            client.find_person("pat@acme.com")
        assert info.value.kind == "rate_limited"
        assert info.value.retry_after == seconds, policy


def test_a_slow_or_unreachable_hubspot_is_unavailable_and_not_retried_behind_our_back(hs, spend):
    client = client_for(hs, spend, timeout=0.5)
    hs.set_delay(1.5)
    with pytest.raises(CrmError) as info:
        client.find_person("pat@acme.com")
    assert info.value.kind == "unavailable"
    hs.set_delay(0)
    hs.down()
    try:
        with pytest.raises(CrmError) as info:
            client.find_person("pat@acme.com")
        assert info.value.kind == "unavailable"
    finally:
        hs.up()
    assert spend.n == 2  # one request each: the library's own retries are off


def test_our_shared_limit_stops_the_call_before_any_request(hs, spend):
    spend.refuse = True
    with pytest.raises(CrmError) as info:
        client_for(hs, spend).find_person("pat@acme.com")
    assert info.value.kind == "rate_limited"
    assert info.value.status is None
    assert hs.requests == []


def test_an_empty_token_is_a_config_error():
    with pytest.raises(CrmError) as info:
        HubSpotClient(CrmSettings(kind="hubspot", base_url="https://127.0.0.1:9", secret=" "))
    assert info.value.kind == "config"


def test_a_wrong_token_is_refused(hs):
    with pytest.raises(CrmError) as info:
        client_for(hs, token="pat-na1-00000000-0000-0000-0000-000000000000").check()
    assert info.value.kind == "auth"
    assert info.value.status == 401


def _dump(value: Any) -> str:
    return repr(value)
