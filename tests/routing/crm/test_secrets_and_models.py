"""CRM credentials at rest, the connection's validation, and the roster mirror."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from routing.crm.base import CrmUser, domain_of
from routing.crm.models import CrmConnection, CrmOwner
from routing.crm.roster import owner_reps, rep_owner_id, roster_apply
from routing.crm.secrets import (
    SecretUnreadable,
    new_key,
    secret_hint,
    secret_open,
    secret_reseal,
    secret_seal,
)
from routing.models import Rep
from tests.routing.factories import RepFactory

pytestmark = pytest.mark.django_db

TOKEN = "pat-eu1-0a1b2c3d-4e5f-6789-abcd-ef0123456789"


def test_a_credential_is_stored_encrypted_and_opens_again():
    stored = secret_seal(TOKEN)
    assert stored.startswith("fernet:")
    assert TOKEN not in stored
    assert secret_open(stored) == TOKEN
    assert secret_seal("") == ""
    assert secret_open("") == ""


def test_a_credential_sealed_under_another_key_is_unreadable_not_garbage(settings):
    settings.CRM_SECRET_KEYS = [new_key()]
    stored = secret_seal(TOKEN)
    settings.CRM_SECRET_KEYS = [new_key()]
    with pytest.raises(SecretUnreadable) as caught:
        secret_open(stored)
    assert TOKEN not in str(caught.value)
    with pytest.raises(SecretUnreadable):
        secret_open("plain text that was never sealed")


def test_key_rotation_reseals_under_the_new_key(settings):
    old = new_key()
    settings.CRM_SECRET_KEYS = [old]
    stored = secret_seal(TOKEN)
    new = new_key()
    settings.CRM_SECRET_KEYS = [new, old]
    resealed = secret_reseal(stored)
    settings.CRM_SECRET_KEYS = [new]
    assert secret_open(resealed) == TOKEN
    with pytest.raises(SecretUnreadable):
        secret_open(stored)


def test_a_bad_configured_key_is_a_clear_error(settings):
    settings.CRM_SECRET_KEYS = ["not-a-fernet-key"]
    with pytest.raises(SecretUnreadable, match="not a Fernet key"):
        secret_seal(TOKEN)


def test_the_hint_shows_the_length_and_tail_only():
    hint = secret_hint(TOKEN)
    assert hint == f"{len(TOKEN)} characters, ending …6789"
    assert secret_hint("short") == "5 characters"


def test_one_active_connection_per_kind():
    CrmConnection.objects.create(kind="hubspot", name="HubSpot")
    CrmConnection.objects.create(kind="hubspot", name="Old HubSpot", active=False)
    with transaction.atomic(), pytest.raises(IntegrityError):
        CrmConnection.objects.create(kind="hubspot", name="Second HubSpot")
    CrmConnection.objects.create(
        kind="salesforce", name="SF", base_url="https://acme.my.salesforce.com"
    )


@pytest.mark.parametrize(
    ("fields", "error_field"),
    [
        ({"base_url": "http://acme.my.salesforce.com"}, "base_url"),
        ({"base_url": "https://login.salesforce.com"}, "base_url"),
        ({"auth_flow": ""}, "auth_flow"),
        ({"client_id": " "}, "client_id"),
        ({"auth_flow": "jwt_bearer", "username": ""}, "username"),
        ({"api_version": "v62"}, "api_version"),
    ],
)
def test_a_salesforce_connection_says_what_is_missing(fields, error_field):
    values = {
        "kind": "salesforce",
        "name": "SF",
        "base_url": "https://acme.my.salesforce.com",
        "auth_flow": "client_credentials",
        "client_id": "3MVG9-consumer-key",
        "username": "",
        "api_version": "62.0",
        **fields,
    }
    with pytest.raises(ValidationError) as caught:
        CrmConnection(**values).clean()
    assert error_field in caught.value.message_dict


def test_a_hubspot_connection_refuses_salesforce_settings():
    with pytest.raises(ValidationError) as caught:
        CrmConnection(kind="hubspot", name="H", client_id="x").clean()
    assert "client_id" in caught.value.message_dict
    CrmConnection(kind="hubspot", name="H").clean()


def test_domain_of_reduces_a_website_to_its_host():
    assert domain_of("https://www.Acme.com/about?x=1") == "acme.com"
    assert domain_of("acme.co.uk") == "acme.co.uk"
    assert domain_of("http://shop.acme.com:8080") == "shop.acme.com"
    assert domain_of("") == ""


def _hubspot() -> CrmConnection:
    return CrmConnection.objects.create(kind="hubspot", name="HubSpot")


def test_the_roster_maps_owners_to_reps_by_email_and_creates_new_reps_inactive():
    connection = _hubspot()
    ana = RepFactory(email="Ana@Example.com", name="Ana")
    report = roster_apply(
        connection,
        [
            CrmUser(id="101", email="ana@example.com", name="Ana A", active=True),
            CrmUser(id="102", email="ben@example.com", name="Ben B", active=True),
            CrmUser(id="103", email="gone@example.com", name="Gone", active=False),
        ],
    )
    assert report.owners == 3
    assert report.linked == ["Ana@Example.com", "ben@example.com"]
    assert report.created == ["ben@example.com"]
    ben = Rep.objects.get(email="ben@example.com")
    assert ben.active is False
    assert ben.name == "Ben B"
    assert not Rep.objects.filter(email="gone@example.com").exists()
    assert rep_owner_id("hubspot", ana.pk) == "101"
    mapped = owner_reps("hubspot", ["101", "103", "999"])
    assert mapped["101"].rep_id == ana.pk
    assert mapped["103"].rep_id is None
    assert mapped["103"].active_in_crm is False
    assert mapped["999"].rep_id is None
    connection.refresh_from_db()
    assert connection.roster_synced_at is not None


def test_a_rep_deactivated_in_the_crm_is_flagged_not_deactivated():
    connection = _hubspot()
    ana = RepFactory(email="ana@example.com")
    roster_apply(connection, [CrmUser(id="101", email="ana@example.com", active=True)])
    report = roster_apply(connection, [CrmUser(id="101", email="ana@example.com", active=False)])
    assert report.deactivated_in_crm == ["ana@example.com"]
    ana.refresh_from_db()
    assert ana.active is True
    owner = CrmOwner.objects.get(kind="hubspot", owner_id="101")
    assert owner.active_in_crm is False
    assert owner.rep_id == ana.pk


def test_a_rep_linked_by_hand_stays_linked_and_one_rep_has_one_owner_per_kind():
    connection = _hubspot()
    ana = RepFactory(email="ana@example.com")
    roster_apply(connection, [CrmUser(id="101", email="ana.alias@example.com", active=True)])
    owner = CrmOwner.objects.get(owner_id="101")
    owner.rep = ana
    owner.save()
    report = roster_apply(
        connection,
        [
            CrmUser(id="101", email="ana.alias@example.com", active=True),
            CrmUser(id="102", email="ana@example.com", active=True),
        ],
        create_reps=False,
    )
    assert CrmOwner.objects.get(owner_id="101").rep_id == ana.pk
    assert CrmOwner.objects.get(owner_id="102").rep_id is None  # Ana already has one
    assert report.linked == []


def test_the_rotate_command_reseals_every_credential(settings, capsys):
    from django.core.management import call_command

    old = new_key()
    settings.CRM_SECRET_KEYS = [old]
    connection = CrmConnection.objects.create(
        kind="hubspot", name="HubSpot", secret_encrypted=secret_seal(TOKEN)
    )
    new = new_key()
    settings.CRM_SECRET_KEYS = [new, old]
    call_command("crm_rotate_key")
    assert "1 credential(s) re-encrypted, 0 unreadable" in capsys.readouterr().out
    settings.CRM_SECRET_KEYS = [new]
    connection.refresh_from_db()
    assert secret_open(connection.secret_encrypted) == TOKEN


def test_the_settings_a_crm_module_gets_do_not_show_the_secret_in_their_repr():
    """Error reports capture local variables (Sentry does by default): a client's ``settings``
    must not carry the credential into one."""
    from routing.crm.base import CrmSettings

    settings = CrmSettings(
        kind="hubspot", base_url="https://api.hubapi.com", secret="pat-na1-s3cr3t"
    )
    assert "s3cr3t" not in repr(settings)
    assert settings.secret == "pat-na1-s3cr3t"
