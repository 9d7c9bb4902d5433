"""Salesforce: a Lead or Contact record posted by a Flow / Apex HTTP callout, or an Outbound
Message (the SOAP notification of a workflow rule or flow action).

Shapes, from Salesforce's documentation:

- Record JSON: the REST API's sObject representation
  (https://developer.salesforce.com/docs/atlas.en-us.api_rest.meta/api_rest/dome_get_field_values.htm)
  — field API names (``FirstName``, ``Email``, ``Company``, ``NumberOfEmployees``...), an
  ``attributes: {type, url}`` object, custom fields ending in ``__c``; also sent wrapped as
  ``{"sobject": {...}}`` or as a query result ``{"records": [...]}`` (the first is read).
  Field names: the Lead and Contact objects of the Object Reference
  (https://developer.salesforce.com/docs/atlas.en-us.object_reference.meta/object_reference/sforce_api_objects_lead.htm).
- Outbound Message: "Understanding the Outbound Messaging WSDL"
  (https://developer.salesforce.com/docs/platform/api/guide/sforce-api-om-outboundmessaging-wsdl.html)
  — ``soapenv:Envelope`` → ``notifications`` (OrganizationId, ActionId, SessionId,
  EnterpriseUrl, PartnerUrl, 1 to 100 ``Notification``) → ``Notification`` (``Id``, ``sObject``
  with ``xsi:type="sf:Lead"`` and ``sf:`` fields). The listener must answer
  ``notificationsResponse`` with ``<Ack>true</Ack>``, or Salesforce keeps resending; a resent
  notification keeps its ``Id``, which is therefore the lead's idempotency key.

Account Engagement (Pardot) connected orgs add ``pi__`` fields (score, grade, UTM values).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from leads.sources.base import (
    DecodeError,
    Inbound,
    Options,
    Record,
    Reply,
    SourceKind,
    as_text,
    get,
    json_in,
    merge,
    scalar_or_joined,
)

# Lead and Contact field API names → canonical fields.
FIELDS = {
    "email": "email",
    "firstname": "first_name",
    "lastname": "last_name",
    "company": "company",
    "phone": "phone",
    "title": "title",
    "website": "website",
    "numberofemployees": "employees",
    "annualrevenue": "annual_revenue",
    "industry": "industry",
    "country": "country",
    "state": "region",
    "city": "city",
    "postalcode": "postal_code",
    # Contacts: the mailing address is theirs.
    "mailingcountry": "country",
    "mailingstate": "region",
    "mailingcity": "city",
    "mailingpostalcode": "postal_code",
    # Account Engagement (Pardot) fields on a connected org's Lead and Contact.
    "pi__score__c": "lead_score",
    "pi__utm_source__c": "utm_source",
    "pi__utm_medium__c": "utm_medium",
    "pi__utm_campaign__c": "utm_campaign",
}
# Codes beside the names (state and country picklists): kept, and used where the name is blank.
FALLBACKS = {
    "countrycode": "country",
    "statecode": "region",
    "mailingcountrycode": "country",
    "mailingstatecode": "region",
    "mobilephone": "phone",
}
_WRAPPERS = ("sobject", "record", "lead", "contact")
_MODIFIED = ("LastModifiedDate", "SystemModstamp")
NOTIFICATION_ID = "NotificationId"
OUTBOUND_NS = "http://soap.sforce.com/2005/09/outbound"
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"
_FORBIDDEN_XML = re.compile(rb"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)
MAX_NOTIFICATIONS = 100


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def rename(fields: dict[str, Any], names: dict[str, str], fallbacks: dict[str, str]) -> Record:
    """Field names → canonical names where known (case-insensitive); others kept as sent.

    A fallback (a country code beside the country name) fills a canonical field only when the
    primary field is blank; otherwise it stays under its own name (the aliases still offer it
    as a second candidate, which normalisation keeps in custom when the first one wins)."""
    out: Record = {}
    for key, value in fields.items():
        if not isinstance(key, str) or value is None:
            continue
        target = names.get(key.lower())
        name = target or key
        if name in out and not _blank(out[name]):
            name = key  # a second field for the same target: kept as sent
        out[name] = value
    for key, value in fields.items():
        target = fallbacks.get(key.lower()) if isinstance(key, str) else None
        if target and _blank(out.get(target)) and not _blank(value):
            out[target] = value
            out.pop(key, None)
    return out


def _unwrap(record: Record) -> tuple[Record, Record]:
    """(the sObject, the envelope around it): ``{"sobject": {...}}``, ``{"records": [...]}``
    (the first record) or the record itself."""
    lowered = {key.lower(): key for key in record if isinstance(key, str)}
    for name in _WRAPPERS:
        inner = get(record, lowered.get(name, name))
        if isinstance(inner, dict):
            return inner, {k: v for k, v in record.items() if k != lowered.get(name)}
    records = get(record, lowered.get("records", "records"))
    if isinstance(records, list):
        for item in records:
            if isinstance(item, dict):
                envelope = {k: v for k, v in record.items() if k != lowered.get("records")}
                return item, envelope
    return record, {}


def decode(record: Record, options: Options) -> Record:
    sobject, envelope = _unwrap(record)
    fields: Record = {}
    sobject_type = as_text(get(sobject, "attributes", "type"))
    for key, value in sobject.items():
        if not isinstance(key, str):
            continue
        if key == "attributes":
            continue  # type and REST url: read below
        value = json_in(value)
        if isinstance(value, dict):
            # A parent record (Account, Owner): only the contact's own account names a company.
            if key == "Account" and isinstance(get(value, "Name"), str):
                fields.setdefault("Account.Name", get(value, "Name"))
            else:
                fields[key] = value
            continue
        fields[key] = scalar_or_joined(value)
    if "Account.Name" in fields and _blank(fields.get("Company")):
        fields["Company"] = fields.pop("Account.Name")
    # Salesforce's multi-select picklists arrive as "a;b": kept as sent.
    salesforce_id = as_text(fields.pop("Id", None))
    flat = rename(fields, FIELDS, FALLBACKS)
    if _blank(flat.get("first_name")) and _blank(flat.get("last_name")):
        # A record without the name parts (a Person Account, a custom object) may carry Name.
        name = flat.pop("Name", None)
        if not _blank(name):
            flat["full_name"] = name
    if salesforce_id:
        flat["salesforce_id"] = salesforce_id
    if sobject_type:
        flat["sobject_type"] = sobject_type
    url = get(sobject, "attributes", "url")
    if isinstance(url, str) and url:
        flat["salesforce_record_url"] = url
    flat = merge(flat, {k: v for k, v in envelope.items() if isinstance(k, str) and v is not None})

    notification_id = as_text(flat.get(NOTIFICATION_ID)).strip()
    modified = next((as_text(fields.get(k)) for k in _MODIFIED if as_text(fields.get(k))), "")
    if notification_id:
        flat["external_id"] = notification_id
    elif salesforce_id:
        # The same record sent again after a change is a new lead; a resend of the same body
        # (same modification time) stays one.
        flat["external_id"] = f"{salesforce_id}:{modified}" if modified else salesforce_id
    return flat


# --- the Outbound Message -----------------------------------------------------------------


def _local(tag: str) -> str:
    return tag.rpartition("}")[2] if isinstance(tag, str) else ""


def _text(element: ET.Element) -> str | None:
    if element.get(f"{{{XSI_NS}}}nil") == "true":
        return None
    return element.text or ""


def parse(inbound: Inbound) -> list[Record]:
    """One record per ``Notification`` of an Outbound Message: the sObject (fields by local
    name, its type under ``attributes``) and the message's ids beside it."""
    body = inbound.body
    # Only UTF-8 (what Salesforce sends): a UTF-16 or UTF-32 body would hide a DOCTYPE from
    # the check below behind its zero bytes.
    if b"\x00" in body:
        raise DecodeError("the XML body is not UTF-8.")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        raise DecodeError("the XML body is not UTF-8.") from None
    # No DTDs at all: entity expansion (billion laughs) and external entities are refused
    # before the parser sees the body; Salesforce never sends either.
    if _FORBIDDEN_XML.search(body):
        raise DecodeError("XML with a DOCTYPE or ENTITY declaration is refused.")
    try:
        # Safe here without defusedxml: DTDs were refused above, and a body without a DTD can
        # declare no entity to expand or fetch.
        root = ET.fromstring(body)  # noqa: S314
    except ET.ParseError as exc:
        raise DecodeError(f"not well-formed XML: {exc}") from None
    notifications = next((el for el in root.iter() if _local(el.tag) == "notifications"), None)
    if notifications is None:
        raise DecodeError("no <notifications> element: not a Salesforce Outbound Message.")
    envelope: Record = {}
    for child in notifications:
        name = _local(child.tag)
        # The SessionId is a live API session of the sending user: never stored.
        if name in ("OrganizationId", "ActionId", "EnterpriseUrl", "PartnerUrl"):
            envelope[name] = _text(child)
    records: list[Record] = []
    for notification in notifications:
        if _local(notification.tag) != "Notification":
            continue
        record: Record = dict(envelope)
        for part in notification:
            name = _local(part.tag)
            if name == "Id":
                record[NOTIFICATION_ID] = _text(part)
            elif name == "sObject":
                record["sObject"] = _sobject(part)
        records.append(record)
        if len(records) > MAX_NOTIFICATIONS:
            raise DecodeError(f"more than {MAX_NOTIFICATIONS} notifications in one message.")
    if not records:
        raise DecodeError("the Outbound Message has no <Notification>.")
    return records


def _sobject(element: ET.Element) -> Record:
    sobject: Record = {}
    xsi_type = element.get(f"{{{XSI_NS}}}type") or ""
    if xsi_type:
        sobject["attributes"] = {"type": xsi_type.rpartition(":")[2]}
    for field in element:
        name = _local(field.tag)
        if name and name not in sobject:
            sobject[name] = _text(field)
    return sobject


_ACK = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    '<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" '
    'xmlns:xsd="http://www.w3.org/2001/XMLSchema" '
    'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">\n'
    "  <soapenv:Body>\n"
    f'    <notificationsResponse xmlns="{OUTBOUND_NS}">\n'
    "      <Ack>true</Ack>\n"
    "    </notificationsResponse>\n"
    "  </soapenv:Body>\n"
    "</soapenv:Envelope>\n"
)


def acknowledge(lead_ids: list[str]) -> Reply:
    """The ack Salesforce waits for: without it the message is resent for up to 24 hours."""
    return Reply(status=200, body=_ACK.encode("utf-8"), content_type="text/xml; charset=utf-8")


_SESSION_ID_RE = re.compile(rb"(<(?:\w+:)?SessionId\b[^>]*>)[^<]*(</(?:\w+:)?SessionId>)", re.I)


def redact_body(body: bytes) -> bytes:
    """A refused Outbound Message without its SessionId (a live API session of the sender)."""
    return _SESSION_ID_RE.sub(rb"\1\2", body)


KIND = SourceKind(
    name="salesforce",
    label="Salesforce (Flow / Apex callout JSON, Outbound Message)",
    docs="https://developer.salesforce.com/docs/platform/api/guide/sforce-api-om-outboundmessaging-wsdl.html",
    decode=decode,
    parse=parse,
    acknowledge=acknowledge,
    redact_body=redact_body,
)
