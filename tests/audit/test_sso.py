"""Single sign-on (OpenID Connect) through a stand-in provider speaking the protocol.

Django's test client plays the browser on LeadRouter's side, ``requests`` follows the redirect
through the real provider server (tests/support/oidc_provider.py) and back.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import requests
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import authenticate
from django.contrib.auth.models import User
from django.core.cache import cache
from django.db import connection
from django.test import Client
from pytest_httpserver import HTTPServer

from audit.models import Event, EventType
from audit.sso import discovery_cache_key
from routing.models import Rep
from tests.audit.test_pages import manager
from tests.routing.factories import RepFactory
from tests.support.oidc_provider import CLIENT_ID, CLIENT_SECRET, OidcProvider

pytestmark = pytest.mark.django_db

CALLBACK = "http://testserver/accounts/sso/callback/"


@pytest.fixture
def provider() -> Iterator[OidcProvider]:
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    try:
        yield OidcProvider(server, redirect_uris=[CALLBACK])
    finally:
        server.clear()
        server.stop()


@pytest.fixture
def sso(provider: OidcProvider, settings: Any) -> OidcProvider:
    settings.SSO_ENABLED = True
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
    settings.OIDC_OP_ISSUER = provider.issuer
    settings.OIDC_PROVIDER_NAME = "Standin ID"
    settings.OIDC_TIMEOUT = 1.0
    cache.delete(discovery_cache_key(provider.issuer))
    return provider


def _to_provider(client: Client, next_url: str = "") -> str:
    """LeadRouter's redirect to the provider's /authorize."""
    start = client.get("/accounts/sso/start/" + (f"?next={next_url}" if next_url else ""))
    assert start.status_code == 302, start.content
    return str(start["Location"])


def _through_provider(authorize_url: str) -> str:
    """The provider's redirect back to LeadRouter's callback, as a path with its query."""
    answer = requests.get(authorize_url, allow_redirects=False, timeout=5)
    assert answer.status_code == 302, answer.text
    back = urlsplit(answer.headers["Location"])
    assert f"{back.scheme}://{back.netloc}{back.path}" == CALLBACK
    return f"{back.path}?{back.query}"


def _sign_in(client: Client) -> Any:
    return client.get(_through_provider(_to_provider(client)))


def _landing(client: Client, response: Any) -> Any:
    assert response.status_code == 302, response.content
    return client.get(response["Location"], follow=True)


def _refused(response: Any, status: int, words: str) -> str:
    assert response.status_code == status, response.content
    page = response.content.decode()
    assert 'id="sso-reason"' in page
    assert words in page, page
    return page


def _signed_in_user(client: Client) -> int | None:
    user_id = client.session.get("_auth_user_id")
    return int(user_id) if user_id is not None else None


# --- Off unless configured -----------------------------------------------------------------------


def test_without_configuration_the_login_page_and_password_login_are_as_before(
    client: Client,
) -> None:
    page = client.get("/accounts/login/").content.decode()
    assert "Sign in with" not in page
    assert 'name="password"' in page
    assert client.get("/accounts/sso/start/").status_code == 404
    assert client.get("/accounts/sso/callback/?code=x&state=y").status_code == 404
    assert "id_password" in client.get("/admin/login/?next=/admin/").content.decode()
    manager("mia")
    answer = client.post("/accounts/login/", {"username": "mia", "password": "pw-mia-123"})
    assert answer.status_code == 302
    assert answer["Location"] == "/"


def test_when_configured_the_admin_sends_people_to_the_login_page_that_offers_it(
    client: Client, sso: OidcProvider
) -> None:
    answer = client.get("/admin/", follow=True)
    assert answer.redirect_chain[-1][0] == "/accounts/login/?next=/admin/"
    assert "Sign in with Standin ID" in answer.content.decode()


def test_when_configured_the_login_page_offers_the_provider_beside_the_password_form(
    client: Client, sso: OidcProvider
) -> None:
    page = client.get("/accounts/login/?next=/dashboard/").content.decode()
    assert "Sign in with Standin ID" in page
    assert 'href="/accounts/sso/start/?next=/dashboard/"' in page
    assert 'name="password"' in page
    assert sso.calls == []  # the page alone never calls the provider


# --- Who gets in ---------------------------------------------------------------------------------


def test_a_rep_without_a_login_signs_in_gets_one_and_lands_on_their_page(
    client: Client, sso: OidcProvider
) -> None:
    rep = RepFactory(name="Ana", email="ana@example.com")
    sso.person("Ana@Example.com", name="Ana")
    page = _landing(client, _sign_in(client))
    assert page.redirect_chain[-1][0] == "/me/"
    assert "My leads" in page.content.decode()
    rep.refresh_from_db()
    assert rep.user is not None
    assert rep.user.username == "ana@example.com"
    assert not rep.user.has_usable_password()
    assert _signed_in_user(client) == rep.user.pk
    linked = Event.objects.get(type=EventType.CONFIG_CHANGED, data__action="sso_linked")
    assert linked.actor == "sso:ana@example.com"
    assert linked.data["login_created"] is True
    # The code flow as specified: PKCE verifier sent, the key fetched from the JWKS.
    token_call = next(values for path, values in sso.calls if path == "/token")
    assert token_call["code_verifier"]
    assert token_call["grant_type"] == "authorization_code"
    assert any(path == "/jwks" for path, _ in sso.calls)


def test_a_rep_with_a_login_signs_in_as_it_and_nothing_is_made(
    client: Client, sso: OidcProvider
) -> None:
    user = User.objects.create_user("ana", email="")
    rep = RepFactory(email="ana@example.com", user=user)
    sso.person("ana@example.com")
    page = _landing(client, _sign_in(client))
    assert page.redirect_chain[-1][0] == "/me/"
    assert _signed_in_user(client) == user.pk
    assert User.objects.count() == 1
    rep.refresh_from_db()
    assert rep.user_id == user.pk


def test_a_manager_is_matched_to_their_login_and_lands_on_the_history(
    client: Client, sso: OidcProvider
) -> None:
    mia = manager("mia")
    mia.email = "Mia@Example.com"
    mia.is_staff = True
    mia.save()
    sso.person("mia@example.com")
    page = _landing(client, _sign_in(client))
    assert page.redirect_chain[-1][0] == "/history/"
    assert _signed_in_user(client) == mia.pk
    assert User.objects.count() == 1


def test_the_next_page_survives_the_round_trip(client: Client, sso: OidcProvider) -> None:
    manager("mia").__class__.objects.filter(username="mia").update(email="mia@example.com")
    sso.person("mia@example.com")
    answer = client.get(_through_provider(_to_provider(client, "/dashboard/")))
    assert answer.status_code == 302
    assert answer["Location"] == "/dashboard/"


def test_an_unknown_email_is_refused_with_a_page_and_no_login_is_made(
    client: Client, sso: OidcProvider
) -> None:
    sso.person("stranger@example.com")
    _refused(_sign_in(client), 403, "has no LeadRouter login and is not a rep")
    assert not User.objects.exists()
    assert _signed_in_user(client) is None


@pytest.mark.parametrize("verified", [False, "false"])
def test_an_email_the_provider_has_not_verified_is_refused(
    client: Client, sso: OidcProvider, verified: Any
) -> None:
    RepFactory(email="ana@example.com")
    sso.person("ana@example.com", verified=verified)
    _refused(_sign_in(client), 403, "has not verified the e-mail")
    assert not User.objects.exists()


def test_an_inactive_rep_gets_no_login(client: Client, sso: OidcProvider) -> None:
    RepFactory(email="ana@example.com", active=False)
    sso.person("ana@example.com")
    _refused(_sign_in(client), 403, "has no LeadRouter login")
    assert not User.objects.exists()


def test_a_disabled_login_is_refused(client: Client, sso: OidcProvider) -> None:
    User.objects.create_user("mia", email="mia@example.com", is_active=False)
    sso.person("mia@example.com")
    _refused(_sign_in(client), 403, "is disabled")
    assert _signed_in_user(client) is None


def test_only_the_allowed_email_domains_sign_in(
    client: Client, sso: OidcProvider, settings: Any
) -> None:
    settings.OIDC_ALLOWED_EMAIL_DOMAINS = ["example.com"]
    RepFactory(email="ana@partner.example")
    sso.person("ana@partner.example")
    _refused(_sign_in(client), 403, "at partner.example may not sign in")
    assert not User.objects.exists()


# --- What the provider sends must hold -----------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "other_key"),
    [
        pytest.param({}, True, id="signed-by-another-key"),
        pytest.param({"aud": "another-client"}, False, id="wrong-audience"),
        pytest.param(
            {"exp": int(time.time()) - 3600, "iat": int(time.time()) - 7200},
            False,
            id="expired",
        ),
        pytest.param({"iss": "https://idp.invalid"}, False, id="wrong-issuer"),
        pytest.param({"nonce": "another-sign-in"}, False, id="wrong-nonce"),
    ],
)
def test_an_id_token_that_does_not_hold_is_refused_never_a_500(
    client: Client, sso: OidcProvider, change: dict[str, Any], other_key: bool
) -> None:
    RepFactory(email="ana@example.com")
    sso.person("ana@example.com")
    sso.id_token_claims = change
    sso.sign_with_other_key = other_key
    _refused(_sign_in(client), 403, "could not be verified")
    assert not User.objects.exists()
    assert _signed_in_user(client) is None


def test_a_state_this_browser_did_not_start_is_refused(client: Client, sso: OidcProvider) -> None:
    RepFactory(email="ana@example.com")
    sso.person("ana@example.com")
    back = _through_provider(_to_provider(client))
    query = parse_qs(urlsplit(back).query)
    forged = urlencode({"code": query["code"][0], "state": "not-the-state-we-sent"})
    _refused(client.get(f"/accounts/sso/callback/?{forged}"), 400, "not started from this")
    # Another browser (no sign-in started at all) gets a page too.
    _refused(Client().get(back), 403, "did not complete")
    assert _signed_in_user(client) is None
    assert not any(path == "/token" for path, _ in sso.calls)


def test_a_callback_replayed_is_refused(client: Client, sso: OidcProvider) -> None:
    RepFactory(email="ana@example.com")
    sso.person("ana@example.com")
    back = _through_provider(_to_provider(client))
    assert client.get(back).status_code == 302
    client.logout()
    _refused(client.get(back), 403, "did not complete")


def test_a_person_who_cancels_at_the_provider_is_told(client: Client, sso: OidcProvider) -> None:
    sso.person("ana@example.com")
    sso.deny = True
    _refused(_sign_in(client), 403, "did not sign you in (access_denied)")


# --- A provider that is down or slow -------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_provider_that_is_down_is_a_clear_page(client: Client, sso: Any, settings: Any) -> None:
    settings.OIDC_OP_ISSUER = f"http://127.0.0.1:{_closed_port()}"
    answer = client.get("/accounts/sso/start/")
    page = _refused(answer, 503, "Standin ID cannot be reached")
    assert answer["Retry-After"]
    assert "is not answering" in page


def test_a_provider_slower_than_the_timeout_is_a_clear_page_in_bounded_time(
    client: Client, sso: OidcProvider
) -> None:
    RepFactory(email="ana@example.com")
    sso.person("ana@example.com")
    back = _through_provider(_to_provider(client))
    sso.delay_seconds = 3.0  # the token endpoint hangs past OIDC_TIMEOUT (1 s)
    started = time.monotonic()
    answer = client.get(back)
    assert time.monotonic() - started < 2.5
    _refused(answer, 503, "did not answer in time")
    assert not User.objects.exists()


def test_explicit_endpoints_need_no_discovery(
    client: Client, sso: OidcProvider, settings: Any
) -> None:
    settings.OIDC_OP_ISSUER = ""
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = sso.issuer + "/authorize"
    settings.OIDC_OP_TOKEN_ENDPOINT = sso.issuer + "/token"
    settings.OIDC_OP_USER_ENDPOINT = sso.issuer + "/userinfo"
    settings.OIDC_OP_JWKS_ENDPOINT = sso.issuer + "/jwks"
    RepFactory(email="ana@example.com")
    sso.person("ana@example.com")
    assert _landing(client, _sign_in(client)).redirect_chain[-1][0] == "/me/"
    assert not any("well-known" in path for path, _ in sso.calls)


def test_a_password_login_never_calls_the_provider(client: Client, sso: OidcProvider) -> None:
    manager("mia")
    answer = client.post(
        "/accounts/login/?code=abc&state=def", {"username": "mia", "password": "pw-mia-123"}
    )
    assert answer.status_code == 302
    assert sso.calls == []


# --- Passwords for administrators only (optional) ------------------------------------------------


def test_the_password_form_can_be_kept_for_superusers(
    client: Client, sso: OidcProvider, settings: Any
) -> None:
    settings.OIDC_PASSWORD_LOGIN_SUPERUSERS_ONLY = True
    page = client.get("/accounts/login/").content.decode()
    assert "Sign in with Standin ID" in page
    assert 'name="password"' not in page
    assert 'id="password-login"' in page
    assert 'name="password"' in client.get("/accounts/login/?password=1").content.decode()
    manager("mia")
    refused = client.post("/accounts/login/", {"username": "mia", "password": "pw-mia-123"})
    assert refused.status_code == 200
    assert "passwords are kept for administrators" in refused.content.decode()
    assert _signed_in_user(client) is None
    wrong = client.post("/accounts/login/", {"username": "mia", "password": "not-it"})
    assert "passwords are kept" not in wrong.content.decode()  # a wrong one is just wrong
    # Refused by the backend, so every password login keeps to it (the admin's form too).
    assert authenticate(username="mia", password="pw-mia-123") is None
    User.objects.filter(username="mia").update(is_staff=True)
    form = AdminAuthenticationForm(data={"username": "mia", "password": "pw-mia-123"})
    assert not form.is_valid()
    User.objects.create_superuser("root", password="pw-root-123")
    answer = client.post("/accounts/login/", {"username": "root", "password": "pw-root-123"})
    assert answer.status_code == 302


# --- Two sign-ins of one new rep at once ---------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_first_sign_ins_of_a_rep_at_once_make_one_login(sso: OidcProvider) -> None:
    rep = RepFactory(email="ana@example.com")
    sso.person("ana@example.com")
    clients = [Client(), Client()]
    backs = [_through_provider(_to_provider(c)) for c in clients]
    barrier = threading.Barrier(2)
    answers: list[int] = []

    def finish(c: Client, back: str) -> None:
        try:
            barrier.wait()
            answers.append(c.get(back).status_code)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=finish, args=pair) for pair in zip(clients, backs, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [302, 302]
    assert User.objects.count() == 1
    assert Rep.objects.get(pk=rep.pk).user_id == User.objects.get().pk
    assert Event.objects.filter(data__action="sso_linked").count() == 1


def test_the_client_secret_can_go_in_a_basic_header(
    client: Client, sso: OidcProvider, settings: Any
) -> None:
    settings.OIDC_TOKEN_USE_BASIC_AUTH = True
    RepFactory(email="ana@example.com")
    sso.person("ana@example.com")
    assert _landing(client, _sign_in(client)).redirect_chain[-1][0] == "/me/"
    token_call = next(values for path, values in sso.calls if path == "/token")
    assert "client_secret" not in token_call
