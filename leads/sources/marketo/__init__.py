"""Marketo (Adobe Marketo Engage): a smart campaign's "Call Webhook" flow step.

Marketo has no fixed payload: the admin writes a *payload template* with tokens
(``{{lead.Email Address}}``, ``{{company.Company Name}}``...), chooses the request token
encoding (JSON or Form/Url) and the content type. From Marketo's developer guide
(https://experienceleague.adobe.com/en/docs/marketo-developer/marketo/webhooks/webhooks):
string tokens are enclosed in double quotes automatically, and Marketo signs nothing (a custom
header or our token in the URL authenticates it). RECIPE.md gives the template we recommend;
this decoder reads that template and the keys Marketo users commonly write instead — the REST
API's lead field names (``email``, ``firstName``, ``leadId``, ``numberOfEmployees``...; see
https://experienceleague.adobe.com/en/docs/marketo-developer/marketo/rest/lead-database/leads)
and the fields' display names as the token picker shows them (``Email Address``,
``Job Title``, or ``lead.Email Address`` when the key is the token itself).
"""

from __future__ import annotations

import re
from typing import Any

from leads.sources.base import Options, Record, SourceKind, as_text, json_in, scalar_or_joined

# Folded key (lower case, letters and digits only, a "lead." / "company." prefix dropped) →
# canonical field. REST names and display names of Marketo's standard lead and company fields.
_FIELDS = {
    "email": "email",
    "emailaddress": "email",
    "firstname": "first_name",
    "lastname": "last_name",
    "fullname": "full_name",
    "company": "company",
    "companyname": "company",
    "title": "title",
    "jobtitle": "title",
    "phone": "phone",
    "phonenumber": "phone",
    "mainphone": "phone",
    "country": "country",
    "state": "region",
    "city": "city",
    "postalcode": "postal_code",
    "zip": "postal_code",
    "website": "website",
    "numberofemployees": "employees",
    "numemployees": "employees",
    "annualrevenue": "annual_revenue",
    "industry": "industry",
    "leadscore": "lead_score",
    "score": "lead_score",
    "utmsource": "utm_source",
    "utmmedium": "utm_medium",
    "utmcampaign": "utm_campaign",
}
# The Marketo lead id: "id" in the REST API, "Id" as a token, "leadId" in most templates.
_ID_KEYS = frozenset({"leadid", "id", "marketoid", "marketoleadid"})
# When the webhook was called ({{system.dateTime}} in the recommended template).
_SENT_AT_KEYS = frozenset({"sentat", "systemdatetime", "datetime"})
_PREFIX_RE = re.compile(r"^(lead|company|member|trigger)\.", re.IGNORECASE)
# A token Marketo could not fill stays in the body as written.
_UNRENDERED_RE = re.compile(r"^\s*\{\{[^{}]*\}\}\s*$")


def _fold(key: str) -> str:
    key = _PREFIX_RE.sub("", key.strip())
    return "".join(ch for ch in key.casefold() if ch.isalnum())


def _value(value: Any) -> Any:
    value = scalar_or_joined(json_in(value))
    if isinstance(value, str):
        if _UNRENDERED_RE.match(value):
            return None
        # Marketo puts string tokens in double quotes itself, also in a Form/Url template,
        # where the quotes then arrive as part of the value.
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
    return value


def _flat_items(record: Record) -> list[tuple[str, Any]]:
    """(key, value) pairs: the top level, and one level of nesting ({"lead": {...}}, a template
    grouping the company's fields), since templates are hand-written."""
    items: list[tuple[str, Any]] = []
    for key, value in record.items():
        if not isinstance(key, str):
            continue
        value = json_in(value)
        if isinstance(value, dict) and _fold(key) in ("lead", "company", "person", "data"):
            for inner_key, inner in value.items():
                if isinstance(inner_key, str):
                    items.append((inner_key, inner))
        else:
            items.append((key, value))
    return items


def decode(record: Record, options: Options) -> Record:
    flat: Record = {}
    lead_id = ""
    sent_at = ""
    updated_at = ""  # a REST-shaped body's last modification, where no call time is sent
    for key, raw in _flat_items(record):
        value = _value(raw)
        folded = _fold(key)
        if folded in _ID_KEYS and not lead_id and as_text(value).strip():
            lead_id = as_text(value).strip()
            flat["marketo_lead_id"] = value
            continue
        if folded in _SENT_AT_KEYS and not sent_at:
            sent_at = as_text(value).strip()
        elif folded == "updatedat" and not updated_at:
            updated_at = as_text(value).strip()
        target = _FIELDS.get(folded)
        if target and (target not in flat or flat[target] in (None, "")):
            flat[target] = value
        elif key not in flat:
            flat[key] = value
    sent_at = sent_at or updated_at
    if lead_id:
        # A campaign may call the webhook for the same lead again later, with other values: the
        # call's time keeps those apart, while a body sent twice stays one lead.
        flat["external_id"] = f"{lead_id}:{sent_at}" if sent_at else lead_id
    return flat


KIND = SourceKind(
    name="marketo",
    label="Marketo Engage (webhook, JSON or form template)",
    docs="https://experienceleague.adobe.com/en/docs/marketo-developer/marketo/webhooks/webhooks",
    decode=decode,
)
