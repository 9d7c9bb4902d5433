"""A publish asked for through the configuration API is run by a real ``celery -A config
worker`` process (PostgreSQL, Redis): the request answers 202 at once, the worker takes the
job from the maintenance queue, and the job URL ends done with the version it published; the
same job sent again publishes nothing more."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from routing.config_api.tokens import api_token_create
from routing.decisions import clear_live_config_cache
from routing.drafts.models import ConfigSnapshot
from routing.drafts.services import config_draft_create, config_draft_patch
from routing.models import AdminJob, ValueList
from routing.rules_io import rules_import
from routing.tasks import admin_job
from tests.routing.config_api.jobs import job_queued, job_read
from tests.routing.factories import user_with_perms
from tests.routing.test_pipeline import RULES
from tests.support.processes import celery_worker, wait_until

pytestmark = [
    pytest.mark.worker,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]


def test_a_worker_process_runs_the_publish_the_api_queued() -> None:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    user = user_with_perms("ci", "read,draft,publish")
    secret = api_token_create(user=user, name="ci", scopes="read,draft,publish", actor="t").secret
    draft = config_draft_create(actor="t")
    config_draft_patch(
        draft_id=draft.pk,
        changes={"value_lists": {"competitors": {"values": ["a.io"]}}},
        actor="t",
    )
    client = Client()
    with celery_worker(concurrency=1) as worker:
        response = client.post(
            f"/api/v1/config/drafts/{draft.pk}/publish/",
            {"note": "by a worker"},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {secret}",
        )
        job = job_queued(response)
        ended: dict[str, Any] = {}

        def finished() -> bool:
            ended.update(job_read(client, job, secret))
            return ended["status"] in ("done", "failed")

        wait_until(finished, timeout=60, message=lambda: worker.text()[-3000:])
        assert ended["status"] == "done", ended
        assert ended["result"]["version"]["number"] == 2
        assert ended["result"]["version"]["note"] == "by a worker"
        assert ValueList.objects.get().values == ["a.io"]

        admin_job.delay(job["id"])  # sent again: the worker finds it done
        wait_until(
            lambda: worker.text().count("maintenance.admin_job") >= 4,  # received, succeeded x2
            timeout=60,
            message=lambda: worker.text()[-3000:],
        )
    assert ConfigSnapshot.objects.count() == 2  # the baseline and the one publish
    assert AdminJob.objects.get(pk=job["id"]).attempt == 1
    clear_live_config_cache()
