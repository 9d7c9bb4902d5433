"""Built-in providers: account matching, e-mail report, country from phone; fill-empty merge."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from leads.models import Lead
from leads.services import lead_apply_normalization
from routing.enrichment import ProviderResult, enrichment_builtin, enrichment_event_data
from routing.enrichment.merge import fill_empty, merge_empty
from tests.leads.factories import LeadFactory, SourceFactory
from tests.routing.factories import AccountFactory


def normalised(payload: dict[str, Any]) -> Lead:
    """An unsaved lead normalised from ``payload``, as the pipeline has it before enriching."""
    lead = LeadFactory.build(source=SourceFactory.build(field_map={}), raw_payload=payload)
    return lead_apply_normalization(lead=lead)


def by_name(results: list[ProviderResult]) -> dict[str, ProviderResult]:
    return {r.name: r for r in results}


@pytest.mark.django_db
def test_a_subdomain_e_mail_matches_the_parent_account_and_fills_the_empty_company(
    django_assert_max_num_queries,
):
    account = AccountFactory(domain="acme.com", name="Acme Corp")
    AccountFactory(domain="other.com", name="Other")
    lead = normalised({"email": "ana@eu.sales.acme.com"})
    assert lead.company == ""
    with django_assert_max_num_queries(2):
        results = by_name(enrichment_builtin(lead))
    assert results["account"].status == "done"
    assert results["account"].filled == ["company"]
    assert lead.company == "Acme Corp"
    assert lead.enrichment["account"] == {
        "status": "done",
        "filled": ["company"],
        "data": {
            "account_id": account.id,
            "account_name": "Acme Corp",
            "account_domain": "acme.com",
            "matched_domain": "eu.sales.acme.com",
        },
    }
    assert "acme.com" in results["account"].summary


@pytest.mark.django_db
def test_the_most_specific_account_wins_and_the_company_domain_beats_the_e_mail():
    AccountFactory(domain="acme.com", name="Acme")
    AccountFactory(domain="eu.acme.com", name="Acme Europe")
    lead = normalised({"email": "ana@unrelated.io", "website": "https://shop.eu.acme.com/x"})
    result = by_name(enrichment_builtin(lead))["account"]
    assert result.data["account_name"] == "Acme Europe"
    assert result.data["matched_domain"] == "shop.eu.acme.com"


@pytest.mark.django_db
@pytest.mark.parametrize("email", ["ana@gmail.com", "ana@mailinator.com"])
def test_free_mail_and_disposable_addresses_are_not_matched_to_an_account(email):
    AccountFactory(domain=email.partition("@")[2], name="Should not match")
    lead = normalised({"email": email})
    results = by_name(enrichment_builtin(lead))
    assert results["account"].status == "skipped"
    assert lead.company == ""
    assert results["email"].data["free"] or results["email"].data["disposable"]


@pytest.mark.django_db
def test_an_existing_company_is_never_overwritten():
    AccountFactory(domain="acme.com", name="Acme Corp")
    lead = normalised({"email": "ana@acme.com", "company": "ACME Germany GmbH"})
    result = by_name(enrichment_builtin(lead))["account"]
    assert result.status == "done"
    assert result.filled == []
    assert lead.company == "ACME Germany GmbH"


@pytest.mark.django_db
def test_no_account_is_a_no_match_and_nothing_is_filled():
    lead = normalised({"email": "ana@nobody.example"})
    result = by_name(enrichment_builtin(lead))["account"]
    assert (result.status, result.filled, lead.company) == ("no_match", [], "")


@pytest.mark.django_db
def test_geo_fills_an_empty_country_from_the_phone_only():
    lead = normalised({"email": "a@b.example", "phone": "+49 30 901820"})
    assert lead.country == ""
    result = by_name(enrichment_builtin(lead))["geo"]
    assert (result.status, result.filled, lead.country) == ("done", ["country"], "DE")

    given_country = normalised({"email": "a@b.example", "phone": "+49 30 901820", "country": "FR"})
    enrichment_builtin(given_country)
    assert given_country.country == "FR"


@pytest.mark.django_db
def test_only_the_configured_providers_run_in_order_and_the_event_data_sums_them_up(settings):
    settings.ENRICHMENT_PROVIDERS = ["geo", "nonsense", "http", "account"]
    AccountFactory(domain="acme.com", name="Acme Corp")
    lead = normalised({"email": "ana@acme.com", "phone": "+33 1 42 68 53 00"})
    results = enrichment_builtin(lead)
    assert [r.name for r in results] == ["geo", "account"]
    assert set(lead.enrichment) == {"geo", "account"}
    data = enrichment_event_data(results)
    assert data["filled"] == ["company", "country"]
    assert data["providers"]["account"] == {"status": "done", "filled": ["company"]}


# --- the fill-empty merge, as a property ------------------------------------------------------

FIELDS = ["company", "industry", "country", "employees", "city"]
values = st.one_of(st.none(), st.just(""), st.text(max_size=5), st.integers(0, 10))
records = st.dictionaries(st.sampled_from(FIELDS), values)


@hypothesis_settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(current=records, incoming=records)
def test_merge_fills_exactly_the_empty_fields_and_never_overwrites(current, incoming):
    fills = merge_empty(current, incoming)
    merged = {**current, **fills}
    for name in FIELDS:
        before, offered = current.get(name), incoming.get(name)
        if before not in (None, ""):
            assert merged[name] == before  # never overwritten
        elif offered not in (None, ""):
            assert merged[name] == offered  # an empty field takes what was offered
        else:
            assert name not in fills  # nothing from nothing
    assert merge_empty(merged, incoming) == {}  # applying it again changes nothing


@hypothesis_settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(incoming=records)
def test_fill_empty_on_a_lead_matches_the_pure_merge(incoming):
    lead = Lead(company="Kept", industry="", country="", employees=None, city="Berlin")
    before = {name: getattr(lead, name) for name in FIELDS}
    filled = fill_empty(lead, incoming)
    assert set(filled) == set(merge_empty(before, incoming))
    assert lead.company == "Kept"
    assert lead.city == "Berlin"
