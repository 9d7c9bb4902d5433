"""A publish, a rollback or a large test run of the whole configuration as a background job.

A publish of a 20,000-territory configuration takes minutes, far past a web worker's timeout,
so the configuration API and the admin queue it as an ``AdminJob`` (``routing.admin_jobs``) and
a worker runs it, while the caller watches the job. Everything the synchronous publish
guarantees holds: all or nothing, the saved test cases gate with ``force`` (audited), the
configuration lock (a publish meeting another ends failed with the reason), a stale draft.

Asked twice or delivered twice, a job publishes once: the job ends ``done`` in the publish's own
transaction (``before_commit``), so a redelivery finds it finished, and a second job for the
same draft finds the draft published and is refused. The draft's ``updated_at`` when the job
was asked for is kept in its params (``revision``): a draft changed since is refused
(``draft_changed``) rather than something else published or tested.

The publish holds one transaction for its whole length, so its progress cannot be written from
it: a thread with its own connection writes the job's heartbeat meanwhile (``_Heartbeat``),
so that a long publish is not taken for a stalled one and claimed again. A job's result, or
its error, is the document the synchronous API call answered (``routing.drafts.documents``);
new sources' tokens, shown once, are kept sealed until the API shows them.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from routing.admin_jobs import job_enqueue, job_finish, job_mine, job_progress
from routing.drafts.documents import (
    REFUSALS,
    check_document,
    json_ready,
    publish_document,
    refusal_of,
)
from routing.drafts.models import ConfigDraft, ConfigDraftStatus, ConfigSnapshot
from routing.drafts.services import (
    ConfigPublish,
    DraftChanged,
    DraftRefused,
    config_draft_publish,
    config_rollback,
    draft_check,
)
from routing.models import AdminJob, AdminJobKind, AdminJobStatus

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

logger = logging.getLogger(__name__)

SEALED_TOKENS = "sealed_source_tokens"


def _user(user: AbstractBaseUser | AnonymousUser | None) -> Any:
    return user if user is not None and user.is_authenticated and user.pk is not None else None


def _revision(draft: ConfigDraft) -> str:
    return draft.updated_at.isoformat()


def _job_queue(
    kind: str, user: AbstractBaseUser | AnonymousUser | None, params: dict[str, Any], total: int
) -> AdminJob:
    """Create the job and hand it to a worker once the caller's transaction commits."""
    job = AdminJob.objects.create(
        kind=kind, requested_by=_user(user), params=params, progress_total=total
    )
    job_enqueue(job)
    return job


@transaction.atomic
def config_job_start_publish(
    *,
    draft_id: int,
    actor: str,
    user: AbstractBaseUser | AnonymousUser | None = None,
    force: bool = False,
    note: str = "",
    show_tokens: bool = False,
) -> AdminJob:
    """Queue the publish of draft ``draft_id`` as it is now. Raises DraftRefused when there is
    no such draft (404) or it is not open (409); everything else is the job's to find.
    ``show_tokens``: keep new sources' tokens (sealed) for the API to show once."""
    draft = ConfigDraft.objects.filter(pk=draft_id).first()
    if draft is None:
        raise DraftRefused("not_found", "No such draft.", status=404)
    if draft.status != ConfigDraftStatus.OPEN:
        raise DraftRefused("draft_closed", f"The draft is {draft.status}: start a new one.")
    asked = {"force": force, "note": note, "actor": actor, "show_tokens": show_tokens}
    params = {"draft_id": draft.pk, "revision": _revision(draft), **asked}
    return _job_queue(AdminJobKind.CONFIG_PUBLISH, user, params, 1)


@transaction.atomic
def config_job_start_rollback(
    *,
    number: int,
    actor: str,
    user: AbstractBaseUser | AnonymousUser | None = None,
    force: bool = False,
    note: str = "",
    show_tokens: bool = False,
) -> AdminJob:
    """Queue the rollback to configuration version ``number``. Raises DraftRefused (404) when
    there is no such version."""
    if not ConfigSnapshot.objects.filter(number=number).exists():
        raise DraftRefused("not_found", f"No configuration version {number}.", status=404)
    latest = ConfigSnapshot.objects.order_by("-number").values_list("number", flat=True).first()
    asked = {"force": force, "note": note, "actor": actor, "show_tokens": show_tokens}
    # "latest": what was live when it was asked for (see _publish)
    params = {"number": number, "latest": latest, **asked}
    return _job_queue(AdminJobKind.CONFIG_ROLLBACK, user, params, 1)


@transaction.atomic
def config_job_start_check(
    *,
    draft_id: int,
    leads: int,
    actor: str,
    user: AbstractBaseUser | AnonymousUser | None = None,
) -> AdminJob:
    """Queue the test run of draft ``draft_id`` as it is now over the last ``leads`` leads
    (at most ``REPLAY_MAX_LEADS``). Raises DraftRefused (404) when there is no such draft."""
    draft = ConfigDraft.objects.filter(pk=draft_id).first()
    if draft is None:
        raise DraftRefused("not_found", "No such draft.", status=404)
    leads = max(0, min(leads, settings.REPLAY_MAX_LEADS))
    params = {"draft_id": draft.pk, "revision": _revision(draft), "leads": leads, "actor": actor}
    return _job_queue(AdminJobKind.CONFIG_CHECK, user, params, leads)


# --- Running ------------------------------------------------------------------------------------


class _Superseded(Exception):
    """Another claim of the job took over: this run's publish is rolled back."""


class _Heartbeat:
    """While the publish's one transaction runs, a thread with its own database connection
    writes the job's heartbeat every quarter of ``ADMIN_JOB_STALE_SECONDS``. Stopped (and
    waited for) before the publish ends its job in its transaction, so the two never wait on
    the job's row for each other. Not on SQLite, where the publish holds the only write lock."""

    def __init__(self, job: AdminJob) -> None:
        self.job = job
        self.interval = max(1.0, settings.ADMIN_JOB_STALE_SECONDS / 4)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _Heartbeat:
        if connection.vendor == "postgresql":
            self._thread = threading.Thread(
                target=self._beat, name=f"admin-job-{self.job.pk}-heartbeat", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _beat(self) -> None:
        from django.db import connection as own  # this thread's connection

        try:
            while not self._stop.wait(self.interval):
                job_mine(self.job).update(updated_at=timezone.now())
        except Exception:
            logger.exception("admin job %s: the heartbeat failed", self.job.pk)
        finally:
            own.close()


# What a worker's session bounds (``config.celery``) that a publish must outlast: a statement, the
# time idle in its transaction, and the wait for a lock (the decide lock a batch of leads holds
# for its transaction, a team's or rep's row a decision holds).
_LONG = ("statement_timeout", "idle_in_transaction_session_timeout", "lock_timeout")


def _settings_set(cursor: Any, values: Sequence[str]) -> None:
    cursor.execute(
        "SELECT " + ", ".join(["set_config(%s, %s, false)"] * len(_LONG)),
        [item for pair in zip(_LONG, values, strict=True) for item in pair],
    )


@contextlib.contextmanager
def _long_transaction() -> Iterator[None]:
    """A worker's session bounds a statement, the time idle in a transaction and the wait for a
    lock (for the pipeline: ``config.celery``), but a publish's one transaction legitimately
    runs for minutes, much of it in Python between statements, and may wait for the leads in
    flight to let go of the decide lock: for the job's length all three are raised to its time
    limit, then put back as they were."""
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(["current_setting(%s)"] * len(_LONG)), list(_LONG))
        before = cursor.fetchone() or ("0",) * len(_LONG)
        _settings_set(cursor, [f"{settings.ADMIN_JOB_TIME_LIMIT_SECONDS}s"] * len(_LONG))
    try:
        yield
    finally:
        try:
            with connection.cursor() as cursor:
                _settings_set(cursor, list(before))
        except DatabaseError:  # the connection broke: closed, it is opened again anew
            connection.close()


def _fernet() -> Fernet:
    key = hashlib.sha256(f"admin-job-source-tokens:{settings.SECRET_KEY}".encode()).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def _result(job: AdminJob, published: ConfigPublish) -> dict[str, Any]:
    result = json_ready(publish_document(published))
    tokens = result.pop("source_tokens", None) or {}
    result["source_tokens"] = {}
    if tokens and job.params.get("show_tokens"):
        result[SEALED_TOKENS] = _fernet().encrypt(json.dumps(tokens).encode()).decode()
    return result


@transaction.atomic
def config_job_tokens_take(*, job_id: int) -> dict[str, str]:
    """New sources' tokens a publish or rollback job made, once: they are removed from the
    job as they are given out. Empty when there were none or they were taken."""
    job = AdminJob.objects.select_for_update().filter(pk=job_id).first()
    if job is None or not isinstance(job.result, dict) or SEALED_TOKENS not in job.result:
        return {}
    sealed = job.result.pop(SEALED_TOKENS)
    job.save(update_fields=["result"])
    try:
        return dict(json.loads(_fernet().decrypt(str(sealed).encode())))
    except (InvalidToken, ValueError):
        logger.warning("admin job %s: its sealed source tokens cannot be opened", job_id)
        return {}


def _refused(job: AdminJob, exc: Exception) -> None:
    refusal = refusal_of(exc)
    job_finish(
        job,
        status=AdminJobStatus.FAILED,
        error=refusal.in_words(),
        result={"error": refusal.as_error()},
    )


def _still_latest(job: AdminJob, published: ConfigPublish) -> None:
    """A rollback asked for while version N was live must not undo a version published after
    it (a colleague's publish that ran first): refused, its own version rolled back with it.
    Checked before the commit, under the configuration lock the rollback holds, so no publish
    comes between the check and the commit."""
    latest = job.params.get("latest")
    if not isinstance(latest, int):
        return  # asked for before there was any version, or by an older release: unguarded
    newer = (
        ConfigSnapshot.objects.filter(number__gt=latest)
        .exclude(number=published.snapshot.number)
        .order_by("number")
        .values_list("number", flat=True)
    )
    if newer:
        raise DraftRefused(
            "configuration_changed",
            f"Not rolled back: version {', '.join(map(str, newer))} was published after the "
            f"rollback was asked for (version {latest} was live then). Look at what changed, "
            "then ask again.",
        )


def _publish(job: AdminJob) -> None:
    params = job.params
    job_progress(job, "publishing")(0, 1)
    beat = _Heartbeat(job)

    def before_commit(published: ConfigPublish) -> None:
        if job.kind == AdminJobKind.CONFIG_ROLLBACK:
            _still_latest(job, published)
        beat.stop()
        if not job_finish(
            job,
            status=AdminJobStatus.DONE,
            phase="",
            progress_done=1,
            progress_total=1,
            result=_result(job, published),
        ):
            raise _Superseded

    common: dict[str, Any] = {
        "actor": str(params.get("actor") or "system"),
        "user": job.requested_by,
        "force": bool(params.get("force")),
        "note": str(params.get("note") or ""),
        "before_commit": before_commit,
    }
    try:
        with _long_transaction(), beat:
            if job.kind == AdminJobKind.CONFIG_PUBLISH:
                revision = parse_datetime(str(params.get("revision") or ""))
                config_draft_publish(
                    draft_id=int(params["draft_id"]),
                    revision=revision or timezone.now(),  # unreadable: refused as changed
                    **common,
                )
            else:
                config_rollback(number=int(params["number"]), **common)
    except REFUSALS as exc:
        _refused(job, exc)
    except _Superseded:
        logger.warning("admin job %s was claimed again while it ran; this run gave way", job.pk)


def _check(job: AdminJob) -> None:
    params = job.params
    draft = ConfigDraft.objects.filter(pk=int(params["draft_id"])).first()
    try:
        if draft is None:
            raise DraftRefused("not_found", "No such draft.", status=404)
        revision: datetime | None = parse_datetime(str(params.get("revision") or ""))
        if revision is None or draft.updated_at != revision:
            raise DraftChanged(draft, revision or timezone.now(), "test")
        check = draft_check(
            draft=draft,
            leads=int(params.get("leads", 0)),
            progress=job_progress(job, "deciding leads"),
        )
    except REFUSALS as exc:
        _refused(job, exc)
        return
    job_finish(
        job,
        status=AdminJobStatus.DONE,
        phase="",
        progress_done=check.considered,
        progress_total=check.considered,
        result=json_ready(check_document(check)),
    )


def config_job_run(job: AdminJob) -> None:
    """Run a claimed publish, rollback or check job (``routing.admin_jobs.admin_job_run``)."""
    if job.kind == AdminJobKind.CONFIG_CHECK:
        _check(job)
    else:
        _publish(job)
