"""Schemathesis over the configuration operations (drafts, versions, publish, rollback) of the
published OpenAPI schema, with a token holding read, draft and publish: no input gives a 5xx,
every 4xx is api.md's JSON error document, and every status code answered is one the schema
documents for that operation."""

from __future__ import annotations

import os

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    positive_data_acceptance,
)

from config.wsgi import application
from routing.config_api.tokens import api_token_create
from routing.decisions import clear_live_config_cache
from routing.drafts.services import config_draft_create
from routing.rules_io import rules_import
from tests.leads.test_schema_fuzz import error_shape
from tests.reliability.harness import scaled
from tests.routing.factories import user_with_perms
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.reliability

MAX_EXAMPLES = int(os.environ.get("FUZZ_MAX_EXAMPLES") or scaled(15))


@pytest.fixture
def api_schema(db):  # type: ignore[no-untyped-def]
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield schemathesis.openapi.from_wsgi("/api/v1/schema/?format=json", application)
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)
        clear_live_config_cache()


@pytest.mark.parametrize("generation", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_input_breaks_the_configuration_api(api_schema, generation):  # type: ignore[no-untyped-def]
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    config_draft_create(actor="test")  # draft 1, version 1
    user = user_with_perms("fuzz-ci", "read,draft,publish")
    secret = api_token_create(
        user=user, name="fuzz", scopes="read,draft,publish", actor="test"
    ).secret
    operations = [
        result.ok()
        for result in api_schema.get_all_operations()
        if result.ok().path.startswith("/api/v1/config/") and "/roster/" not in result.ok().path
    ]
    assert len(operations) == 17  # published, 4 of versions, 11 of drafts, a job
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=generation))
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def call(case):  # type: ignore[no-untyped-def]
            response = case.call_and_validate(
                headers={"Authorization": f"Bearer {secret}"},
                additional_checks=[error_shape],
                excluded_checks=[
                    negative_data_rejection,
                    positive_data_acceptance,
                ],
            )
            assert response.status_code < 500, response.text[:300]

        try:
            call()
        except Unsatisfiable:
            assert generation is GenerationMode.NEGATIVE, operation.path
