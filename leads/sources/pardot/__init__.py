"""Account Engagement (Pardot): a form handler's post, and the prospect record as the API has it.

Shapes, from Salesforce's Account Engagement documentation:

- Form handlers (https://help.salesforce.com/s/articleView?id=mktg.pardot_form_handlers_about.htm
  and "Considerations for Using Form Handlers"): an ``application/x-www-form-urlencoded`` post
  whose field names are the customer's own "external field names", each mapped in the handler to
  a prospect field. With "Enable data forwarding to the success location" on, Account Engagement
  passes the same fields on to the success location — this source's URL. Commonly written as
  ``email``, ``first_name``, ``last_name``, ``company``, ``job_title``, or as the prospect
  fields' labels (``First Name``, ``Job Title``...).
- The prospect object, for a relay or a Flow that posts the prospect: API v5's camelCase names
  (https://developer.salesforce.com/docs/marketing/pardot/guide/prospect-v5.html: ``id``,
  ``email``, ``firstName``, ``jobTitle``, ``annualRevenue``, ``salesforceLeadId``,
  ``updatedAt``...) and API v3/v4's snake_case names inside ``{"prospect": {...}}``
  (https://developer.salesforce.com/docs/marketing/pardot/guide/prospects-v4.html).
- A connected Salesforce org's Lead and Contact carry Account Engagement's ``pi__`` fields
  (``pi__score__c``, ``pi__utm_source__c``...); those are read here too, and the Salesforce kind
  reads the whole Lead.

Account Engagement signs none of these posts: the source's token goes in the URL.
"""

from __future__ import annotations

from typing import Any

from leads.sources.base import (
    Options,
    Record,
    SourceKind,
    as_text,
    fold_key,
    get,
    json_in,
    scalar_or_joined,
)

# Folded key (lower case, letters and digits only) → canonical field: external field names as
# customers commonly write them, the prospect fields' labels, and the v3/v4 and v5 API names.
_FIELDS = {
    "email": "email",
    "emailaddress": "email",
    "firstname": "first_name",
    "lastname": "last_name",
    "name": "full_name",
    "fullname": "full_name",
    "company": "company",
    "companyname": "company",
    "jobtitle": "title",
    "title": "title",
    "phone": "phone",
    "phonenumber": "phone",
    "country": "country",
    "state": "region",
    "city": "city",
    "zip": "postal_code",
    "zipcode": "postal_code",
    "postalcode": "postal_code",
    "website": "website",
    "employees": "employees",
    "numberofemployees": "employees",
    "annualrevenue": "annual_revenue",
    "industry": "industry",
    "score": "lead_score",
    "utmsource": "utm_source",
    "utmmedium": "utm_medium",
    "utmcampaign": "utm_campaign",
    # Account Engagement's fields on a connected Salesforce Lead or Contact.
    "piscorec": "lead_score",
    "piutmsourcec": "utm_source",
    "piutmmediumc": "utm_medium",
    "piutmcampaignc": "utm_campaign",
}
# The prospect's id ("id" in the API, "prospect_id" in exports) and last change.
_ID_KEYS = frozenset({"id", "prospectid"})
_MODIFIED_KEY = "updatedat"


def _unwrap(record: Record) -> Record:
    """The prospect: v3/v4's ``{"prospect": {...}}``, v5's query page ``{"values": [...]}``
    (the first), or the record itself (a form handler's post)."""
    prospect = get(record, "prospect")
    if isinstance(prospect, dict):
        return prospect
    values = get(record, "values")
    for item in values if isinstance(values, list) else ():
        if isinstance(item, dict):
            return item
    return record


def decode(record: Record, options: Options) -> Record:
    prospect = _unwrap(record)
    flat: Record = {}
    prospect_id = ""
    modified = ""
    for key, raw in prospect.items():
        if not isinstance(key, str):
            continue
        value: Any = scalar_or_joined(json_in(raw))
        folded = fold_key(key)
        if folded in _ID_KEYS and not prospect_id and as_text(value).strip():
            prospect_id = as_text(value).strip()
            flat["pardot_prospect_id"] = value
            continue
        if folded == _MODIFIED_KEY:
            modified = modified or as_text(value).strip()
        if folded == "campaign" and isinstance(value, dict):
            # v4's campaign is {id, name}: its name is what a rule would look at.
            value = get(value, "name")
            key = "campaign"
        target = _FIELDS.get(folded)
        if target and (target not in flat or flat[target] in (None, "")):
            flat[target] = value
        elif key not in flat:
            flat[key] = value
    if prospect_id:
        # A prospect record: the same prospect sent again after a change is a new lead, the
        # same body resent stays one. (A form handler's post carries no id of its own.)
        flat["external_id"] = f"{prospect_id}:{modified}" if modified else prospect_id
    return flat


KIND = SourceKind(
    name="pardot",
    label="Account Engagement / Pardot (form handler, prospect)",
    docs="https://developer.salesforce.com/docs/marketing/pardot/guide/prospect-v5.html",
    decode=decode,
)
