"""Single sign-on with OpenID Connect: the login page's button, the provider's round trip.

Built on mozilla-django-oidc (authorization code flow with state, nonce and PKCE) and off unless
``OIDC_RP_CLIENT_ID`` is set (config/settings/base.py). What this module adds to the library:

- **The provider's endpoints** come from the settings or, with only an issuer, from its
  discovery document (``/.well-known/openid-configuration``), fetched when a sign-in first needs
  it and cached; nothing talks to the provider at start-up or on an ordinary page.
- **The id token** must be RS256, signed by a key of the provider's JWKS, for this client
  (``aud``), from the issuer when one is known, not expired (a minute of clock skew), with the
  nonce of this browser's sign-in; the userinfo answer must be about the same ``sub``. The
  library itself checks neither the audience nor the issuer.
- **Who gets in** is decided by ``routing.rep_access.user_sso_login`` from the verified e-mail
  (``email_verified``, when the provider sends it, must be true).
- **Every refusal is a page**, never a 500: a sign-in LeadRouter refuses or cannot verify is a
  403 (or 400 for a state that is not this browser's) saying why; a provider that is down or
  slower than ``OIDC_TIMEOUT_SECONDS`` is a 503 with ``Retry-After``.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import jwt
import requests
from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.contrib.auth import views as auth_views
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import redirect_to_login
from django.core.cache import cache
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from routing.rep_access import LoginRefused, user_sso_login

logger = logging.getLogger(__name__)

_DISCOVERED = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
_LEEWAY_SECONDS = 60


class SsoError(Exception):
    """A sign-in that did not happen, in a sentence for the person trying, and its status."""

    status = 403

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class SsoUnavailable(SsoError):
    """The provider is down, slow or answering nonsense: try again later."""

    status = 503


def _provider() -> str:
    return str(settings.OIDC_PROVIDER_NAME)


def discovery_cache_key(issuer: str) -> str:
    return "sso:discovery:" + hashlib.sha256(issuer.rstrip("/").encode()).hexdigest()


def provider_discovery() -> dict[str, Any]:
    """The issuer's discovery document (cached ``OIDC_DISCOVERY_CACHE_SECONDS``)."""
    issuer = str(settings.OIDC_OP_ISSUER).rstrip("/")
    key = discovery_cache_key(issuer)
    document = cache.get(key)
    if isinstance(document, dict):
        return document
    url = issuer + "/.well-known/openid-configuration"
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT)
        response.raise_for_status()
        document = response.json()
    except requests.Timeout as exc:
        raise SsoUnavailable(
            f"{_provider()} did not answer in time. Try again in a minute."
        ) from exc
    except (requests.RequestException, ValueError) as exc:
        logger.warning("single sign-on: discovery at %s failed: %s", url, type(exc).__name__)
        raise SsoUnavailable(f"{_provider()} cannot be reached. Try again in a minute.") from exc
    if not isinstance(document, dict) or str(document.get("issuer", "")).rstrip("/") != issuer:
        logger.warning("single sign-on: %s names another issuer", url)
        raise SsoUnavailable(
            f"{_provider()} is misconfigured (its discovery names another issuer)."
        )
    missing = [name for name in _DISCOVERED.values() if not document.get(name)]
    if missing:
        raise SsoUnavailable(f"{_provider()} is misconfigured (no {', '.join(missing)}).")
    cache.set(key, document, settings.OIDC_DISCOVERY_CACHE_SECONDS)
    return document


def sso_setting(attr: str, *default: Any) -> Any:
    """A setting for mozilla-django-oidc: an endpoint set explicitly, else the discovered one."""
    if attr in _DISCOVERED:
        explicit = getattr(settings, attr, "")
        if explicit or not settings.OIDC_OP_ISSUER:
            return explicit
        return provider_discovery()[_DISCOVERED[attr]]
    return import_from_settings(attr, *default)


def _issuer() -> str | None:
    """The issuer id tokens must name: the configured one, as discovery spells it."""
    if not settings.OIDC_OP_ISSUER:
        return None
    if all(getattr(settings, name) for name in _DISCOVERED):
        return str(settings.OIDC_OP_ISSUER)
    return str(provider_discovery()["issuer"])


class SsoBackend(OIDCAuthenticationBackend):
    """The provider's sign-in as an authentication backend (inert while single sign-on is off)."""

    get_settings = staticmethod(sso_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Django builds a backend for every request of a user it logged in: nothing here may
        # read the provider's endpoints (a network call when discovered).
        from django.contrib.auth import get_user_model

        self.UserModel = get_user_model()

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> Any:
        # Only the callback passes a nonce; a password login never reaches the provider.
        if not settings.SSO_ENABLED or request is None or "nonce" not in kwargs:
            return None
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = "RS256"
        self.OIDC_RP_IDP_SIGN_KEY = None
        try:
            self.OIDC_OP_TOKEN_ENDPOINT = sso_setting("OIDC_OP_TOKEN_ENDPOINT")
            self.OIDC_OP_USER_ENDPOINT = sso_setting("OIDC_OP_USER_ENDPOINT")
            self.OIDC_OP_JWKS_ENDPOINT = sso_setting("OIDC_OP_JWKS_ENDPOINT")
            self.issuer = _issuer()
            return super().authenticate(request, **kwargs)
        except requests.Timeout as exc:
            raise SsoUnavailable(
                f"{_provider()} did not answer in time. Try again in a minute."
            ) from exc
        except requests.HTTPError as exc:
            status = exc.response.status_code if exc.response is not None else 0
            logger.warning("single sign-on: the provider answered %s", status)
            if 400 <= status < 500:  # a code used twice or expired, a client secret refused
                raise SsoError(
                    f"{_provider()} refused to complete the sign-in. Start again; if it keeps "
                    "failing, ask RevOps to check the single sign-on settings."
                ) from exc
            raise SsoUnavailable(f"{_provider()} is failing. Try again in a minute.") from exc
        except requests.RequestException as exc:
            logger.warning("single sign-on: the provider is unreachable: %s", type(exc).__name__)
            raise SsoUnavailable(
                f"{_provider()} cannot be reached. Try again in a minute."
            ) from exc
        except ValueError as exc:  # a token answer that is not JSON
            raise SsoUnavailable(f"{_provider()} answered nonsense. Try again later.") from exc

    def get_token(self, payload: Any) -> Any:
        answer = super().get_token(payload)
        if not isinstance(answer, dict) or not answer.get("id_token"):
            raise SsoUnavailable(f"{_provider()} answered without an id token. Try again later.")
        return answer

    def verify_token(self, token: Any, **kwargs: Any) -> Any:
        try:
            return super().verify_token(token, **kwargs)
        except (SsoError, requests.RequestException):
            raise
        except (SuspiciousOperation, jwt.PyJWTError, KeyError, TypeError, ValueError) as exc:
            logger.warning("single sign-on: id token refused: %s", exc)
            raise SsoError(
                f"The answer from {_provider()} could not be verified, so you were not signed "
                "in. Start again."
            ) from exc

    def get_payload_data(self, token: Any, key: Any) -> Any:
        header = jwt.get_unverified_header(token)
        if header.get("alg") != "RS256":
            raise SuspiciousOperation(f"id token signed with {header.get('alg')!r}, not RS256")
        issuer = getattr(self, "issuer", None)
        return jwt.decode(
            token,
            key,
            algorithms=["RS256"],
            audience=self.OIDC_RP_CLIENT_ID,
            issuer=issuer,
            leeway=_LEEWAY_SECONDS,
            options={"require": ["exp", "iat", "aud", "sub", *(["iss"] if issuer else [])]},
        )

    def get_userinfo(self, access_token: Any, id_token: Any, payload: Any) -> dict[str, Any]:
        try:
            userinfo = super().get_userinfo(access_token, id_token, payload)
        except (ValueError, jwt.PyJWTError, SuspiciousOperation) as exc:  # not JSON, a bad JWT
            raise SsoUnavailable(f"{_provider()} answered nonsense. Try again later.") from exc
        if not isinstance(userinfo, dict) or userinfo.get("sub") != payload.get("sub"):
            raise SsoError(f"{_provider()} described another user than it signed in.")
        return {**payload, **userinfo}

    def get_or_create_user(self, access_token: Any, id_token: Any, payload: Any) -> Any:
        claims = self.get_userinfo(access_token, id_token, payload)
        email = claims.get("email")
        if not isinstance(email, str) or not email:
            raise SsoError(
                f"{_provider()} did not send your e-mail address, so you were not "
                "signed in (the client must be allowed the email scope)."
            )
        verified = claims.get("email_verified", True)  # absent: the provider vouches for it
        if verified not in (True, "true"):
            raise SsoError(
                f"{_provider()} has not verified the e-mail {email}, so it cannot sign you in "
                "here. Verify it with them, then start again."
            )
        mapping = settings.OIDC_GROUP_ROLES
        try:
            user = user_sso_login(
                email=email,
                allowed_domains=list(settings.OIDC_ALLOWED_EMAIL_DOMAINS),
                actor=f"sso:{email.strip().lower()}",
                roles=provider_roles(claims, mapping) if mapping else None,
                managed_roles={role for names in mapping.values() for role in names},
            )
        except LoginRefused as exc:
            raise SsoError(exc.message) from exc
        logger.info("single sign-on: %s signed in as %s", email, user.get_username())
        return user

    def get_user(self, user_id: Any) -> Any:
        return ModelBackend.get_user(self, user_id)  # an inactive user's session ends


def provider_roles(claims: dict[str, Any], mapping: dict[str, tuple[str, ...]]) -> set[str]:
    """The roles ``OIDC_GROUP_ROLES`` gives the person, from the groups claim.

    No claim is no group (Okta leaves it out when none of the person's groups pass its filter);
    one group may come as a string. Groups sent only by reference (Entra ID's "overage" for a
    person in too many groups) or in any other shape are refused: roles are never guessed.
    """
    name = str(settings.OIDC_GROUPS_CLAIM)
    by_reference = claims.get("_claim_names")
    if isinstance(by_reference, dict) and name in by_reference:
        raise SsoError(
            f"{_provider()} sent your groups by reference only (too many groups for a token), "
            "so your roles cannot be read. Ask your administrator to filter the groups claim "
            "to LeadRouter's groups."
        )
    value = claims.get(name)
    if value is None:
        groups: list[str] = []
    elif isinstance(value, str):
        groups = [value]
    elif isinstance(value, list) and all(isinstance(group, str) for group in value):
        groups = value
    else:
        logger.warning("single sign-on: the %r claim is not a list of names", name)
        raise SsoError(
            f"{_provider()} sent your groups in a form LeadRouter cannot read, so your roles "
            "cannot be set. Ask RevOps to check the single sign-on settings."
        )
    return {role for group in groups for role in mapping.get(group, ())}


def _refused(request: HttpRequest, message: str, status: int) -> HttpResponse:
    response = render(
        request,
        "registration/sso_refused.html",
        {"message": message, "provider": _provider(), "unavailable": status == 503},
        status=status,
    )
    if status == 503:
        response["Retry-After"] = "60"
    return response


class SsoStartView(OIDCAuthenticationRequestView):
    """ "Sign in with …": off to the provider, with state, nonce and a PKCE challenge."""

    get_settings = staticmethod(sso_setting)

    def __init__(self, **kwargs: Any) -> None:
        # The library reads the endpoint here; it is read in get(), where a failure is a page.
        super(OIDCAuthenticationRequestView, self).__init__(**kwargs)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not settings.SSO_ENABLED:
            raise Http404("Single sign-on is not configured.")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = sso_setting("OIDC_OP_AUTHORIZATION_ENDPOINT")
        except SsoError as exc:
            return _refused(request, exc.message, exc.status)
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        return super().get(request)


class SsoCallbackView(OIDCAuthenticationCallbackView):
    """The provider's redirect back: the code exchanged, the token checked, the user matched."""

    get_settings = staticmethod(sso_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not settings.SSO_ENABLED:
            raise Http404("Single sign-on is not configured.")
        try:
            return super().get(request)
        except SsoError as exc:
            return _refused(request, exc.message, exc.status)
        except SuspiciousOperation:  # a state this browser did not start
            return _refused(
                request,
                "This sign-in was not started from this browser, or was already used. Start "
                "again from the login page.",
                400,
            )

    def login_failure(self) -> HttpResponse:
        error = self.request.GET.get("error")
        if error:  # the person cancelled, or the provider would not let them use this client
            return _refused(self.request, f"{_provider()} did not sign you in ({error[:64]}).", 403)
        return _refused(
            self.request,
            "The sign-in did not complete: it was not started from this browser, or it was "
            "cancelled. Start again from the login page.",
            403,
        )


def _passwords_for_superusers_only() -> bool:
    return bool(settings.SSO_ENABLED and settings.OIDC_PASSWORD_LOGIN_SUPERUSERS_ONLY)


class PasswordBackend(ModelBackend):
    """Django's password login; with ``OIDC_PASSWORD_LOGIN_SUPERUSERS_ONLY``, superusers only.

    Refused here, not in a form, so that every password login (the login page, the admin's own
    login page) keeps to it.
    """

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is not None and _passwords_for_superusers_only() and not user.is_superuser:
            raise PermissionDenied  # stops Django trying the backends after this one
        return user


class PasswordLoginForm(AuthenticationForm):
    """The password form, saying so when a right password is refused for being no superuser's."""

    def clean(self) -> dict[str, Any]:
        try:
            return super().clean()
        except forms.ValidationError:
            if _passwords_for_superusers_only():
                user = ModelBackend().authenticate(
                    self.request,
                    username=self.cleaned_data.get("username"),
                    password=self.cleaned_data.get("password"),
                )
                if user is not None:
                    raise forms.ValidationError(
                        f"Sign in with {_provider()}: passwords are kept for administrators.",
                        code="sso_only",
                    ) from None
            raise


class LoginPage(auth_views.LoginView):
    """Django's login page, with "Sign in with …" beside the password form when configured."""

    form_class = PasswordLoginForm

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["sso"] = (
            {
                "provider": _provider(),
                "password_hidden": settings.OIDC_PASSWORD_LOGIN_SUPERUSERS_ONLY
                and "password" not in self.request.GET
                and self.request.method == "GET",
            }
            if settings.SSO_ENABLED
            else None
        )
        form = context.get("form")
        refusals = form.errors.as_data().get("__all__", []) if form is not None else []
        context["sso_only_error"] = next(
            (error.messages[0] for error in refusals if error.code == "sso_only"), None
        )
        return context


def admin_login(request: HttpRequest) -> HttpResponse:
    """The admin's login page; with single sign-on, the login page that offers it."""
    if settings.SSO_ENABLED:
        return redirect_to_login(
            request.GET.get(REDIRECT_FIELD_NAME) or reverse("admin:index"), reverse("login")
        )
    return admin.site.login(request)
