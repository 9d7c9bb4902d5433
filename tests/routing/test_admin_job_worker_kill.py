"""A worker killed while it runs an admin job. ``task_reject_on_worker_lost`` hands the job's
message back at once, while the job's heartbeat is still fresh: that delivery must not take the
job for one "running elsewhere" and drop it (the job would stay ``running`` for good and a client
polling it would poll forever), but look at it again once the heartbeat would be stale, claim it
then and run it; the publish the kill rolled back is published once."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from routing.admin_jobs import admin_job_run, job_recheck
from routing.drafts.models import ConfigDraft, ConfigSnapshot
from routing.models import AdminJob
from routing.rules_io import rules_import
from tests.reliability.harness import pool_children
from tests.routing.config_api.test_config_publish_concurrency import (
    _changed_draft,
    _publish,
    _secret,
)
from tests.routing.test_pipeline import RULES
from tests.support.processes import celery_worker, wait_until

STALE_SECONDS = 10


@pytest.mark.django_db
def test_a_delivery_finding_the_job_running_looks_again_when_it_would_be_stale(settings):
    rules_import(RULES, publish=True)
    job = AdminJob.objects.get(pk=_publish(_changed_draft(["a.io"]), _secret())["id"])
    assert job_recheck(job) is None  # queued: its own message claims it
    fresh = timezone.now() - timedelta(seconds=3)
    AdminJob.objects.filter(pk=job.pk).update(status="running", attempt=1, updated_at=fresh)
    job.refresh_from_db()
    countdown = job_recheck(job)
    assert countdown is not None
    assert settings.ADMIN_JOB_STALE_SECONDS - 3 < countdown <= settings.ADMIN_JOB_STALE_SECONDS + 5
    admin_job_run(job_id=job.pk)  # running elsewhere: sent again, the job is not touched
    job.refresh_from_db()
    assert (job.status, job.attempt) == ("running", 1)

    AdminJob.objects.filter(pk=job.pk).update(status="done")
    job.refresh_from_db()
    assert job_recheck(job) is None  # an ended job is never sent again


@pytest.mark.django_db
def test_a_job_whose_worker_keeps_dying_is_given_up_after_the_attempts(settings):
    """A job that kills its worker every time (out of memory, say) would be claimed again once
    stale, for ever: after ADMIN_JOB_MAX_ATTEMPTS claims it ends failed, saying why, and its
    work is not done (nothing published)."""
    settings.ADMIN_JOB_MAX_ATTEMPTS = 3
    rules_import(RULES, publish=True)
    job = AdminJob.objects.get(pk=_publish(_changed_draft(["a.io"]), _secret())["id"])
    versions = ConfigSnapshot.objects.count()
    stale = timezone.now() - timedelta(seconds=settings.ADMIN_JOB_STALE_SECONDS + 1)
    # Its third claim died too: the fourth delivery finds it stale.
    AdminJob.objects.filter(pk=job.pk).update(status="running", attempt=3, updated_at=stale)
    admin_job_run(job_id=job.pk)
    job.refresh_from_db()
    assert ConfigSnapshot.objects.count() == versions  # the publish did not run
    assert (job.status, job.attempt) == ("failed", 4)
    assert "Its worker stopped 3 times while running it" in job.error
    assert job_recheck(job) is None  # and it is not sent again


@pytest.mark.django_db
def test_a_given_up_re_route_says_the_leads_it_moved_stay_moved(settings):
    """Unlike a publish or an import, a re-route moves each lead in a transaction of its own: a
    given-up one must not claim it wrote nothing."""
    settings.ADMIN_JOB_MAX_ATTEMPTS = 3
    stale = timezone.now() - timedelta(seconds=settings.ADMIN_JOB_STALE_SECONDS + 1)
    job = AdminJob.objects.create(
        kind="reroute_away", params={"rep_ids": [], "actor": "t"}, status="running", attempt=3
    )
    AdminJob.objects.filter(pk=job.pk).update(updated_at=stale)
    admin_job_run(job_id=job.pk)
    job.refresh_from_db()
    assert job.status == "failed"
    assert "The leads it had moved stay moved" in job.error
    assert "wrote nothing" not in job.error


@pytest.mark.worker
@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_publish_whose_worker_was_killed_is_run_again_and_published_once() -> None:
    rules_import(RULES, publish=True)
    secret = _secret()
    draft_id = _changed_draft(["a.io"])
    versions = ConfigSnapshot.objects.count()
    held, release = threading.Event(), threading.Event()

    def holding() -> None:  # the publish waits for the draft's row meanwhile
        try:
            with transaction.atomic():
                list(ConfigDraft.objects.select_for_update().filter(pk=draft_id))
                held.set()
                release.wait(60)
        finally:
            held.set()
            connection.close()

    env = {"ADMIN_JOB_STALE_SECONDS": str(STALE_SECONDS), "WORKER_DB_LOCK_TIMEOUT_MS": "60000"}
    holder = threading.Thread(target=holding)
    holder.start()
    try:
        assert held.wait(20)
        with celery_worker(concurrency=1, extra_env=env) as worker:
            job: dict[str, Any] = _publish(draft_id, secret)
            wait_until(
                lambda: AdminJob.objects.get(pk=job["id"]).phase == "publishing",
                timeout=60,
                message=lambda: worker.text()[-2000:],
            )
            time.sleep(1)
            for child in pool_children(worker.popen.pid):
                os.kill(child, signal.SIGKILL)  # the worker process running the publish
            release.set()
            deadline = time.monotonic() + 6 * STALE_SECONDS
            while time.monotonic() < deadline:
                ended = AdminJob.objects.get(pk=job["id"])
                if ended.status in ("done", "failed"):
                    break
                time.sleep(0.5)
            log = worker.text()
        assert (ended.status, ended.attempt) == ("done", 2), (
            ended.status,
            ended.attempt,
            ended.error,
            [line for line in log.splitlines() if "admin_job" in line or "admin job" in line],
        )
        assert ConfigSnapshot.objects.count() == versions + 1  # published once
        assert ConfigDraft.objects.get(pk=draft_id).status == "published"
    finally:
        release.set()
        holder.join(30)
