"""Background admin jobs: a large replay (of a ruleset version, or against a draft of the
whole configuration) or CSV import, a publish or rollback of the whole configuration or a
draft's large test run through the API (``routing.drafts.jobs``), run by a worker, with progress.

``admin_job_start_*`` create the job and enqueue ``maintenance.admin_job`` after commit;
``admin_job_run`` (the task's one service) claims it, runs it reporting progress in batches, and
ends it done or failed. It is safe to deliver twice (the task acks late): a finished job is left
alone; a job whose worker went silent for ``ADMIN_JOB_STALE_SECONDS`` is claimed again, and only
the latest claim may finish it. A delivery that finds the job running with a fresh heartbeat does
not drop its message (it may be the redelivery of a worker killed a moment ago, whose heartbeat
is not stale yet): it sends it again for when the heartbeat would be stale (``job_recheck``), and
so on until the job has ended. A replay
writes nothing but its job row; an import writes its data and ends its job in one transaction.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from routing.drafts.checks import draft_check_report
from routing.drafts.live import LiveChangeRefused
from routing.drafts.models import ConfigDraft
from routing.engine import RuleErrors
from routing.models import AdminJob, AdminJobKind, AdminJobStatus, RuleSet
from routing.rules_io import ConfigurationBusy, RulesFileErrors
from routing.tables_io import TableErrors, tables_apply, tables_plan
from routing.versions import TestCasesFailing, replay_result_data, ruleset_replay

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

logger = logging.getLogger(__name__)

CONFIG_KINDS = (
    AdminJobKind.CONFIG_PUBLISH,
    AdminJobKind.CONFIG_ROLLBACK,
    AdminJobKind.CONFIG_CHECK,
)
IMPORT_KINDS = {
    "territories": AdminJobKind.TERRITORIES_IMPORT,
    "accounts": AdminJobKind.ACCOUNTS_IMPORT,
}


def _user(actor: AbstractBaseUser | None) -> Any:
    return actor if actor is not None and actor.pk is not None else None


def job_enqueue(job: AdminJob) -> None:
    """Send ``job`` to a worker once the transaction that created it commits."""
    from routing.tasks import admin_job

    transaction.on_commit(lambda: admin_job.delay(job.pk))


@transaction.atomic
def admin_job_start_replay(
    *, ruleset: RuleSet, limit: int, actor: AbstractBaseUser | None = None
) -> AdminJob:
    """Queue a replay of ``ruleset`` over the last ``limit`` processed leads."""
    limit = max(1, min(limit, settings.REPLAY_MAX_LEADS))
    job = AdminJob.objects.create(
        kind=AdminJobKind.REPLAY,
        ruleset=ruleset,
        requested_by=_user(actor),
        params={"limit": limit},
        progress_total=limit,
    )
    job_enqueue(job)
    return job


@transaction.atomic
def admin_job_start_draft_replay(
    *, draft: ConfigDraft, limit: int, actor: AbstractBaseUser | None = None
) -> AdminJob:
    """Queue a check of ``draft``: its test cases, and the last ``limit`` processed leads
    decided with it and with the published configuration (``draft_check``)."""
    limit = max(1, min(limit, settings.REPLAY_MAX_LEADS))
    job = AdminJob.objects.create(
        kind=AdminJobKind.DRAFT_REPLAY,
        requested_by=_user(actor),
        params={"draft_id": draft.pk, "limit": limit},
        progress_total=limit,
    )
    job_enqueue(job)
    return job


@transaction.atomic
def admin_job_start_import(
    *,
    table: str,
    content: str,
    file_name: str,
    delete_missing: bool = False,
    actor: AbstractBaseUser | None = None,
    force: bool = False,
) -> AdminJob:
    """Queue the import of a territories or accounts CSV (kept on the job until it ends). It
    is refused when a saved test case fails after it, unless ``force``."""
    job = AdminJob.objects.create(
        kind=IMPORT_KINDS[table],
        requested_by=_user(actor),
        params={
            "table": table,
            "file": file_name[:200],
            "delete_missing": delete_missing,
            **({"force": True} if force else {}),
        },
        input=content,
    )
    job_enqueue(job)
    return job


RECHECK_MARGIN_SECONDS = 5


def job_recheck(job: AdminJob) -> float | None:
    """Send ``job`` to a worker again for when its heartbeat would be stale, while it is running
    (its worker may have died a moment ago): then the job is claimed again, or, if it has ended
    meanwhile, that delivery does nothing. The delay in seconds, or None (nothing sent)."""
    from routing.tasks import admin_job

    if job.status != AdminJobStatus.RUNNING:
        return None
    age = (timezone.now() - job.updated_at).total_seconds()
    countdown = max(1.0, settings.ADMIN_JOB_STALE_SECONDS - age) + RECHECK_MARGIN_SECONDS
    # Redis redelivers a message held past its visibility timeout: stay well inside it.
    countdown = min(countdown, max(1.0, settings.CELERY_VISIBILITY_TIMEOUT / 2))
    admin_job.apply_async((job.pk,), countdown=countdown)
    return countdown


def _claim(job_id: int) -> AdminJob | None:
    now = timezone.now()
    stale = now - timedelta(seconds=settings.ADMIN_JOB_STALE_SECONDS)
    claimed = (
        AdminJob.objects.filter(pk=job_id)
        .filter(
            Q(status=AdminJobStatus.QUEUED) | Q(status=AdminJobStatus.RUNNING, updated_at__lt=stale)
        )
        .update(
            status=AdminJobStatus.RUNNING,
            attempt=F("attempt") + 1,
            started_at=now,
            updated_at=now,
            progress_done=0,
            error="",
        )
    )
    return AdminJob.objects.filter(pk=job_id).first() if claimed else None


def job_mine(job: AdminJob) -> Any:
    """The job's row while this claim of it is the current one (empty otherwise)."""
    return AdminJob.objects.filter(pk=job.pk, attempt=job.attempt, status=AdminJobStatus.RUNNING)


def job_progress(job: AdminJob, phase: str) -> Any:
    """A ``progress(done, total)`` that reports ``phase`` and the heartbeat on the job."""

    def report(done: int, total: int) -> None:
        job_mine(job).update(
            phase=phase, progress_done=done, progress_total=total, updated_at=timezone.now()
        )

    return report


def job_finish(job: AdminJob, **values: Any) -> bool:
    """End the job with ``values`` while this claim is the current one; whether it did."""
    now = timezone.now()
    return bool(job_mine(job).update(finished_at=now, updated_at=now, input="", **values))


def _run_replay(job: AdminJob) -> None:
    ruleset = job.ruleset
    if ruleset is None:  # a check constraint rules it out
        raise ValueError(f"replay job {job.pk} has no ruleset")
    try:
        result = ruleset_replay(
            ruleset=ruleset,
            limit=int(job.params.get("limit", 0)),
            progress=job_progress(job, "deciding leads"),
        )
    except RuleErrors as exc:
        job_finish(
            job,
            status=AdminJobStatus.FAILED,
            error=f"Version {ruleset.version} does not compile: {exc}",
        )
        return
    except ConfigurationBusy as exc:
        job_finish(job, status=AdminJobStatus.FAILED, error=str(exc))
        return
    job_finish(
        job,
        status=AdminJobStatus.DONE,
        phase="",
        progress_done=result.considered,
        progress_total=result.considered,
        result=replay_result_data(result),
    )


def _run_draft_replay(job: AdminJob) -> None:
    draft = ConfigDraft.objects.filter(pk=job.params.get("draft_id")).first()
    if draft is None:
        job_finish(job, status=AdminJobStatus.FAILED, error="The draft no longer exists.")
        return
    try:
        report = draft_check_report(
            draft=draft,
            leads=int(job.params.get("limit", 0)),
            progress=job_progress(job, "deciding leads"),
        )
    except RulesFileErrors as exc:
        shown = "; ".join(str(error) for error in exc.errors[:20])
        job_finish(job, status=AdminJobStatus.FAILED, error=f"The draft is not valid now: {shown}")
        return
    except (ConfigurationBusy, RuleErrors) as exc:
        job_finish(job, status=AdminJobStatus.FAILED, error=str(exc))
        return
    considered = (report["replay"] or {}).get("considered", 0)
    job_finish(
        job,
        status=AdminJobStatus.DONE,
        phase="",
        progress_done=considered,
        progress_total=considered,
        result=report,
    )


class _Superseded(Exception):
    """Another claim of the job took over: this run's writes are rolled back."""


def _what_stands(job: AdminJob) -> str:
    """What of a stopped run's work stands: every kind writes its work in one transaction
    (nothing of a stopped run is kept) except the re-route of an away rep's leads, which moves
    each lead in a transaction of its own."""
    if job.kind == AdminJobKind.REROUTE_AWAY:
        return (
            "The leads it had moved stay moved; the others stay with their rep (started again, "
            "it takes up the leads still there)."
        )
    return "It wrote nothing."


def _given_up(job: AdminJob) -> str:
    return (
        f"Its worker stopped {job.attempt - 1} times while running it (killed, or out of "
        f"memory): not tried again. {_what_stands(job)} Start it again once the cause is fixed."
    )


def _run_import(job: AdminJob) -> None:
    table = job.params["table"]
    try:
        plan = tables_plan(
            table=table,
            content=job.input,
            delete_missing=bool(job.params.get("delete_missing")),
            progress=job_progress(job, "checking rows"),
        )
    except TableErrors as exc:
        job_finish(
            job,
            status=AdminJobStatus.FAILED,
            error=f"{exc.count} problem(s) in the file; nothing was written.",
            result={"errors": list(exc.errors), "error_count": exc.count},
        )
        return
    job_progress(job, "writing")(plan.rows, plan.rows)
    try:
        with transaction.atomic():
            # Lock the job: a second claim cannot finish it while this one writes.
            AdminJob.objects.select_for_update().filter(pk=job.pk).first()
            report = tables_apply(
                plan=plan,
                actor=job.requested_by,
                file_name=job.params["file"],
                test_cases=True,
                force=bool(job.params.get("force")),
            )
            if not job_finish(
                job,
                status=AdminJobStatus.DONE,
                phase="",
                progress_done=plan.rows,
                progress_total=plan.rows,
                result=report.as_data(),
            ):
                raise _Superseded
    except (ConfigurationBusy, LiveChangeRefused) as exc:
        job_finish(job, status=AdminJobStatus.FAILED, error=str(exc))
    except TestCasesFailing as exc:
        job_finish(
            job,
            status=AdminJobStatus.FAILED,
            error=f"Not imported, nothing written: after it {exc} (import again with "
            '"Import even though saved test cases fail" ticked to import it anyway).',
        )
    except _Superseded:
        logger.warning("admin job %s was claimed again while it ran; this run gave way", job.pk)


def _run_reroute_away(job: AdminJob) -> None:
    from routing.timeoff.services import reps_away_reroute_run

    moved, kept = reps_away_reroute_run(
        rep_ids=[int(rep_id) for rep_id in job.params.get("rep_ids", [])],
        actor=str(job.params.get("actor") or "system"),
        reason=str(job.params.get("reason") or "unavailable"),
        progress=job_progress(job, "routing leads again"),
    )
    job_finish(
        job,
        status=AdminJobStatus.DONE,
        phase="",
        progress_done=moved + kept,
        progress_total=moved + kept,
        result={"moved": moved, "kept": kept},
    )


def admin_job_run(*, job_id: int) -> None:
    """Claim and run one admin job; a finished job is left alone, one running elsewhere is
    looked at again once its heartbeat would be stale (``job_recheck``)."""
    job = _claim(job_id)
    if job is not None and job.attempt > settings.ADMIN_JOB_MAX_ATTEMPTS:
        # Each claim after the first follows a worker that stopped while running it (killed,
        # out of memory): a job that kills its worker every time is not tried for ever.
        job_finish(job, status=AdminJobStatus.FAILED, error=_given_up(job))
        logger.error("admin job %s: given up after %s attempts", job.pk, job.attempt - 1)
        return
    if job is None:
        current = AdminJob.objects.filter(pk=job_id).first()
        countdown = job_recheck(current) if current is not None else None
        if countdown is None:
            logger.info("admin job %s is finished: nothing to do", job_id)
        else:
            logger.info(
                "admin job %s is running elsewhere: looked at again in %.0f s", job_id, countdown
            )
        return
    try:
        if job.kind in CONFIG_KINDS:
            from routing.drafts.jobs import config_job_run

            config_job_run(job)
        elif job.kind == AdminJobKind.REPLAY:
            _run_replay(job)
        elif job.kind == AdminJobKind.REROUTE_AWAY:
            _run_reroute_away(job)
        elif job.kind == AdminJobKind.DRAFT_REPLAY:
            _run_draft_replay(job)
        else:
            _run_import(job)
    except SoftTimeLimitExceeded:
        job_finish(
            job,
            status=AdminJobStatus.FAILED,
            error="It took longer than the time limit "
            f"({settings.ADMIN_JOB_TIME_LIMIT_SECONDS} s). {_what_stands(job)} "
            "Try fewer leads or rows.",
        )
    except Exception as exc:
        logger.exception("admin job %s failed", job_id)
        job_finish(job, status=AdminJobStatus.FAILED, error=f"It failed: {exc}")
        raise
