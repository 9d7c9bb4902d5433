"""From a ``CrmConnection`` row to a client that can make calls: the registry of CRM modules.

``crm_client(connection, spend=...)`` decrypts the secret and builds the module's client. The
stages pass ``spend``, a function that takes tokens from the connection's shared rate limit
(``routing.crm.limits``); code that must not be limited (the admin's "test connection") passes
nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from django.conf import settings
from django.db.models import QuerySet

from routing.crm.base import HUBSPOT, SALESFORCE, CrmClient, CrmError, CrmSettings
from routing.crm.models import CrmConnection
from routing.crm.secrets import SecretUnreadable, secret_open

# One module per CRM, each with a class that implements ``routing.crm.base.CrmClient``.
CLIENT_CLASSES: dict[str, str] = {
    HUBSPOT: "routing.crm.hubspot:HubSpotClient",
    SALESFORCE: "routing.crm.salesforce:SalesforceClient",
}


def connection_settings(
    connection: CrmConnection, *, spend: Callable[[int], None] | None = None
) -> CrmSettings:
    """The decrypted settings a CRM module is built from; CrmError("config") when unusable."""
    try:
        secret = secret_open(connection.secret_encrypted)
    except SecretUnreadable as exc:
        raise CrmError("config", str(exc)) from exc
    if not secret:
        raise CrmError("config", "no credential saved for this connection")
    options = {
        "auth_flow": connection.auth_flow,
        "client_id": connection.client_id,
        "username": connection.username,
        "api_version": connection.api_version,
        "person_object": connection.person_object,
        "external_id_field": connection.external_id_field,
    }
    return CrmSettings(
        kind=connection.kind,
        base_url=connection.effective_base_url,
        secret=secret,
        options={k: v for k, v in options.items() if v},
        timeout_seconds=settings.CRM_TIMEOUT_SECONDS,
        deadline_seconds=settings.CRM_CALL_DEADLINE_SECONDS,
        ca_bundle=settings.CRM_CA_BUNDLE,
        spend=spend or (lambda n: None),
        connection_id=connection.pk,
    )


def crm_client(
    connection: CrmConnection, *, spend: Callable[[int], None] | None = None
) -> CrmClient:
    """A client for ``connection`` (CrmError("config") when its kind or secret is unusable)."""
    target = CLIENT_CLASSES.get(connection.kind)
    if target is None:
        raise CrmError("config", f"no CRM module for kind {connection.kind!r}")
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    client: CrmClient = cls(connection_settings(connection, spend=spend))
    return client


def connections_active() -> QuerySet[CrmConnection]:
    """Active connections, oldest first (the first one's owner wins when two CRMs disagree)."""
    return CrmConnection.objects.filter(active=True).order_by("id")
