"""Large replays run as a background job with progress; small ones while the page loads."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from leads.models import LeadStatus
from routing.admin_jobs import admin_job_run, admin_job_start_replay
from routing.models import (
    AdminJob,
    AdminJobKind,
    AdminJobStatus,
    Assignment,
    Rep,
    Rule,
    RuleSet,
    Team,
)
from routing.versions import ruleset_new_draft
from tests.leads.factories import LeadFactory
from tests.routing.factories import AssignmentFactory, make_rep, team_with


def _processed_leads(rep: Rep, team: Team, count: int) -> None:
    for i in range(count):
        lead = LeadFactory(
            status=LeadStatus.ASSIGNED,
            country="DE" if i % 2 else "FR",
            email=f"lead{i}@firma.de",
            processed_at=timezone.now() - timedelta(seconds=count - i),
        )
        AssignmentFactory(lead=lead, rep=rep, team=team, team_name=team.name)


@pytest.fixture
def moved(live: RuleSet, emea: Team) -> RuleSet:
    """A draft that sends German leads to another team; 12 processed leads (6 German)."""
    cai = make_rep(email="cai@x.example", name="Cai")
    team_with([cai], name="DACH AE")
    _processed_leads(Rep.objects.get(email="ana@x.example"), emea, 12)
    draft = ruleset_new_draft(ruleset=live)
    Rule.objects.filter(ruleset=draft).update(action={"type": "team", "team": "DACH AE"})
    return draft


def test_a_large_replay_runs_in_the_background_and_shows_progress_then_the_result(
    client_revops,
    moved,
    emea,
    settings,
    eager_tasks,
    django_capture_on_commit_callbacks,
    monkeypatch,
):
    settings.REPLAY_SYNC_MAX_LEADS = 5
    url = reverse("admin:routing_ruleset_replay", args=[moved.pk])
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        started = client_revops.post(url, {"n": "12", "run": "Replay"})
    job = AdminJob.objects.get()
    assert started.status_code == 302
    assert started["Location"] == reverse("admin:routing_adminjob_progress", args=[job.pk])
    assert (job.kind, job.status, job.params) == (AdminJobKind.REPLAY, "queued", {"limit": 12})
    waiting = client_revops.get(started["Location"])
    assert '<meta http-equiv="refresh"' in waiting.content.decode()
    assert "Queued" in waiting.content.decode()

    # The worker reports progress in chunks, readable while it runs.
    seen: list[dict[str, Any]] = []
    status_url = reverse("admin:routing_adminjob_status", args=[job.pk])

    def watch(done: int, total: int, real: Any) -> None:
        real(done, total)
        seen.append(client_revops.get(status_url).json())

    import routing.versions as versions

    original = versions.ruleset_replay

    def replay_watched(**kwargs: Any) -> Any:
        real = kwargs.pop("progress")
        return original(**kwargs, progress=lambda d, t: watch(d, t, real))

    monkeypatch.setattr(versions, "REPLAY_CHUNK", 5)
    monkeypatch.setattr("routing.admin_jobs.ruleset_replay", replay_watched)
    for callback in callbacks:
        callback()  # the enqueue; eager, so the job runs now
    assert [(s["status"], s["done"], s["total"]) for s in seen] == [
        ("running", 5, 12),
        ("running", 10, 12),
        ("running", 12, 12),
    ]
    assert seen[0]["phase"] == "deciding leads"
    assert seen[0]["percent"] == 41

    job.refresh_from_db()
    assert job.status == AdminJobStatus.DONE
    assert (job.result["considered"], job.result["changed"]) == (12, 12)
    done = client_revops.get(started["Location"]).content.decode()
    assert "12 of 12 leads would change" in done
    assert "lead11@firma.de" in done
    assert '<meta http-equiv="refresh"' not in done
    assert client_revops.get(status_url).json()["finished"] is True
    # Nothing written but the job row; no turn moved.
    assert Assignment.objects.filter(rep__email="cai@x.example").count() == 0
    emea.refresh_from_db()
    assert emea.rotation_state == {}


def test_a_small_replay_still_runs_while_the_page_loads(client_revops, moved, settings):
    settings.REPLAY_SYNC_MAX_LEADS = 500
    page = client_revops.post(
        reverse("admin:routing_ruleset_replay", args=[moved.pk]), {"n": "12", "run": "Replay"}
    )
    assert "12 of 12 leads would change" in page.content.decode()
    assert not AdminJob.objects.exists()


def test_a_redelivered_job_runs_once_and_a_silent_worker_shows_as_stalled(moved, revops, settings):
    job = admin_job_start_replay(ruleset=moved, limit=50, actor=revops)
    admin_job_run(job_id=job.pk)
    job.refresh_from_db()
    finished_at = job.finished_at
    admin_job_run(job_id=job.pk)  # redelivered (acks_late): a finished job is left alone
    job.refresh_from_db()
    assert (job.status, job.attempt, job.finished_at) == ("done", 1, finished_at)

    running = admin_job_start_replay(ruleset=moved, limit=50, actor=revops)
    AdminJob.objects.filter(pk=running.pk).update(status="running", attempt=1)
    admin_job_run(job_id=running.pk)  # another worker is on it (fresh heartbeat): no-op
    running.refresh_from_db()
    assert (running.status, running.attempt, running.stalled) == ("running", 1, False)

    AdminJob.objects.filter(pk=running.pk).update(
        updated_at=timezone.now() - timedelta(seconds=settings.ADMIN_JOB_STALE_SECONDS + 1)
    )
    running.refresh_from_db()
    assert running.stalled  # the page says so instead of spinning
    admin_job_run(job_id=running.pk)  # a redelivery takes over a silent worker's job
    running.refresh_from_db()
    assert (running.status, running.attempt) == ("done", 2)


def test_stalled_and_failed_jobs_show_an_error_not_a_spinner(
    client_revops, moved, settings, monkeypatch
):
    stalled = admin_job_start_replay(ruleset=moved, limit=50)
    AdminJob.objects.filter(pk=stalled.pk).update(
        updated_at=timezone.now() - timedelta(seconds=settings.ADMIN_JOB_STALE_SECONDS + 1)
    )
    page = client_revops.get(reverse("admin:routing_adminjob_progress", args=[stalled.pk]))
    assert "Stalled: no worker has reported" in page.content.decode()
    assert '<meta http-equiv="refresh"' not in page.content.decode()
    status = client_revops.get(reverse("admin:routing_adminjob_status", args=[stalled.pk]))
    assert status.json()["stalled"] is True

    def crash(**kwargs: Any) -> None:
        raise RuntimeError("the database went away")

    monkeypatch.setattr("routing.admin_jobs.ruleset_replay", crash)
    broken = admin_job_start_replay(ruleset=moved, limit=50)
    with pytest.raises(RuntimeError):
        admin_job_run(job_id=broken.pk)  # the task fails too, for its logs and Sentry
    page = client_revops.get(reverse("admin:routing_adminjob_progress", args=[broken.pk]))
    assert "Failed: It failed: the database went away" in page.content.decode()
    assert '<meta http-equiv="refresh"' not in page.content.decode()


def test_only_revops_start_or_watch_background_replays(outsider, moved, settings):
    settings.REPLAY_SYNC_MAX_LEADS = 5
    url = reverse("admin:routing_ruleset_replay", args=[moved.pk])
    assert outsider.post(url, {"n": "12", "run": "Replay"}).status_code == 403
    assert outsider.post(url, {"n": "5", "run": "Replay"}).status_code == 200  # small: a view
    assert not AdminJob.objects.exists()
    job = admin_job_start_replay(ruleset=moved, limit=12)
    for name in ("admin:routing_adminjob_progress", "admin:routing_adminjob_status"):
        assert outsider.get(reverse(name, args=[job.pk])).status_code == 403


def test_a_reroute_jobs_progress_page_opens_for_who_may_change_reps(client_revops, outsider):
    # It was missing from the job permissions: the page answered 500 (a KeyError).
    job = AdminJob.objects.create(kind=AdminJobKind.REROUTE_AWAY, params={"rep_ids": []})
    for name in ("admin:routing_adminjob_progress", "admin:routing_adminjob_status"):
        assert client_revops.get(reverse(name, args=[job.pk])).status_code == 200
        assert outsider.get(reverse(name, args=[job.pk])).status_code == 403
