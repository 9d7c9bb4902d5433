"""The source admin: new tokens and HMAC secrets are shown once, in the page, never in a cookie."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from leads.models import Source, token_digest
from tests.leads.factories import SourceFactory

pytestmark = pytest.mark.django_db


def _shown(response: Any) -> list[str]:
    assert response.status_code == 200
    return re.findall(r'<code class="new-secret">([^<]+)</code>', response.content.decode())


def _in_no_cookie(response: Any, value: str) -> None:
    headers = [str(morsel) for morsel in response.cookies.values()]
    assert all(value not in header for header in headers)


def _rotate(client: Client, action: str, source: Source) -> Any:
    return client.post(
        reverse("admin:leads_source_changelist"),
        {"action": action, "_selected_action": [source.pk]},
    )


@pytest.mark.parametrize("overlap_hours", [48, 0])
def test_rotating_a_token_shows_it_once_in_the_page(
    admin_client: Client, settings: Any, overlap_hours: int
) -> None:
    settings.SOURCE_TOKEN_OVERLAP_HOURS = overlap_hours
    source = SourceFactory(slug="webform")
    response = _rotate(admin_client, "rotate_token", source)
    (token,) = _shown(response)
    source.refresh_from_db()
    assert source.token_hash == token_digest(token)
    _in_no_cookie(response, token)
    page = response.content.decode()
    if overlap_hours:
        assert f"keeps working until {source.previous_token_valid_until:%Y-%m-%d %H:%M}" in page
    else:
        assert source.previous_token_valid_until is None
        assert "stopped working now" in page


def test_rotating_the_token_of_a_source_without_one_works(admin_client: Client) -> None:
    source = SourceFactory(slug="fresh", token_hash="", token_hint="")
    (token,) = _shown(_rotate(admin_client, "rotate_token", source))
    assert Source.objects.get(pk=source.pk).token_hash == token_digest(token)


def test_rotating_an_hmac_secret_shows_it_once_in_the_page(admin_client: Client) -> None:
    source = SourceFactory(slug="signed", auth_mode="hmac")
    first = _shown(_rotate(admin_client, "rotate_hmac_secret", source))  # none before
    response = _rotate(admin_client, "rotate_hmac_secret", source)
    (secret,) = _shown(response)
    source.refresh_from_db()
    assert source.hmac_secret == secret
    assert source.previous_hmac_secret == first[0]
    assert "keeps working until" in response.content.decode()
    _in_no_cookie(response, secret)


def test_a_new_source_shows_its_token_and_secret_in_the_page(admin_client: Client) -> None:
    response = admin_client.post(
        reverse("admin:leads_source_add"),
        {
            "slug": "partner",
            "name": "Partner",
            "active": "on",
            "auth_mode": "token_and_hmac",
            "field_map": "{}",
            "rate_limit_per_minute": "60",
        },
    )
    token, secret = _shown(response)
    source = Source.objects.get(slug="partner")
    assert (source.token_hash, source.hmac_secret) == (token_digest(token), secret)
    for value in (token, secret):
        _in_no_cookie(response, value)


def test_a_secret_kind_option_is_redacted_in_the_configuration_audit() -> None:
    from audit.config_changes import REDACTED, changes_between

    changes = changes_between(
        {"kind_options": {"verify_token": "old-vt", "questions": {"1": "email"}}},
        {"kind_options": {"verify_token": "new-vt", "questions": {"1": "email"}}},
    )
    assert changes == {
        "kind_options": {
            "before": {"verify_token": REDACTED, "questions": {"1": "email"}},
            "after": {"verify_token": REDACTED, "questions": {"1": "email"}},
        }
    }
