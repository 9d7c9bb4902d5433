"""Try it before you trust it (issue 16 §3): a sample payload read by a kind and a field map.

RevOps paste a payload (or pick one the source received), choose a kind, kind options and a
field map, and see the canonical lead it becomes, what goes to custom, the flags and whether the
kickoff would accept it. It reads the record exactly as the kickoff and the worker do
(``leads.sources.flatten``, then ``map_fields`` / ``is_a_lead`` and ``normalize``) and saves
nothing: the source keeps its kind and map until its own page is saved.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from django import forms
from django.conf import settings
from django.db.models import QuerySet

from leads.intake import intake_limits, records_split
from leads.models import Lead, RefusedPayload, RefusedState, Source
from leads.normalize import is_a_lead, map_fields, normalize
from leads.parsing import IntakeError, _parse_urlencoded, check_value, parse_json
from leads.services import NOT_A_LEAD_MESSAGE, fetch_notice
from leads.sources import flatten, kind_choices, kinds, options_masked, options_unmasked
from leads.sources.paths import field_map_errors

FORMAT_JSON = "json"
FORMAT_FORM = "form"
FORMAT_CHOICES = (
    (FORMAT_JSON, "JSON object"),
    (FORMAT_FORM, "Form-encoded (key=value&key=value)"),
)
# How many received payloads of each kind (leads, refusals) the page offers to pick from.
SAMPLES_PER_KIND = 20


class TryInputError(Exception):
    """Input the page cannot try: {form field: [messages]} (never a server error)."""

    def __init__(self, errors: Mapping[str, list[str]]) -> None:
        super().__init__("; ".join(m for messages in errors.values() for m in messages))
        self.errors = dict(errors)


@dataclass(frozen=True)
class TryResult:
    """A payload read as the source would read it with the kind and map tried; JSON pre-rendered."""

    record: dict[str, Any]
    flat: dict[str, Any]
    fields: dict[str, Any]
    custom: dict[str, Any]
    flags: tuple[str, ...]
    decoder_error: str
    accepted: bool
    verdict: str
    changed: tuple[str, ...]  # what differs from the source as saved: "kind", "field map", ...
    # Leads the kickoff would take from it whose person the worker fetches (Meta's leadgen).
    fetched_later: int = 0
    record_json: str = ""
    flat_json: str = ""
    fields_json: str = ""
    custom_json: str = ""


@dataclass(frozen=True)
class Sample:
    """A payload the source received, offered on the page: ``key`` is ``lead:<id>`` or
    ``refused:<id>``."""

    key: str
    label: str
    text: str = field(default="", repr=False)
    fmt: str = FORMAT_JSON


def pretty(value: Any) -> str:
    """``value`` as indented JSON for display (anything not JSON as its text)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def max_payload_bytes() -> int:
    """The largest payload the page tries: the intake's own body limit (it refuses larger)."""
    return int(settings.INTAKE_MAX_BODY_BYTES)


def too_big_message(size: int | None = None) -> str:
    limit = max_payload_bytes()
    got = f" ({size:,} bytes)" if size is not None else ""
    return (
        f"The payload is too large{got}: the intake takes at most {limit:,} bytes "
        "(INTAKE_MAX_BODY_BYTES), so a larger one would never be accepted."
    )


def payload_read(text: str, fmt: str) -> dict[str, Any]:
    """The pasted text as the intake reads a body: one JSON object or one form; IntakeError's
    message says what is wrong."""
    body = text.encode("utf-8", "surrogatepass")
    if len(body) > max_payload_bytes():
        raise IntakeError(413, "body_too_large", too_big_message(len(body)))
    if not text.strip():
        raise IntakeError(400, "invalid_body", "Paste a payload, or pick one the source received.")
    limits = intake_limits()
    if fmt == FORMAT_FORM:
        # The intake's own reading of a form body, so that a form reads here as it does there;
        # a pasted line's ends (and a leading "?" copied from a URL) are not part of it.
        record = _parse_urlencoded(text.strip().removeprefix("?").encode("utf-8"), limits)
        if not record:
            raise IntakeError(400, "invalid_body", "No key=value pair in the form payload.")
        check_value(record, limits)
        return record
    if fmt != FORMAT_JSON:
        raise IntakeError(400, "invalid_body", f"Unknown payload format {fmt!r}.")
    value = parse_json(body, limits)
    if not isinstance(value, dict):
        kind = "a list" if isinstance(value, list) else f"a {type(value).__name__}"
        raise IntakeError(400, "invalid_body", f"The payload must be a JSON object, not {kind}.")
    return value


def json_config_read(text: str, what: str) -> Any:
    """Kind options or a field map typed as JSON: blank is ``{}``; bounded like a body."""
    if not text.strip():
        return {}
    try:
        return parse_json(text.encode("utf-8", "surrogatepass"), intake_limits())
    except IntakeError as error:
        raise forms.ValidationError(f"The {what}: {error.message}") from None


def _config_errors(kind: str, kind_options: Any, field_map: Any) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    if kind not in kinds():
        errors["kind"] = [f"Unknown kind {kind!r}; choose one of: {', '.join(sorted(kinds()))}."]
    if not isinstance(kind_options, dict):
        errors["kind_options"] = ["The kind options must be a JSON object."]
    if not isinstance(field_map, dict):
        errors["field_map"] = [
            'The field map must be a JSON object: {"raw key or path": "canonical field"}.'
        ]
    else:
        bad_paths = field_map_errors(field_map)
        if bad_paths:
            errors["field_map"] = [f"{key}: {message}" for key, message in bad_paths.items()]
    return errors


def source_try(
    *,
    source: Source,
    text: str,
    fmt: str,
    kind: str,
    kind_options: Any,
    field_map: Any,
) -> TryResult:
    """``text`` read with ``kind``, ``kind_options`` and ``field_map`` as the kickoff and the
    worker would read it for ``source``; nothing is saved. TryInputError for unusable input."""
    edited = {} if kind_options is None else kind_options
    kind_options = options_unmasked(edited, source.kind_options)
    field_map = {} if field_map is None else field_map
    errors = _config_errors(kind, kind_options, field_map)
    record: dict[str, Any] = {}
    try:
        record = payload_read(text, fmt)
    except IntakeError as error:
        errors["payload"] = [error.message]
    if errors:
        raise TryInputError(errors)

    mapping = field_map or None  # as source_flatten and the worker pass a source's map
    # As the kickoff: a body its kind splits (Meta's batched leadgen changes) is several records.
    parts = records_split(kind=kind, options=kind_options, record=record)
    flat = flatten(parts[0], kind=kind, field_map=mapping, options=kind_options)
    canonical, _custom = map_fields(flat.record, mapping)
    accepted = is_a_lead(canonical)
    lead = normalize(flat.record, mapping)
    notice = None if accepted else fetch_notice(kind=kind, options=kind_options, record=parts[0])
    fetched_later = 0
    if notice == "":
        accepted = True
        fetched_later = len(parts)
        many = f"{fetched_later} leads" if fetched_later > 1 else "a lead"
        verdict = (
            f"Accepted: the kickoff would take it (202) as {many} waiting for the person, "
            "fetched from the Graph API by the worker with the source's page access token "
            "(this notification carries only the lead's id, leadgen_id), then routed. The "
            "canonical lead below is the notification's; the person's fields come with the fetch."
        )
    elif accepted:
        verdict = "Accepted: the kickoff would take it (202) and the worker store this lead."
    else:
        verdict = f"Refused as not_a_lead (422). {NOT_A_LEAD_MESSAGE}{notice or ''}"
        if flat.decoder_error:
            verdict += f" (The {kind} decoder failed: {flat.decoder_error})"
    changed = tuple(
        name
        for name, tried, saved in (
            ("kind", kind, source.kind or "generic"),
            ("kind options", kind_options, source.kind_options or {}),
            ("field map", field_map, source.field_map or {}),
        )
        if tried != saved
    )
    return TryResult(
        record=record,
        flat=flat.record,
        fields=lead.fields,
        custom=lead.custom,
        # The flags a stored lead would carry: normalisation's and the reading's, as the worker.
        flags=tuple(sorted({*lead.flags, *flat.flags})),
        decoder_error=flat.decoder_error,
        accepted=accepted,
        verdict=verdict,
        changed=changed,
        fetched_later=fetched_later,
        record_json=pretty(record),
        flat_json=pretty(flat.record),
        fields_json=pretty(lead.fields),
        custom_json=pretty(lead.custom),
    )


# --- payloads the source received -------------------------------------------------------------


def _refused_sample(refused: RefusedPayload) -> Sample | None:
    """A refused body the page can try: a JSON object or a form (a SOAP body is not offered)."""
    raw = bytes(refused.body or b"")
    if len(raw) > max_payload_bytes():
        return None
    text = raw.decode("utf-8", "replace")
    label = f"Refused #{refused.pk}, {refused.received_at:%Y-%m-%d %H:%M} UTC ({refused.reason})"
    content_type = (refused.content_type or "").split(";")[0].strip().lower()
    if content_type == "application/x-www-form-urlencoded":
        return Sample(f"refused:{refused.pk}", label, text, FORMAT_FORM)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    return Sample(f"refused:{refused.pk}", label, text, FORMAT_JSON)


def _lead_label(lead: Lead) -> str:
    who = lead.email or lead.phone or lead.company or str(lead.pk)
    return f"Lead {who}, {lead.received_at:%Y-%m-%d %H:%M} UTC"


def source_samples(
    *, source: Source, leads: QuerySet[Lead] | None, with_refused: bool
) -> list[Sample]:
    """The newest leads and open refusals of ``source`` (without their text, for the choice).

    ``leads`` is the leads the person may see (None: none); refusals only ``with_refused``.
    """
    samples: list[Sample] = []
    if leads is not None:
        newest = (
            leads.filter(source=source)
            .order_by("-received_at")
            .only("id", "received_at", "email", "phone", "company")[:SAMPLES_PER_KIND]
        )
        samples.extend(Sample(f"lead:{lead.pk}", _lead_label(lead)) for lead in newest)
    if with_refused:
        # Only the open ones: what is still waiting for a fix of the source.
        refusals = RefusedPayload.objects.filter(source=source, state=RefusedState.OPEN).order_by(
            "-received_at", "-id"
        )
        offered = 0
        for refused in refusals[: SAMPLES_PER_KIND * 2]:  # a few may not be JSON or a form
            sample = _refused_sample(refused)
            if sample is not None:
                samples.append(Sample(sample.key, sample.label))
                offered += 1
            if offered == SAMPLES_PER_KIND:
                break
    return samples


def source_sample(
    *, source: Source, key: str, leads: QuerySet[Lead] | None, with_refused: bool
) -> Sample | None:
    """One received payload of ``source`` with its text, or None (unknown, another source's,
    or one the person may not see)."""
    what, _, ident = key.partition(":")
    if what == "lead" and leads is not None:
        try:
            lead = leads.filter(source=source, pk=ident).only("id", "raw_payload").first()
        except (ValueError, TypeError, forms.ValidationError):  # not a UUID
            return None
        if lead is None:
            return None
        return Sample(key, _lead_label(lead), pretty(lead.raw_payload), FORMAT_JSON)
    if what == "refused" and with_refused and ident.isdigit():
        refused = RefusedPayload.objects.filter(source=source, pk=int(ident)).first()
        return _refused_sample(refused) if refused is not None else None
    return None


# --- the admin page's form ---------------------------------------------------------------------


class SourceTryForm(forms.Form):
    """The try-it page's input: a payload (or a received one to load) and the reading to try."""

    sample = forms.ChoiceField(
        required=False,
        label="Received payload",
        help_text="One of the last payloads this source sent (leads, and open refusals).",
    )
    payload = forms.CharField(
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 16, "cols": 80, "spellcheck": "false"}),
        help_text="A JSON object, or a form body such as email=a%40b.com&company=Acme.",
    )
    fmt = forms.ChoiceField(
        choices=FORMAT_CHOICES,
        initial=FORMAT_JSON,
        widget=forms.RadioSelect,
        label="Payload format",
    )
    kind = forms.ChoiceField(choices=kind_choices, label="Kind")
    kind_options = forms.CharField(
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 80, "spellcheck": "false"}),
        help_text="A JSON object (what the kind needs to know about this source).",
    )
    field_map = forms.CharField(
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 8, "cols": 80, "spellcheck": "false"}),
        help_text='A JSON object: raw key or path → canonical field, e.g. {"payload.data.Email": '
        '"email"}.',
    )

    def __init__(self, *args: Any, samples: list[Sample] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        sample_field = cast(forms.ChoiceField, self.fields["sample"])
        sample_field.choices = [("", "—"), *((s.key, s.label) for s in samples or [])]

    @classmethod
    def initial_for(cls, source: Source) -> dict[str, Any]:
        """The source's current reading, which the page starts from."""
        return {
            "fmt": FORMAT_JSON,
            "kind": source.kind or "generic",
            "kind_options": pretty(options_masked(source.kind, source.kind_options or {})),
            "field_map": pretty(source.field_map or {}),
        }

    def clean_kind_options(self) -> Any:
        return json_config_read(self.cleaned_data.get("kind_options") or "", "kind options")

    def clean_field_map(self) -> Any:
        return json_config_read(self.cleaned_data.get("field_map") or "", "field map")

    @classmethod
    def too_big(cls, source: Source, samples: list[Sample] | None = None) -> SourceTryForm:
        """The form at the source's reading, with the payload refused as too large."""
        form = cls({**cls.initial_for(source), "payload": ""}, samples=samples)
        form.is_valid()
        form.add_error("payload", too_big_message())
        return form


def posted_too_big(meta: Mapping[str, Any]) -> bool:
    """Whether Django would refuse to read a POST with this environ (RequestDataTooBig)."""
    try:
        length = int(meta.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return False
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return limit is not None and length > limit
