"""HubSpot: the workflow "Send a webhook" action and form submissions, signed with v3 signatures.

Shapes, from HubSpot's developer documentation:

- Workflow webhooks (https://developers.hubspot.com/docs/methods/workflows/webhook_information):
  "the data will be the exact same data you'd get when pulling that object using the relevant
  object API". For contact-based workflows that is the v1 contact
  (https://developers.hubspot.com/docs/api-reference/legacy/crm/objects/contacts/v1/get-contacts-v1-contactvidvid-profile):
  ``vid``, ``canonical-vid``, ``portal-id``, ``properties: {name: {value, versions}}``,
  ``identity-profiles``, ``form-submissions``. The CRM v3 object has plain values instead
  (``id`` / ``objectId``, ``properties: {email: "..."}``, ``createdAt``, ``updatedAt``), and a
  customised request body sends the chosen properties as top-level keys.
- Form submissions (https://developers.hubspot.com/docs/methods/forms/submit_form_v3):
  ``fields: [{objectTypeId, name, value}]``, ``context: {hutk, pageUri, pageName, ...}``,
  ``submittedAt``, ``legalConsentOptions``; the submissions API's ``values: [{name, value}]``.
- Signature v3 (https://developers.hubspot.com/docs/apps/legacy-apps/authentication/validating-requests):
  ``X-HubSpot-Signature-v3`` = base64(HMAC-SHA256(client secret, method + URI + body +
  timestamp)), ``X-HubSpot-Request-Timestamp`` in epoch milliseconds, older than 5 minutes
  refused.

Property names are HubSpot's internal names (email, firstname, jobtitle, numemployees...).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from datetime import datetime
from typing import Any

from leads.sources.base import Inbound, Options, Record, SourceKind, as_text, get, json_in, merge

SIGNATURE_HEADER = "X-HubSpot-Signature-v3"
TIMESTAMP_HEADER = "X-HubSpot-Request-Timestamp"
MAX_AGE_MS = 5 * 60 * 1000

# HubSpot's default contact properties (internal names) → canonical fields.
_CONTACT_PROPERTIES = {
    "email": "email",
    "firstname": "first_name",
    "lastname": "last_name",
    "company": "company",
    "phone": "phone",
    "jobtitle": "title",
    "country": "country",
    "state": "region",
    "city": "city",
    "zip": "postal_code",
    "website": "website",
    "numemployees": "employees",
    "annualrevenue": "annual_revenue",
    "industry": "industry",
    "hubspotscore": "lead_score",
}
# A company record (company-based workflows; a form's 0-2 fields) names things differently.
_COMPANY_PROPERTIES = {
    "name": "company",
    "domain": "domain",
    "website": "website",
    "phone": "phone",
    "country": "country",
    "state": "region",
    "city": "city",
    "zip": "postal_code",
    "numberofemployees": "employees",
    "annualrevenue": "annual_revenue",
    "industry": "industry",
}
# A form's company fields beside the person's: the company's phone is not the person's.
_FORM_COMPANY_PROPERTIES = {k: v for k, v in _COMPANY_PROPERTIES.items() if k != "phone"}
_COMPANY_OBJECT_TYPE = "0-2"
# The envelope keys that are the record's id, in order of preference.
_ID_KEYS = ("hs_object_id", "objectId", "id", "canonical-vid", "vid", "companyId", "dealId")
# Modification times: part of the key, so that the same contact sent again after a change (a
# re-enrolment) is a new lead while HubSpot's retry of the identical body stays one.
_MODIFIED_KEYS = ("lastmodifieddate", "hs_lastmodifieddate")
# The v3 signature's URI is compared with these escapes decoded, as HubSpot's guide says.
_URI_ESCAPES = {
    "%3A": ":",
    "%2F": "/",
    "%3F": "?",
    "%40": "@",
    "%21": "!",
    "%24": "$",
    "%27": "'",
    "%28": "(",
    "%29": ")",
    "%2A": "*",
    "%2C": ",",
    "%3B": ";",
}
_ESCAPE_RE = re.compile("|".join(_URI_ESCAPES), re.IGNORECASE)


def _scalar(value: Any) -> Any:
    """A property's value: v1's ``{"value": ..., "versions": [...]}`` unwrapped, a JSON string
    decoded, a one-item list unwrapped."""
    value = json_in(value)
    if isinstance(value, dict) and "value" in value:
        value = value.get("value")
    if isinstance(value, list):
        texts = [as_text(item) for item in value if not isinstance(item, dict | list)]
        texts = [text for text in texts if text.strip()]
        if len(texts) == len(value):
            return texts[0] if len(texts) == 1 else "; ".join(texts)
    return value


def _rename(props: dict[str, Any], names: dict[str, str], prefix: str = "") -> Record:
    """HubSpot property names → canonical names where known; every other property kept by its
    own name (with ``prefix`` for another object's properties)."""
    out: Record = {}
    for key, value in props.items():
        if not isinstance(key, str):
            continue
        target = names.get(key.lower())
        name = target or f"{prefix}{key}"
        if name not in out or out[name] in (None, ""):
            out[name] = value
    return out


def _properties(record: Record) -> dict[str, Any]:
    """The ``properties`` of a v1 or v3 object (a dict), or of a v1 update body (a list of
    ``{property, value}``), as {name: scalar}."""
    props = get(record, "properties")
    out: dict[str, Any] = {}
    if isinstance(props, dict):
        for key, value in props.items():
            if isinstance(key, str):
                out[key] = _scalar(value)
    elif isinstance(props, list):
        for item in props:
            if not isinstance(item, dict):
                continue
            name = item.get("property", item.get("name"))
            if isinstance(name, str) and name not in out:
                out[name] = _scalar(item.get("value"))
    return out


def _form_fields(record: Record) -> tuple[dict[str, Any], dict[str, Any]]:
    """(contact fields, company fields) of a form submission's ``fields`` / ``values`` list.

    A multiple-checkbox answer may come as one item per ticked option: those are joined."""
    contact: dict[str, Any] = {}
    company: dict[str, Any] = {}
    for list_key in ("fields", "values"):
        items = get(record, list_key)
        if not isinstance(items, list):
            continue
        for item in items:
            if not isinstance(item, dict):
                continue
            name = item.get("name")
            if not isinstance(name, str) or not name:
                continue
            value = _scalar(item.get("value"))
            target = company if item.get("objectTypeId") == _COMPANY_OBJECT_TYPE else contact
            if name in target and target[name] not in (None, "") and value not in (None, ""):
                target[name] = f"{as_text(target[name])}; {as_text(value)}"
            elif name not in target or target[name] in (None, ""):
                target[name] = value
    return contact, company


def _identity_email(record: Record) -> Any:
    """The EMAIL identity of a v1 contact's ``identity-profiles`` (where ``email`` is unset)."""
    profiles = get(record, "identity-profiles")
    for profile in profiles if isinstance(profiles, list) else ():
        identities = get(profile, "identities")
        for identity in identities if isinstance(identities, list) else ():
            if get(identity, "type") == "EMAIL" and isinstance(get(identity, "value"), str):
                return get(identity, "value")
    return None


def _is_company(record: Record) -> bool:
    object_type = as_text(get(record, "objectType")).upper()
    return "companyId" in record or object_type in ("COMPANY", _COMPANY_OBJECT_TYPE)


def _first_result(record: Record) -> Record:
    """The submissions API's ``{"results": [submission, ...]}``: the first submission."""
    if any(key in record for key in ("properties", "fields", "values")):
        return record
    results = get(record, "results")
    if isinstance(results, list):
        for item in results:
            if isinstance(item, dict):
                return item
    return record


def decode(record: Record, options: Options) -> Record:
    record = _first_result(record)
    props = _properties(record)
    form_contact, form_company = _form_fields(record)
    company_record = _is_company(record)
    names = _COMPANY_PROPERTIES if company_record else _CONTACT_PROPERTIES

    envelope: Record = {}
    for key, value in record.items():
        if not isinstance(key, str) or key in ("properties", "fields", "values", "results"):
            continue
        if key == "context":
            # hutk, pageUri, pageName, ipAddress...: the submission's context, kept flat.
            context = json_in(value)
            if isinstance(context, dict):
                envelope.update({k: v for k, v in context.items() if isinstance(k, str)})
                continue
        envelope[key] = value if isinstance(value, dict | list) else _scalar(value)

    flat = merge(
        _rename(props, names),
        _rename(form_contact, _CONTACT_PROPERTIES),
        _rename(form_company, _FORM_COMPANY_PROPERTIES, prefix="company_"),
        # A customised workflow body: the chosen properties at the top level, by their names.
        _rename(envelope, names),
    )
    if flat.get("email") in (None, ""):
        email = _identity_email(record)
        if email:
            flat["email"] = email
    # v1 contacts fetched with their company carry it under associated-company.
    company_name = get(record, "associated-company", "properties", "name", "value")
    if flat.get("company") in (None, "") and isinstance(company_name, str):
        flat["company"] = company_name

    record_id = next(
        (
            as_text(source.get(key))
            for source in (props, record)
            for key in _ID_KEYS
            if as_text(source.get(key)).strip()
        ),
        "",
    )
    modified = next(
        (as_text(props.get(key)) for key in _MODIFIED_KEYS if as_text(props.get(key)).strip()),
        as_text(get(record, "updatedAt")),
    )
    conversion = as_text(get(record, "conversionId") or get(record, "conversion-id"))
    if conversion:
        # A form submission's own id: each submission is one lead.
        flat["external_id"] = conversion
    elif record_id:
        flat["external_id"] = f"{record_id}:{modified}" if modified else record_id
    return flat


def _signed_uris(url: str) -> list[str]:
    decoded = _ESCAPE_RE.sub(lambda match: _URI_ESCAPES[match.group(0).upper()], url)
    return [url] if decoded == url else [url, decoded]


def verify(inbound: Inbound, secret: str, now: datetime) -> bool:
    """HubSpot's v3 signature: HMAC-SHA256 over method + URI + body + timestamp, base64."""
    signature = inbound.header(SIGNATURE_HEADER).strip()
    timestamp = inbound.header(TIMESTAMP_HEADER).strip()
    if not secret or not signature or not timestamp.isdigit():
        return False
    # Replays are refused: older than 5 minutes (or as far in the future) is stale.
    if abs(now.timestamp() * 1000 - int(timestamp)) > MAX_AGE_MS:
        return False
    method = (inbound.method or "POST").upper().encode()
    for uri in _signed_uris(inbound.url):
        message = method + uri.encode("utf-8") + inbound.body + timestamp.encode()
        digest = hmac.new(secret.encode("utf-8"), message, hashlib.sha256).digest()
        if hmac.compare_digest(base64.b64encode(digest).decode("ascii"), signature):
            return True
    return False


KIND = SourceKind(
    name="hubspot",
    label="HubSpot (workflow webhook, form submission)",
    docs="https://developers.hubspot.com/docs/methods/workflows/webhook_information",
    decode=decode,
    verify=verify,
    signature_header=SIGNATURE_HEADER,
)
