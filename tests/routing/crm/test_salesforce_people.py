"""Write-back to the right Salesforce person: a converted Lead's Contact, the record a duplicate
rule matched, the Contact before the Lead (review of issue 17, findings 4, 5 and 7). Through
simple-salesforce's real HTTP against the stand-in org."""

from __future__ import annotations

import pytest

from routing.crm.base import CrmError, PersonUpdate
from tests.routing.crm.test_salesforce import _no_cached_tokens, client_for
from tests.support.crm_salesforce import salesforce_standin

__all__ = ["_no_cached_tokens", "salesforce_standin"]

EXT = "LeadRouter_Id__c"


def _patches(standin):
    writes = [r for r in standin.requests if r.method == "PATCH"]
    return [(r.path.split("/sobjects/")[1], r.body) for r in writes]


# -- finding 4: a converted Lead -----------------------------------------------------------


def test_the_standin_refuses_a_patch_of_a_converted_lead_as_salesforce_does(salesforce_standin):
    rep = salesforce_standin.add_user(email="rep@acme.example")
    lead = salesforce_standin.add_lead(Email="c@x.com", LastName="C", Company="X")
    contact = salesforce_standin.convert_lead(lead)
    stored = salesforce_standin.record("Lead", lead)
    assert (stored["IsConverted"], stored["ConvertedContactId"]) == (True, contact)
    assert salesforce_standin.record("Contact", contact)["Email"] == "c@x.com"
    client = client_for(salesforce_standin)
    with pytest.raises(CrmError) as info:
        client._call(lambda sf: sf.Lead.update(lead, {"OwnerId": rep}))
    assert "CANNOT_UPDATE_CONVERTED_LEAD" in str(info.value)


def test_a_known_lead_converted_since_gets_its_owner_on_the_contact(salesforce_standin):
    ours = salesforce_standin.add_user(email="ours@acme.example")
    new = salesforce_standin.add_user(email="new@acme.example")
    lead = salesforce_standin.add_lead(Email="v@x.com", LastName="V", Company="X", OwnerId=ours)
    contact = salesforce_standin.convert_lead(lead)  # the Contact keeps the Lead's owner
    update = PersonUpdate(owner_id=new, email="v@x.com", person_id=lead, person_object="Lead")
    result = client_for(salesforce_standin).write_owner(update, known_owner_id=ours)
    assert (result.outcome, result.person.object, result.person.id) == (
        "updated",
        "Contact",
        contact,
    )
    assert salesforce_standin.record("Contact", contact)["OwnerId"] == new
    assert _patches(salesforce_standin) == [(f"Contact/{contact}", {"OwnerId": new})]
    read = [r for r in salesforce_standin.requests if r.method == "GET" and "/Lead/" in r.path]
    assert "IsConverted" in read[0].query["fields"][0]
    assert "ConvertedContactId" in read[0].query["fields"][0]


def test_a_converted_contact_owned_in_the_crm_is_kept(salesforce_standin):
    ours = salesforce_standin.add_user(email="ours@acme.example")
    theirs = salesforce_standin.add_user(email="theirs@acme.example")
    new = salesforce_standin.add_user(email="new@acme.example")
    lead = salesforce_standin.add_lead(Email="w@x.com", LastName="W", Company="X", OwnerId=ours)
    contact = salesforce_standin.convert_lead(lead, OwnerId=theirs)
    update = PersonUpdate(owner_id=new, email="w@x.com", person_id=lead, person_object="Lead")
    result = client_for(salesforce_standin).write_owner(update, known_owner_id=ours)
    assert (result.outcome, result.person.id, result.person.owner_id) == ("kept", contact, theirs)
    assert salesforce_standin.record("Contact", contact)["OwnerId"] == theirs
    assert _patches(salesforce_standin) == []


# -- finding 5: a duplicate rule blocks the create -----------------------------------------


@pytest.mark.parametrize("external", [False, True])
def test_a_duplicate_rule_match_is_the_person_and_nothing_is_created(salesforce_standin, external):
    """The lookup did not see the Lead (another e-mail); the duplicate rule matches it by name
    and company: that Lead gets the owner, no second Lead is made."""
    ours = salesforce_standin.add_user(email="ours@acme.example")
    new = salesforce_standin.add_user(email="new@acme.example")
    lead = salesforce_standin.add_lead(
        Email="old@x.com", FirstName="Dee", LastName="Dup", Company="X", OwnerId=ours
    )
    salesforce_standin.lead_duplicate_rule(True)
    options = {"external_id_field": EXT} if external else {}
    if external:
        salesforce_standin.add_external_id_field(EXT)
    update = PersonUpdate(
        owner_id=new,
        email="new@x.com",
        external_id="lead-50",
        fields={"first_name": "Dee", "last_name": "Dup", "company": "X"},
    )
    result = client_for(salesforce_standin, **options).write_owner(update, known_owner_id=ours)
    assert (result.outcome, result.person.object, result.person.id) == ("updated", "Lead", lead)
    assert salesforce_standin.record("Lead", lead)["OwnerId"] == new
    assert len(salesforce_standin.records["Lead"]) == 1
    body = {"OwnerId": new, EXT: "lead-50"} if external else {"OwnerId": new}
    assert _patches(salesforce_standin)[-1] == (f"Lead/{lead}", body)


def test_a_duplicate_rule_match_owned_in_the_crm_is_kept(salesforce_standin):
    theirs = salesforce_standin.add_user(email="theirs@acme.example")
    new = salesforce_standin.add_user(email="new@acme.example")
    lead = salesforce_standin.add_lead(
        Email="o@x.com", FirstName="Ola", LastName="Own", Company="Y", OwnerId=theirs
    )
    salesforce_standin.lead_duplicate_rule(True)
    update = PersonUpdate(
        owner_id=new,
        email="other@x.com",
        fields={"first_name": "Ola", "last_name": "Own", "company": "Y"},
    )
    result = client_for(salesforce_standin).write_owner(update, known_owner_id="")
    assert (result.outcome, result.person.id, result.person.owner_id) == ("kept", lead, theirs)
    assert salesforce_standin.record("Lead", lead)["OwnerId"] == theirs
    assert len(salesforce_standin.records["Lead"]) == 1


def test_a_duplicate_without_a_usable_match_names_the_rule(salesforce_standin):
    new = salesforce_standin.add_user(email="new@acme.example")
    body = [
        {
            "duplicateResult": {
                "allowSave": False,
                "duplicateRule": "Standard_Lead_Duplicate_Rule",
                "duplicateRuleEntityType": "Lead",
                "errorMessage": "Use one of these records?",
                "matchResults": [],
            },
            "errorCode": "DUPLICATES_DETECTED",
            "fields": [],
            "message": "Use one of these records?",
        }
    ]
    client = client_for(salesforce_standin)
    update = PersonUpdate(owner_id=new, email="n@x.com")
    client.find_person("n@x.com")  # the token and the lookup's queries first
    salesforce_standin.respond_next(body, status=400, n=3)
    with pytest.raises(CrmError) as info:
        client._create(update)
    assert info.value.kind == "rejected"
    assert "Standard_Lead_Duplicate_Rule" in str(info.value)
    assert "duplicate rule" in str(info.value)


# -- finding 7: the Contact before the Lead, on both paths ---------------------------------


def test_the_upsert_path_picks_the_contact_before_the_lead(salesforce_standin):
    salesforce_standin.add_external_id_field(EXT)
    theirs = salesforce_standin.add_user(email="theirs@acme.example")
    new = salesforce_standin.add_user(email="new@acme.example")
    contact = salesforce_standin.add_contact(Email="b@x.com", LastName="B", OwnerId=theirs)
    lead = salesforce_standin.add_lead(Email="b@x.com", LastName="B", Company="X")
    update = PersonUpdate(owner_id=new, email="b@x.com", external_id="lead-60")
    client = client_for(salesforce_standin, external_id_field=EXT)
    found = client.find_person("b@x.com")
    result = client.write_owner(update, known_owner_id="")  # the lookup failed: no owner known
    assert found is not None
    assert found.id == contact
    assert (result.outcome, result.person.object, result.person.id) == ("kept", "Contact", contact)
    assert salesforce_standin.record("Lead", lead)["OwnerId"] != new
    assert _patches(salesforce_standin) == []


def test_a_lead_converted_between_the_read_and_the_write_gets_the_owner_on_the_contact(
    salesforce_standin,
):
    ours = salesforce_standin.add_user(email="ours@acme.example")
    new = salesforce_standin.add_user(email="new@acme.example")
    lead = salesforce_standin.add_lead(Email="z@x.com", LastName="Z", Company="X", OwnerId=ours)
    made: list[str] = []

    def convert_now() -> None:  # a user converts the Lead right before our PATCH
        if not made:
            made.append(salesforce_standin.convert_lead(lead))

    update = PersonUpdate(owner_id=new, email="z@x.com", person_id=lead, person_object="Lead")
    result = client_for(salesforce_standin).write_owner(
        update, known_owner_id=ours, before_write=convert_now
    )
    assert (result.outcome, result.person.object, result.person.id) == (
        "updated",
        "Contact",
        made[0],
    )
    assert salesforce_standin.record("Contact", made[0])["OwnerId"] == new
