"""A stand-in OpenID Connect provider on pytest-httpserver, speaking the protocol as specified.

OpenID Connect Core 1.0 (authorization code flow, sections 3.1.2-3.1.3 and 5.3), Discovery 1.0
(section 4), OAuth 2.0 (RFC 6749 sections 4.1 and 5.2) with PKCE (RFC 7636), JWK (RFC 7517):

- ``GET /.well-known/openid-configuration``: the discovery document (``issuer`` is the server's
  base URL, the four endpoints below, RS256, ``code``, S256).
- ``GET /authorize`` with ``response_type=code``, ``client_id``, ``redirect_uri`` (exactly a
  registered one, else a 400 page and no redirect), ``scope`` containing ``openid``, ``state``,
  ``nonce``, ``code_challenge`` + ``code_challenge_method=S256``: the person is signed in already
  (``signed_in`` names whom), so it redirects at once to ``redirect_uri?code=…&state=…``; other
  errors redirect with ``error=invalid_request|unauthorized_client|access_denied`` and the state.
- ``POST /token`` (form): client authentication by ``client_secret_post`` or
  ``client_secret_basic`` (``401 {"error": "invalid_client"}``), ``grant_type=authorization_code``,
  the code (once, for 60 s, for the same client and ``redirect_uri``) and its ``code_verifier``
  (``400 {"error": "invalid_grant"}``): ``200 {"access_token", "token_type": "Bearer",
  "expires_in", "id_token"}`` with ``Cache-Control: no-store``. The id token is a JWT signed
  RS256 with ``kid``: ``iss``, ``sub``, ``aud`` (the client id), ``exp``, ``iat``, ``nonce`` and
  the person's ``email`` / ``email_verified``.
- ``GET /userinfo`` with ``Authorization: Bearer <access token>``: the person's claims, else
  ``401`` with ``WWW-Authenticate: Bearer error="invalid_token"``.
- ``GET /jwks``: ``{"keys": [<the public RSA key as a JWK>]}``.

A test says what the far side does with ``id_token_claims`` (claims to change in the next id
token: another ``aud``, an ``exp`` in the past), ``sign_with_other_key``, ``delay_seconds``
(every answer) and ``deny`` (the person refuses); every request is kept in ``calls``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

CLIENT_ID = "leadrouter-standin-client"
CLIENT_SECRET = "standin-client-secret-not-real"


def _json(document: dict[str, Any], status: int = 200, **headers: str) -> Response:
    return Response(
        json.dumps(document), status=status, content_type="application/json", headers=headers
    )


def _rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@dataclass
class OidcProvider:
    """One OpenID Connect provider with one registered client, on a local server."""

    server: HTTPServer
    people: dict[str, dict[str, Any]] = field(default_factory=dict)  # sub → claims
    signed_in: str = ""  # the sub of whoever is signed in at the provider
    redirect_uris: list[str] = field(default_factory=list)
    id_token_claims: dict[str, Any] = field(default_factory=dict)
    sign_with_other_key: bool = False
    delay_seconds: float = 0.0
    deny: bool = False
    calls: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    kid: str = "standin-key-1"
    key: rsa.RSAPrivateKey = field(default_factory=_rsa_key)
    _codes: dict[str, dict[str, Any]] = field(default_factory=dict)
    _tokens: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        routes = {
            "/.well-known/openid-configuration": self._discovery,
            "/authorize": self._authorize,
            "/token": self._token,
            "/userinfo": self._userinfo,
            "/jwks": self._jwks,
        }
        for path, handler in routes.items():
            self.server.expect_request(path).respond_with_handler(self._delayed(handler))

    def _delayed(self, handler: Any) -> Any:
        def respond(request: Request) -> Response:
            self.calls.append((request.path, dict(request.values.items())))
            if self.delay_seconds:
                time.sleep(self.delay_seconds)
            return handler(request)

        return respond

    @property
    def issuer(self) -> str:
        return self.server.url_for("/").rstrip("/")

    def person(self, email: str, *, verified: bool | None = True, **claims: Any) -> str:
        """Add a person (signed in from now on); their ``sub``."""
        sub = "sub-" + hashlib.sha256(email.encode()).hexdigest()[:16]
        record: dict[str, Any] = {"sub": sub, "email": email, **claims}
        if verified is not None:
            record["email_verified"] = verified
        self.people[sub] = record
        self.signed_in = sub
        return sub

    # --- endpoints ------------------------------------------------------------------------

    def _discovery(self, request: Request) -> Response:
        return _json(
            {
                "issuer": self.issuer,
                "authorization_endpoint": self.issuer + "/authorize",
                "token_endpoint": self.issuer + "/token",
                "userinfo_endpoint": self.issuer + "/userinfo",
                "jwks_uri": self.issuer + "/jwks",
                "response_types_supported": ["code"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "scopes_supported": ["openid", "email", "profile"],
                "token_endpoint_auth_methods_supported": [
                    "client_secret_post",
                    "client_secret_basic",
                ],
                "code_challenge_methods_supported": ["S256"],
                "claims_supported": ["sub", "iss", "aud", "exp", "iat", "email", "email_verified"],
            }
        )

    def _authorize(self, request: Request) -> Response:
        args = request.args
        redirect_uri = args.get("redirect_uri", "")
        if args.get("client_id") != CLIENT_ID or redirect_uri not in self.redirect_uris:
            # Never redirect to an unregistered URI (Core 3.1.2.6): a page of its own.
            return Response("invalid client_id or redirect_uri", status=400)
        state = args.get("state", "")

        def back(**params: str) -> Response:
            query = urlencode({**params, **({"state": state} if state else {})})
            return Response(status=302, headers={"Location": f"{redirect_uri}?{query}"})

        if args.get("response_type") != "code" or "openid" not in args.get("scope", "").split():
            return back(error="invalid_request")
        if not args.get("code_challenge") or args.get("code_challenge_method") != "S256":
            return back(error="invalid_request", error_description="PKCE S256 required")
        if self.deny or self.signed_in not in self.people:
            return back(error="access_denied")
        code = secrets.token_urlsafe(24)
        self._codes[code] = {
            "sub": self.signed_in,
            "redirect_uri": redirect_uri,
            "nonce": args.get("nonce"),
            "challenge": args["code_challenge"],
            "expires": time.time() + 60,
        }
        return back(code=code)

    def _client_authenticated(self, request: Request) -> bool:
        auth = request.authorization
        if auth is not None and auth.type == "basic":
            return auth.username == CLIENT_ID and auth.password == CLIENT_SECRET
        form = request.form
        return form.get("client_id") == CLIENT_ID and form.get("client_secret") == CLIENT_SECRET

    def _token(self, request: Request) -> Response:
        if request.method != "POST":
            return _json({"error": "invalid_request"}, 405)
        if not self._client_authenticated(request):
            return _json({"error": "invalid_client"}, 401, **{"WWW-Authenticate": "Basic"})
        form = request.form
        if form.get("grant_type") != "authorization_code":
            return _json({"error": "unsupported_grant_type"}, 400)
        grant = self._codes.pop(form.get("code", ""), None)  # a code works once
        verifier = form.get("code_verifier", "")
        challenge = (
            base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
            .rstrip(b"=")
            .decode()
        )
        if (
            grant is None
            or grant["expires"] < time.time()
            or grant["redirect_uri"] != form.get("redirect_uri")
            or grant["challenge"] != challenge
        ):
            return _json({"error": "invalid_grant"}, 400)
        person = self.people[grant["sub"]]
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": person["sub"],
            "aud": CLIENT_ID,
            "iat": now,
            "exp": now + 300,
            "nonce": grant["nonce"],
            **{k: v for k, v in person.items() if k in ("email", "email_verified")},
            **self.id_token_claims,
        }
        key = _rsa_key() if self.sign_with_other_key else self.key
        id_token = jwt.encode(claims, key, algorithm="RS256", headers={"kid": self.kid})
        access_token = secrets.token_urlsafe(24)
        self._tokens[access_token] = person["sub"]
        return _json(
            {
                "access_token": access_token,
                "token_type": "Bearer",
                "expires_in": 300,
                "id_token": id_token,
            },
            **{"Cache-Control": "no-store", "Pragma": "no-cache"},
        )

    def _userinfo(self, request: Request) -> Response:
        auth = request.headers.get("Authorization", "")
        sub = self._tokens.get(auth.removeprefix("Bearer ")) if auth.startswith("Bearer ") else None
        if sub is None:
            return _json(
                {"error": "invalid_token"},
                401,
                **{"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
        return _json(self.people[sub])

    def _jwks(self, request: Request) -> Response:
        jwk = RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        jwk.update({"kid": self.kid, "use": "sig", "alg": "RS256"})
        return _json({"keys": [jwk]})
