"""Schemathesis over the published OpenAPI schema: no input gives a 5xx, every 4xx is JSON.

Schema-valid data (positive generation) in three modes, and schema-violating data (negative
generation) with valid credentials, where it reaches the parsers and validators behind
authentication. FUZZ_MAX_EXAMPLES examples per operation: 40 in CI, 10 times that under ``make
reliability`` (RELIABILITY_SCALE=10). Runs in-process through the WSGI app. Intake calls carry a
valid source token (and target that source), lead calls a valid API token, so the fuzzing
reaches the code behind authentication.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from django.contrib.auth.models import Permission, User
from django.core import signals
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from rest_framework.authtoken.models import Token
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    positive_data_acceptance,
    status_code_conformance,
)

from config.wsgi import application
from leads.models import Lead, SourceAuthMode
from leads.services import source_set_hmac_secret
from tests.leads.factories import SourceFactory
from tests.reliability.harness import scaled

pytestmark = pytest.mark.reliability


@pytest.fixture
def api_schema(db):  # type: ignore[no-untyped-def]
    # As Django's test client does: keep the test's connection open across requests.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield schemathesis.openapi.from_wsgi("/api/v1/schema/?format=json", application)
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.fixture
def credentials(db) -> dict[str, str]:  # type: ignore[no-untyped-def]
    SourceFactory(slug="fuzz", rate_limit_per_minute=1_000_000)
    signed = SourceFactory(slug="fuzz-signed", rate_limit_per_minute=1_000_000)
    signed.auth_mode = SourceAuthMode.HMAC
    signed.save()
    source_set_hmac_secret(source=signed)
    user = User.objects.create_user("fuzzer")
    user.user_permissions.add(Permission.objects.get(codename="view_lead"))
    return {"intake": "Bearer token-fuzz", "api": f"Token {Token.objects.create(user=user).key}"}


def error_shape(ctx, response, case) -> None:  # type: ignore[no-untyped-def]
    """Every 4xx answers api.md's JSON error document."""
    if 400 <= response.status_code < 500:
        body = response.json()
        assert isinstance(body, dict), body
        assert set(body) >= {"error"}, body
        assert isinstance(body["error"].get("code"), str), body
        assert isinstance(body["error"].get("message"), str), body


MAX_EXAMPLES = int(os.environ.get("FUZZ_MAX_EXAMPLES") or scaled(40))


@pytest.mark.parametrize(
    ("mode", "generation"),
    [
        # a real source and API token: reaches the code behind auth
        ("authenticated", GenerationMode.POSITIVE),
        # the same, with data the schema forbids: wrong types, missing fields, bad parameters
        ("authenticated", GenerationMode.NEGATIVE),
        # an HMAC source with generated X-Signature values: always refused
        ("signed-source", GenerationMode.POSITIVE),
        # generated slugs and no credentials
        ("anonymous", GenerationMode.POSITIVE),
    ],
    ids=["authenticated", "authenticated-negative", "signed-source", "anonymous"],
)
def test_no_input_breaks_the_api(api_schema, credentials, mode, generation):  # type: ignore[no-untyped-def]
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 4  # intake, batch, lead list, lead detail (and the schema)
    fuzzed = 0

    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=generation))
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def call(case):  # type: ignore[no-untyped-def]
            is_intake = bool(case.path_parameters and "slug" in case.path_parameters)
            headers: dict[str, str] = {}
            if mode == "authenticated":
                if is_intake:
                    case.path_parameters["slug"] = "fuzz"
                    headers = {"Authorization": credentials["intake"]}
                else:
                    headers = {"Authorization": credentials["api"]}
            elif mode == "signed-source" and is_intake:
                case.path_parameters["slug"] = "fuzz-signed"
            response = case.call_and_validate(
                headers=headers,
                additional_checks=[error_shape],
                # Intake accepts objects the schema cannot describe exactly (aliases, source
                # field maps, unknown fields kept) and refuses some schema-valid ones (NUL,
                # lone surrogates, size limits); statuses are checked by error_shape instead.
                excluded_checks=[
                    negative_data_rejection,
                    positive_data_acceptance,
                    status_code_conformance,
                ],
            )
            if mode != "authenticated" and case.operation.path != "/api/v1/schema/":
                assert response.status_code in (400, 401, 403, 404, 405, 413, 415), (
                    response.status_code,
                    response.text[:300],
                )

        try:
            call()
        except Unsatisfiable:
            # Nothing in this operation's schema can be violated (a path of a plain string
            # parameter, say): there is no negative case to send.
            assert generation is GenerationMode.NEGATIVE, operation.path
            continue
        fuzzed += 1
    assert fuzzed >= 3, fuzzed

    if mode == "authenticated":
        # The fuzzing got past authentication: some generated leads were accepted and stored
        # (negative data too, at times: intake keeps fields the schema does not describe).
        if generation is GenerationMode.POSITIVE:
            assert Lead.objects.filter(source__slug="fuzz").exists()
    else:
        assert not Lead.objects.exists()
