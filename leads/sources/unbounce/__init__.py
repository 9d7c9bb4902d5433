"""Unbounce: the landing-page form webhook.

Shape from Unbounce's docs, "Using a Webhook"
(https://documentation.unbounce.com/hc/en-us/articles/203510044-Using-a-Webhook): an
``application/x-www-form-urlencoded`` POST with ``page_id``, ``page_name``, ``page_url``,
``variant``, and the form's answers twice — ``data.json``, a JSON object of field name → list of
values, and ``data.xml``, the same as XML. Field names are the form builder's field ids
(lower case, spaces as underscores: ``first_name``, ``company_name``, ``what_is_your_budget``),
and Unbounce adds ``ip_address``, ``page_uuid``, ``variant``, ``page_url``, ``page_name``,
``date_submitted`` and ``time_submitted`` to them. The body Snowplow's Unbounce adapter is
tested with (snowplow/snowplow, ``CljTomcatUnbounceEventSpec``) shows the same fields. A relay
written in PHP receives ``data.json`` as ``data_json`` (PHP turns the dot into an
underscore), so that name is read too.

Unbounce neither signs its webhooks nor sends a submission id, so the source authenticates with
our token in the URL, and a re-sent submission is not recognised by an id.
"""

from __future__ import annotations

from typing import Any

from leads.sources.base import Options, Record, SourceKind, as_text, get, put, scalar_or_joined
from leads.sources.labels import TEXT_TARGETS, question_target

# What Unbounce adds to every submission: about the page, never an answer.
_SUBMISSION_FIELDS = frozenset(
    {"ip_address", "page_uuid", "variant", "page_url", "page_name", "date_submitted"}
    | {"time_submitted"}
)
# The webhook's own form fields, kept under names that say they are Unbounce's.
_PAGE_FIELDS = {
    "page_id": "unbounce_page_id",
    "page_name": "unbounce_page_name",
    "page_url": "unbounce_page_url",
    "variant": "unbounce_variant",
}


def _keep(out: Record, key: str, value: Any) -> None:
    put(out, key, value, twin=False)


def decode(record: Record, options: Options) -> Record:
    answers = get(record, "data.json")
    if not isinstance(answers, dict):
        answers = get(record, "data_json")
    if not isinstance(answers, dict):
        # Posted without data.json (a test post, a relay): the answers are the form's fields.
        answers = {k: v for k, v in record.items() if k not in _PAGE_FIELDS and k != "data.xml"}

    out: Record = {}
    custom: list[tuple[str, Any]] = []
    for key, value in answers.items():
        if not isinstance(key, str):
            continue
        # Every value is a list: one item for a text field, several for checkboxes.
        value = scalar_or_joined(value)
        if value is None or isinstance(value, dict | list) or as_text(value).strip() == "":
            continue
        if key in _SUBMISSION_FIELDS:
            custom.append((key, value))
            continue
        # The field id is the label written in snake case ("what_is_your_company").
        target = question_target(key.replace("_", " "), TEXT_TARGETS)
        if target is not None and target not in out:
            out[target] = value
        else:
            custom.append((key, value))
    for key, value in custom:
        _keep(out, key if key not in out else f"{key} (form)", value)
    for key, name in _PAGE_FIELDS.items():
        if key not in answers:  # data.json repeats the page's name, URL and variant
            _keep(out, name, get(record, key))
    return out


KIND = SourceKind(
    name="unbounce",
    label="Unbounce (landing-page form webhook)",
    docs="https://documentation.unbounce.com/hc/en-us/articles/203510044-Using-a-Webhook",
    decode=decode,
)
