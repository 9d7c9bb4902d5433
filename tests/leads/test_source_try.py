"""Try it before you trust it (issue 16 §3): the service and the admin page of a source."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from leads import sources
from leads.models import RefusedPayload, RefusedState, Source
from leads.tryit import FORMAT_FORM, FORMAT_JSON, TryInputError, source_try
from tests.leads.factories import LeadFactory, SourceFactory

pytestmark = pytest.mark.django_db

# A HubSpot v1 contact as a workflow webhook posts it: every value below the top level.
HUBSPOT = {
    "vid": 3234574,
    "portal-id": 62515,
    "properties": {
        "email": {"value": "jana.novak@acme.de", "versions": [{"value": "jana.novak@acme.de"}]},
        "firstname": {"value": "Jana"},
        "lastname": {"value": "Novák"},
        "company": {"value": "Acme GmbH"},
        "country": {"value": "Germany"},
        "lead_source": {"value": "Messe Hannover"},
    },
}
# No canonical key anywhere: only a field map with a path makes it a lead.
UNMAPPED = {"submission": {"answers": {"Buzon": "ana@acme.es", "Nacion": "Spain"}}}


def _try(source: Source, payload: Any, **changes: Any) -> Any:
    args: dict[str, Any] = {
        "source": source,
        "text": payload if isinstance(payload, str) else json.dumps(payload),
        "fmt": FORMAT_JSON,
        "kind": source.kind,
        "kind_options": source.kind_options,
        "field_map": source.field_map,
    }
    return source_try(**{**args, **changes})


def _url(source: Source) -> str:
    return reverse("admin:leads_source_try", args=[source.pk])


def _form(source: Source, payload: Any = "", **changes: Any) -> dict[str, str]:
    data = {
        "payload": payload if isinstance(payload, str) else json.dumps(payload),
        "fmt": FORMAT_JSON,
        "kind": source.kind,
        "kind_options": json.dumps(source.kind_options),
        "field_map": json.dumps(source.field_map),
        "_try": "Try it",
    }
    return {**data, **changes}


def _errors(response: Any) -> str:
    """The text of the form's error lists on the page."""
    html = response.content.decode()
    return " ".join(re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', html, re.S))


# --- the service ---------------------------------------------------------------------------


def test_a_nested_payload_read_by_its_kind_becomes_the_canonical_lead() -> None:
    source = SourceFactory(kind="hubspot")
    result = _try(source, HUBSPOT)
    assert result.accepted
    assert result.fields["email"] == "jana.novak@acme.de"
    assert result.fields["country"] == "DE"
    assert result.fields["external_id"] == "3234574"
    assert "found_below_top_level" not in result.flags
    assert result.changed == ()
    assert '"jana.novak@acme.de"' in result.fields_json
    assert result.record == HUBSPOT


def test_the_generic_kind_finds_it_below_the_top_level_and_says_so() -> None:
    source = SourceFactory(kind="generic")
    result = _try(source, HUBSPOT)
    assert result.accepted
    assert result.fields["email"] == "jana.novak@acme.de"
    assert "found_below_top_level" in result.flags
    assert "external_id" not in result.fields


def test_a_field_map_path_makes_a_lead_of_what_was_refused() -> None:
    source = SourceFactory()
    refused = _try(source, UNMAPPED)
    assert not refused.accepted
    assert "not_a_lead" in refused.verdict
    assert refused.fields == {}
    mapped = _try(
        source,
        UNMAPPED,
        field_map={"submission.answers.Buzon": "email", "submission.answers.Nacion": "country"},
    )
    assert mapped.accepted
    assert (mapped.fields["email"], mapped.fields["country"]) == ("ana@acme.es", "ES")
    assert mapped.changed == ("field map",)
    assert "submission" in mapped.custom  # the raw structure stays in custom, as the worker keeps


def test_custom_and_normalisation_flags_are_shown() -> None:
    source = SourceFactory()
    result = _try(source, {"email": "someone@gmail.com", "country": "Atlantis", "Budget": "10k"})
    assert result.accepted
    assert result.custom["Budget"] == "10k"
    assert "free_email" in result.flags
    assert "unknown_country" in result.flags


def test_a_form_encoded_payload_is_read_like_the_intake_reads_a_form() -> None:
    source = SourceFactory()
    result = _try(
        source, "?email=max%40example.de&company=Beispiel+AG&tag=a&tag=b\n", fmt=FORMAT_FORM
    )
    assert result.accepted
    assert result.record == {"email": "max@example.de", "company": "Beispiel AG", "tag": ["a", "b"]}
    assert result.fields["company"] == "Beispiel AG"


def test_a_decoder_that_fails_is_flagged_with_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(record: Any, options: Any) -> Any:
        raise KeyError("form_response")

    real = sources.kind_get
    broken_kind = dataclasses.replace(real("typeform"), decode=broken)
    monkeypatch.setattr(sources, "kind_get", lambda name: broken_kind)
    result = _try(SourceFactory(), {"email": "a@acme.de"}, kind="typeform")
    assert "decoder_failed" in result.flags
    assert "KeyError" in result.decoder_error
    assert result.accepted  # read generically instead, as the kickoff does


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"text": "{not json"}, "payload", "not valid JSON"),
        ({"text": "[1, 2]"}, "payload", "must be a JSON object, not a list"),
        ({"text": '"x"'}, "payload", "must be a JSON object, not a str"),
        ({"text": "[" * 40 + "]" * 40}, "payload", "nested deeper than"),
        ({"text": '{"a": 1, "a": 2}'}, "payload", "Duplicate key"),
        ({"text": "  "}, "payload", "Paste a payload"),
        ({"text": "", "fmt": FORMAT_FORM}, "payload", "Paste a payload"),
        ({"text": "&&", "fmt": FORMAT_FORM}, "payload", "No key=value pair"),
        ({"kind": "nosuchtool"}, "kind", "Unknown kind 'nosuchtool'"),
        ({"kind_options": [1]}, "kind_options", "must be a JSON object"),
        ({"field_map": ["email"]}, "field_map", "must be a JSON object"),
        ({"field_map": {"a..b": "email"}}, "field_map", "a..b: empty step"),
        ({"field_map": {"answers[x": "email"}}, "field_map", "unclosed '['"),
    ],
)
def test_unusable_input_is_an_error_per_field(changes: Any, field: str, message: str) -> None:
    with pytest.raises(TryInputError) as raised:
        _try(SourceFactory(), {"email": "a@acme.de"}, **changes)
    assert message in " ".join(raised.value.errors[field])


def test_a_payload_over_the_intake_limit_is_refused(settings: Any) -> None:
    settings.INTAKE_MAX_BODY_BYTES = 100
    with pytest.raises(TryInputError) as raised:
        _try(SourceFactory(), {"email": "a@acme.de", "note": "x" * 200})
    assert "too large" in raised.value.errors["payload"][0]
    assert "INTAKE_MAX_BODY_BYTES" in raised.value.errors["payload"][0]


# --- the admin page --------------------------------------------------------------------------


def test_the_change_page_links_to_the_try_page(admin_client: Client) -> None:
    source = SourceFactory(kind="hubspot", field_map={"Org": "company"})
    change = admin_client.get(reverse("admin:leads_source_change", args=[source.pk]))
    assert change.status_code == 200
    assert f'href="{_url(source)}"' in change.content.decode()
    assert "Try a payload" in change.content.decode()
    page = admin_client.get(_url(source))
    assert page.status_code == 200
    form = page.context["form"]
    assert form.initial["kind"] == "hubspot"
    assert json.loads(form.initial["field_map"]) == {"Org": "company"}
    assert page.context["result"] is None


def test_a_nested_hubspot_payload_shows_the_canonical_lead(admin_client: Client) -> None:
    source = SourceFactory(kind="hubspot")
    response = admin_client.post(_url(source), _form(source, HUBSPOT))
    assert response.status_code == 200
    result = response.context["result"]
    assert result.accepted
    assert result.fields["country"] == "DE"
    html = response.content.decode()
    assert "jana.novak@acme.de" in html
    assert "Accepted" in html
    assert 'id="try-lead"' in html


def test_a_kind_changed_in_the_form_changes_the_result_without_saving(
    admin_client: Client,
) -> None:
    source = SourceFactory(kind="generic", field_map={"Org": "company"})
    before = admin_client.post(_url(source), _form(source, HUBSPOT)).context["result"]
    assert "found_below_top_level" in before.flags
    response = admin_client.post(
        _url(source),
        _form(source, HUBSPOT, kind="hubspot", field_map=json.dumps({"Firma": "company"})),
    )
    after = response.context["result"]
    assert "found_below_top_level" not in after.flags
    assert after.fields["external_id"] == "3234574"
    assert after.changed == ("kind", "field map")
    assert "not saved" in response.content.decode()
    source.refresh_from_db()
    assert (source.kind, source.field_map) == ("generic", {"Org": "company"})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"payload": "{not json"}, "not valid JSON"),
        ({"payload": "[" * 40 + "]" * 40}, "nested deeper than 32 levels"),
        ({"payload": '["email", "a@b.de"]'}, "must be a JSON object"),
        ({"payload": "12"}, "must be a JSON object"),
        ({"payload": ""}, "Paste a payload"),
        ({"field_map": '{"a..b": "email"}'}, "a..b: empty step at character 3"),
        ({"field_map": '{"email": "email"'}, "The field map: The body is not valid JSON"),
        ({"field_map": "[1]"}, "The field map must be a JSON object"),
        ({"kind_options": '["x"]'}, "The kind options must be a JSON object"),
        ({"kind_options": "{" * 40}, "The kind options"),
        ({"kind": "nosuchtool"}, "Select a valid choice"),
        ({"fmt": "xml"}, "Select a valid choice"),
        ({"sample": "lead:nope"}, "Select a valid choice"),
    ],
)
def test_bad_input_is_a_form_error_never_a_500(
    admin_client: Client, changes: dict[str, str], message: str
) -> None:
    source = SourceFactory()
    data = {**_form(source, {"email": "a@acme.de"}), **changes}
    response = admin_client.post(_url(source), data)
    assert response.status_code == 200
    assert response.context["result"] is None
    assert message in _errors(response)


def test_a_paste_over_the_intake_limit_is_a_form_error(admin_client: Client, settings: Any) -> None:
    settings.INTAKE_MAX_BODY_BYTES = 1000
    source = SourceFactory()
    response = admin_client.post(_url(source), _form(source, {"note": "x" * 2000}))
    assert response.status_code == 200
    assert "The payload is too large (2,012 bytes)" in _errors(response)


def test_a_post_django_would_not_read_is_a_form_error_not_a_400(
    django_user_model: Any, settings: Any
) -> None:
    """Over DATA_UPLOAD_MAX_MEMORY_SIZE Django raises RequestDataTooBig on reading the POST
    (the CSRF middleware reads it first): the page answers with its form instead."""
    settings.INTAKE_MAX_BODY_BYTES = 1000
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 5000
    source = SourceFactory(kind="hubspot")
    user = django_user_model.objects.create_superuser("revops", "revops@example.com", "pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    page = client.get(_url(source))
    token = page.cookies["csrftoken"].value
    data = {**_form(source, {"note": "x" * 20_000}), "csrfmiddlewaretoken": token}
    response = client.post(_url(source), data)
    assert response.status_code == 200
    assert "The payload is too large" in _errors(response)
    assert response.context["form"]["kind"].value() == "hubspot"
    # Within the limits the CSRF check still holds: without the token, refused.
    small = _form(source, {"email": "a@acme.de"})
    assert client.post(_url(source), small).status_code == 403
    ok = client.post(_url(source), {**small, "csrfmiddlewaretoken": token})
    assert ok.status_code == 200
    assert ok.context["result"].accepted


def test_picking_a_received_lead_tries_its_raw_payload(admin_client: Client) -> None:
    source = SourceFactory(kind="hubspot")
    lead = LeadFactory(source=source, raw_payload=HUBSPOT, email="jana.novak@acme.de")
    LeadFactory(source=SourceFactory(), email="other@acme.de")  # another source's: not offered
    page = admin_client.get(_url(source))
    offered = dict(page.context["form"].fields["sample"].choices)
    assert f"lead:{lead.pk}" in offered
    assert "jana.novak@acme.de" in offered[f"lead:{lead.pk}"]
    assert not any("other@acme.de" in label for label in offered.values())
    response = admin_client.post(
        _url(source), _form(source, "", sample=f"lead:{lead.pk}", _load="1")
    )
    assert response.status_code == 200
    result = response.context["result"]
    assert result.record == HUBSPOT
    assert result.fields["email"] == "jana.novak@acme.de"
    assert json.loads(response.context["form"]["payload"].value()) == HUBSPOT


def test_picking_an_open_refused_payload_tries_it_with_the_edited_map(
    admin_client: Client,
) -> None:
    source = SourceFactory()
    refused = RefusedPayload.objects.create(
        source=source,
        content_type="application/json",
        body=json.dumps(UNMAPPED).encode(),
        status_code=422,
        reason="not_a_lead",
    )
    soap = RefusedPayload.objects.create(
        source=source, content_type="text/xml", body=b"<soap/>", status_code=415, reason="x"
    )
    form_body = RefusedPayload.objects.create(
        source=source,
        content_type="application/x-www-form-urlencoded",
        body=b"Buzon=lu%40acme.es",
        status_code=422,
        reason="not_a_lead",
    )
    dismissed = RefusedPayload.objects.create(
        source=source,
        content_type="application/json",
        body=b"{}",
        status_code=422,
        reason="not_a_lead",
        state=RefusedState.DISMISSED,
    )
    offered = dict(admin_client.get(_url(source)).context["form"].fields["sample"].choices)
    assert f"refused:{refused.pk}" in offered
    assert f"refused:{form_body.pk}" in offered
    assert f"refused:{soap.pk}" not in offered
    assert f"refused:{dismissed.pk}" not in offered

    field_map = json.dumps({"submission.answers.Buzon": "email"})
    response = admin_client.post(
        _url(source),
        _form(source, "", sample=f"refused:{refused.pk}", _load="1", field_map=field_map),
    )
    result = response.context["result"]
    assert result.accepted
    assert result.fields["email"] == "ana@acme.es"
    response = admin_client.post(
        _url(source),
        _form(source, "", sample=f"refused:{form_body.pk}", _load="1", field_map="{}"),
    )
    assert response.context["form"]["fmt"].value() == FORMAT_FORM
    assert response.context["result"].record == {"Buzon": "lu@acme.es"}
    assert not response.context["result"].accepted
    source.refresh_from_db()
    assert source.field_map == {}


def test_view_permission_is_enough_and_sees_no_payloads_it_may_not_see(
    django_user_model: Any, client: Client
) -> None:
    source = SourceFactory()
    LeadFactory(source=source)
    user = django_user_model.objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    client.force_login(user)
    assert client.get(_url(source)).status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_source"))
    page = client.get(_url(source))
    assert page.status_code == 200
    assert list(page.context["form"].fields["sample"].choices) == [("", "—")]
    response = client.post(_url(source), _form(source, {"email": "a@acme.de"}))
    assert response.context["result"].accepted


def test_an_unknown_source_redirects_to_the_admin_index(admin_client: Client) -> None:
    response = admin_client.get(reverse("admin:leads_source_try", args=[999_999]))
    assert response.status_code == 302
