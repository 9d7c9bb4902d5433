"""The connection form: a stored credential is only sent where it was entered for."""

from __future__ import annotations

from typing import Any

import pytest

from routing.crm.admin import CrmConnectionForm
from routing.crm.models import CrmConnection
from routing.crm.secrets import secret_open, secret_seal

pytestmark = pytest.mark.django_db

TOKEN = "pat-na1-11111111-2222-3333-4444-555555555555"


def _connection() -> CrmConnection:
    return CrmConnection.objects.create(
        kind="hubspot",
        name="HubSpot",
        base_url="https://api.hubapi.com",
        secret_encrypted=secret_seal(TOKEN),
    )


def _data(connection: CrmConnection, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "kind": connection.kind,
        "name": connection.name,
        "active": "on",
        "base_url": connection.base_url,
        "lookup_enabled": "on",
        "honour_crm_owner": "on",
        "writeback_enabled": "on",
        "touches_enabled": "on",
    }
    data.update(changes)
    return data


def test_pointing_a_connection_elsewhere_needs_the_credential_again():
    connection = _connection()
    form = CrmConnectionForm(
        data=_data(connection, base_url="https://collector.example"), instance=connection
    )
    assert not form.is_valid()
    assert "entered again" in " ".join(form.errors["new_secret"])
    connection.refresh_from_db()
    assert connection.base_url == "https://api.hubapi.com"


def test_the_same_change_with_the_credential_typed_again_is_saved():
    connection = _connection()
    new = "pat-na1-99999999-8888-7777-6666-555555555555"
    form = CrmConnectionForm(
        data=_data(connection, base_url="https://proxy.example", new_secret=new),
        instance=connection,
    )
    assert form.is_valid(), form.errors
    form.save()
    connection.refresh_from_db()
    assert connection.base_url == "https://proxy.example"
    assert secret_open(connection.secret_encrypted) == new


def test_other_changes_keep_the_stored_credential():
    connection = _connection()
    form = CrmConnectionForm(data=_data(connection, rate_per_minute="100"), instance=connection)
    assert form.is_valid(), form.errors
    form.save()
    connection.refresh_from_db()
    assert secret_open(connection.secret_encrypted) == TOKEN
    assert TOKEN not in form.as_p()  # never shown again
