"""Live changes of the routed configuration are configuration versions too.

A draft is the careful path; the admin's forms (teams, memberships, weights, reps' caps and
hours, territories, accounts, value lists, test cases), its ruleset-only publish and rollback,
a CSV import of territories or accounts and ``routing_import --publish`` change the tables
directly (``routing_import`` without ``--publish`` makes a draft). Each
of them runs inside ``config_live_change``: in its own transaction, under the configuration
lock (the publish lock without waiting, so the loser of two is told ``ConfigurationBusy``, then
the decide lock exclusively, so no lead is decided by a mix), and when the routed
configuration (``configuration_document``, without reps' live state) differs from the latest
version afterwards, it is stored as the next numbered ``ConfigSnapshot`` (kind ``live``, or
the caller's), audited with the same ``published`` event as a draft's publish. So rollback
covers it, and since each version has a ruleset version of its own (the published ruleset is
copied and published again when the change did not publish one), each lead's trace names the
version that decided it. A rep's live state (active, out of office, absences) is not part of a
version: a change of only that records nothing. With ``test_cases`` (the admin's saves), a change
runs the saved test cases against the configuration it leaves and is refused when one fails,
unless forced; forced, the version and its event name the failing cases.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.contrib.auth.models import AnonymousUser
from django.db import transaction

from audit.config_changes import config_change_record
from routing.configuration import configuration_lock, decide_lock_exclusive
from routing.decisions import clear_live_config_cache
from routing.drafts.diff import configuration_diff
from routing.drafts.models import ConfigSnapshot, ConfigSnapshotKind
from routing.drafts.snapshots import (
    config_snapshot_latest,
    config_snapshot_record,
    configuration_document,
    document_digest,
)
from routing.engine import RuleErrors
from routing.models import RuleSet
from routing.rules_io import ruleset_copy, ruleset_publish
from routing.selectors import ruleset_published
from routing.versions import TestCasesFailing, test_cases_run

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    User = AbstractBaseUser | AnonymousUser | None

_ROWS_AUDITED = 50


class LiveChangeRefused(Exception):
    """The change would leave a configuration that cannot be published as a version (the
    published rules no longer compile against it); nothing was written."""


def _user(user: User) -> AbstractBaseUser | None:
    if user is None or isinstance(user, AnonymousUser) or not user.is_authenticated:
        return None
    return user


def config_live_baseline(*, actor: str) -> None:
    """Before the first live change: store the published configuration as version 1
    (``baseline``) when no version exists yet, so that the change can be rolled back. Call it
    holding the configuration lock."""
    if config_snapshot_latest() is not None:
        return
    published = ruleset_published()
    if published is None:
        return  # nothing routes yet: the first version is stored when something is published
    config_snapshot_record(
        kind=ConfigSnapshotKind.BASELINE,
        document=configuration_document(),
        ruleset_version=published.version,
        actor=actor,
        note="The configuration before the first change",
    )


def config_live_version_record(
    *,
    actor: str,
    user: User = None,
    what: str,
    kind: str = ConfigSnapshotKind.LIVE,
    note: str = "",
    failing_test_cases: Sequence[str] = (),
    test_cases: bool = False,
    force: bool = False,
) -> ConfigSnapshot | None:
    """Store the routed configuration as the next version when it differs from the latest
    one; None when it does not (or nothing is published). Call it at the end of the change's
    transaction, holding the configuration lock (``config_live_change`` does both).

    With ``test_cases``, a change runs the saved test cases against the configuration it
    leaves (the published rules with the changed tables), as a publish does: TestCasesFailing
    when one fails, unless ``force``; forced, the version and its ``published`` event name the
    cases that failed.

    Raises LiveChangeRefused when a new ruleset version was needed and the published rules no
    longer compile, or TestCasesFailing (the caller's transaction must then roll back)."""
    try:
        document = configuration_document()
    except RuleSet.DoesNotExist:
        return None
    latest = config_snapshot_latest()
    published = ruleset_published()
    if published is None:  # configuration_document found one: unpublished meanwhile cannot be
        return None
    if (
        latest is not None
        and latest.digest == document_digest(document)
        and latest.ruleset_version == published.version
    ):
        return None  # nothing changed (a ruleset published again, even unchanged, is a version)
    if test_cases:
        results = test_cases_run(ruleset=published)
        failing = [result.case.name for result in results if not result.passed]
        if failing and not force:
            raise TestCasesFailing(results)
        failing_test_cases = [*failing_test_cases, *failing]
    if ConfigSnapshot.objects.filter(ruleset_version=published.version).exists():
        # The change published no ruleset: a ruleset version of its own all the same, since it
        # is what each lead's assignment and trace record to name its configuration version.
        try:
            published = ruleset_publish(
                ruleset=ruleset_copy(ruleset=published, actor=_user(user)),
                actor=_user(user),
                note=f"Published with {what}",
            )
        except RuleErrors as exc:
            raise LiveChangeRefused(
                f"Not saved: after this change the published rules no longer compile ({exc}). "
                "Change the rules first, or make both changes in one configuration draft."
            ) from exc
    changes = configuration_diff(before=latest.document if latest else {}, after=document)
    snapshot = config_snapshot_record(
        kind=kind,
        document=document,
        ruleset_version=published.version,
        actor=actor,
        note=(note or what).strip(),
        failing_test_cases=failing_test_cases,
    )
    config_change_record(
        actor=actor,
        obj=snapshot,
        action="published",
        after={"number": snapshot.number, "ruleset_version": snapshot.ruleset_version},
        extra={
            "kind": kind,
            "from": what,
            "rows": [change.words for change in changes[:_ROWS_AUDITED]],
            "changed": len(changes),
            **(
                {"forced": True, "failing_test_cases": list(failing_test_cases)}
                if failing_test_cases
                else {}
            ),
        },
    )
    return snapshot


@contextmanager
def config_live_change(
    *,
    actor: str,
    user: User = None,
    what: str,
    wait_seconds: float = 0.0,
    locks_claimed_rows: bool = False,
    test_cases: bool = False,
    force: bool = False,
) -> Iterator[list[Any]]:
    """Run a live change of the routed configuration as a version (see the module docstring).

    Opens a transaction (a savepoint inside one) and takes the configuration lock before the
    change's first statement: raises ConfigurationBusy when another publish, import or replay
    still holds it after ``wait_seconds``. Yields a list that receives the snapshot stored, if
    any. Raises LiveChangeRefused or TestCasesFailing (``test_cases`` without ``force``), rolled
    back, as ``config_live_version_record`` does.

    The decide lock is taken exclusively for the final swap only, unless the change may write
    a team's or a rep's row (``locks_claimed_rows``: see
    ``routing.configuration.plan_touches_claimed_rows``), which takes it before the change.
    """
    stored: list[Any] = []
    try:
        with transaction.atomic():
            configuration_lock(wait_seconds=wait_seconds)
            config_live_baseline(actor=actor)
            if locks_claimed_rows:
                decide_lock_exclusive()
            yield stored
            snapshot = config_live_version_record(
                actor=actor, user=user, what=what, test_cases=test_cases, force=force
            )
            if snapshot is not None:
                stored.append(snapshot)
            decide_lock_exclusive()  # the swap: leads wait only from here to the commit
    except BaseException:
        # Configurations compiled inside the rolled-back transaction carry numbers a later,
        # real change takes again: forget them (as configuration_import does).
        clear_live_config_cache()
        raise
