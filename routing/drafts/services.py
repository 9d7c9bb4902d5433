"""Drafts of the whole routing configuration: create, change, check, diff, publish, roll back.

A draft is a rules-as-code document (rules-format.md) begun from the published configuration
(``configuration_document``). It is checked exactly as ``routing_import --prune`` checks a file
(``rules_plan``, errors with their paths), with three differences: every section is required (a
draft is the whole configuration), a rep's live state (``active``, ``out_of_office_until``) and
planned absences are refused (they stay live, see ``snapshots.LIVE_REP_KEYS``), and reps are
never pruned (a rep the draft leaves out stays; reps come and go through the roster).

Publishing a draft, all or nothing in one transaction under the configuration lock (the one
``routing_import`` and the publish of a ruleset take): refused when another import or publish is
under way (``ConfigurationBusy``), when the published configuration changed since the draft
began (``DraftStale``, with what changed), when the document is invalid, or when a saved test
case fails against the resulting configuration unless ``force``. A stale draft can be rebased
(``config_draft_rebase``: its own row changes applied to the published configuration, refused
where both sides changed a row). Each publish stores a numbered
snapshot and a new ruleset version, the version every lead routed afterwards records. A rollback
publishes an earlier snapshot's document as a new version, with the same checks.
"""

from __future__ import annotations

import bisect
import copy
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.contrib.auth.models import AnonymousUser as AnonymousUserType
from django.db import transaction

from audit.config_changes import config_change_record
from routing.configuration import (
    CHECK_LEADS_DEFAULT,
    ConfigurationCheck,
    configuration_apply_plan,
    configuration_check_plan,
    configuration_lock,
    decide_lock_exclusive,
    plan_touches_claimed_rows,
)
from routing.decisions import clear_live_config_cache
from routing.drafts.diff import KEYS, NOUNS, RowChange, configuration_diff, row_change_words
from routing.drafts.models import (
    ConfigDraft,
    ConfigDraftStatus,
    ConfigSnapshot,
    ConfigSnapshotKind,
)
from routing.drafts.snapshots import (
    LIVE_REP_KEYS,
    config_snapshot_latest,
    config_snapshot_record,
    configuration_document,
    document_digest,
)
from routing.engine import RuleError
from routing.models import Rep, RuleSet
from routing.rules_io import (
    SECTIONS,
    RulesFileErrors,
    _Plan,
    rules_apply,
    rules_export,
    rules_plan,
    rules_prune,
    ruleset_copy,
    ruleset_publish,
)
from routing.selectors import ruleset_published
from routing.tables_io import Owners, Table, tables_plan

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

    Actor = AbstractBaseUser | None
    User = AbstractBaseUser | AnonymousUser | None

# PATCH sections: a draft's rows by natural key (rules by name, within the ruleset).
PATCH_SECTIONS = tuple(KEYS)
_STALE_SHOWN = 5


class DraftRefused(Exception):
    """A draft operation refused: ``code`` and ``status`` for the API."""

    def __init__(self, code: str, message: str, *, status: int = 409) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


class DraftChanged(DraftRefused):
    """The draft was changed after a background publish or test of it was asked for: it is
    refused rather than run on something other than what was asked for."""

    def __init__(self, draft: ConfigDraft, revision: datetime, what: str) -> None:
        super().__init__(
            "draft_changed",
            f"Draft {draft.pk} was changed (at {draft.updated_at.isoformat()}) after this "
            f"{what} was asked for (the draft as of {revision.isoformat()}); nothing was done, "
            f"so that nothing other than what was asked for runs. Look at the draft and ask "
            "again.",
        )


class DraftStale(DraftRefused):
    """The published configuration changed since the draft began; ``changes`` say how."""

    def __init__(self, message: str, changes: list[RowChange]) -> None:
        super().__init__("draft_stale", message)
        self.changes = changes


class DraftConflict(DraftRefused):
    """A rebase refused: ``conflicts`` are the rows both the draft and the published
    configuration changed since it began, one sentence each."""

    def __init__(self, message: str, conflicts: list[str]) -> None:
        super().__init__("rebase_conflict", message)
        self.conflicts = conflicts


# --- Checking a document ------------------------------------------------------------------------


def _draft_rules(document: Any) -> list[RuleError]:
    """What a draft may not hold that a rules file may (see the module docstring)."""
    if not isinstance(document, Mapping):
        return []  # rules_plan says so
    errors = [
        RuleError(section, "is required: a draft is the whole configuration")
        for section in SECTIONS
        if section not in document
    ]
    reps = document.get("reps")
    for i, rep in enumerate(reps if isinstance(reps, list) else []):
        if isinstance(rep, Mapping):
            errors.extend(
                RuleError(
                    f"reps[{i}].{key}",
                    "is a rep's live state, not part of a draft: set it with the roster API",
                )
                for key in LIVE_REP_KEYS
                if key in rep
            )
    sources = document.get("sources")
    for i, source in enumerate(sources if isinstance(sources, list) else []):
        if isinstance(source, Mapping) and "token" in source:
            errors.append(
                RuleError(
                    f"sources[{i}].token",
                    "a secret is not kept in a draft: a new source gets a fresh token",
                )
            )
    return errors


def draft_plan(document: Any) -> _Plan:
    """Check a draft's document as ``routing_import --prune`` checks a file, plus the draft's
    own rules; the plan, reps left out of pruning. Raises RulesFileErrors (every problem)."""
    errors = _draft_rules(document)
    try:
        plan = rules_plan(document, prune=True)
    except RulesFileErrors as exc:
        raise RulesFileErrors([*errors, *exc.errors]) from None
    if errors:
        raise RulesFileErrors(errors)
    return replace(plan, present=plan.present - {"reps"})


def draft_errors(*, draft: ConfigDraft) -> list[RuleError]:
    """Every problem of the draft against the database now; empty when it would import."""
    try:
        draft_plan(draft.document)
    except RulesFileErrors as exc:
        return list(exc.errors)
    return []


def draft_check(
    *,
    draft: ConfigDraft,
    leads: int = CHECK_LEADS_DEFAULT,
    progress: Callable[[int, int], None] | None = None,
) -> ConfigurationCheck:
    """The draft's test cases run against its whole configuration, and the decisions of the
    last ``leads`` leads compared with the published configuration's; writes nothing.
    ``progress(done, total)`` is told after each batch of leads. Raises RulesFileErrors when
    the draft is invalid, ConfigurationBusy during a publish."""
    return configuration_check_plan(plan=draft_plan(draft.document), leads=leads, progress=progress)


@dataclass(frozen=True)
class DraftDiff:
    """What publishing the draft would change, and whether it is stale."""

    changes: list[RowChange]
    stale: bool
    stale_changes: list[RowChange] = field(default_factory=list)  # published since it began


def draft_diff(*, draft: ConfigDraft) -> DraftDiff:
    """The draft against the published configuration now, row by row in words."""
    current = configuration_document()
    stale = document_digest(current) != draft.base_digest
    return DraftDiff(
        changes=configuration_diff(before=current, after=draft.document),
        stale=stale,
        stale_changes=(
            configuration_diff(before=draft.base_document, after=current) if stale else []
        ),
    )


# --- Changing a draft ---------------------------------------------------------------------------


def _nothing_published() -> DraftRefused:
    return DraftRefused(
        "nothing_published",
        "No configuration is published yet: import one first (routing_import --publish).",
    )


@transaction.atomic
def config_draft_create(*, actor: str, note: str = "") -> ConfigDraft:
    """A new draft holding the published configuration. The first draft also stores the
    published configuration as version 1 (``baseline``), so that its publish can be undone."""
    try:
        document = configuration_document()
    except RuleSet.DoesNotExist:
        raise _nothing_published() from None
    latest = config_snapshot_latest()
    if latest is None:
        published = ruleset_published()
        latest = config_snapshot_record(
            kind=ConfigSnapshotKind.BASELINE,
            document=document,
            ruleset_version=published.version if published is not None else 1,
            actor=actor,
            note="The configuration before the first draft",
        )
    draft = ConfigDraft.objects.create(
        note=note.strip()[:200],
        document=document,
        base_document=document,
        base_digest=document_digest(document),
        base_number=latest.number,
        created_by=actor[:200],
    )
    config_change_record(
        actor=actor,
        obj=draft,
        action="added",
        after={"note": draft.note, "base_number": draft.base_number},
    )
    return draft


def _open_locked(draft_id: int) -> ConfigDraft:
    draft = ConfigDraft.objects.select_for_update().filter(pk=draft_id).first()
    if draft is None:
        raise DraftRefused("not_found", "No such draft.", status=404)
    if draft.status != ConfigDraftStatus.OPEN:
        raise DraftRefused("draft_closed", f"The draft is {draft.status}: start a new one.")
    return draft


def _save_document(draft: ConfigDraft, document: Any, actor: str, how: str) -> ConfigDraft:
    draft_plan(document)  # refuse an invalid document: nothing written
    changes = configuration_diff(before=draft.document, after=document)
    draft.document = document
    draft.save(update_fields=["document", "updated_at"])
    if changes:
        config_change_record(
            actor=actor,
            obj=draft,
            action=how,
            extra={"rows": [change.words for change in changes[:50]], "changed": len(changes)},
        )
    return draft


@transaction.atomic
def config_draft_replace(*, draft_id: int, document: Any, actor: str) -> ConfigDraft:
    """Replace the draft's whole document. Raises RulesFileErrors (nothing written) when it is
    invalid, DraftRefused when the draft is not open."""
    return _save_document(_open_locked(draft_id), document, actor, "replaced")


_REMOVED: Any = object()  # a row removed by a patch, until its section is rebuilt


def _patched(document: Mapping[str, Any], changes: Any) -> dict[str, Any]:
    """``document`` with ``changes`` applied: {section: {natural key: entry or null}}."""
    if not isinstance(changes, Mapping) or not changes:
        raise RulesFileErrors(
            [RuleError("", "must be an object: {section: {name: entry or null}}")]
        )
    result = dict(document)
    ruleset = dict(result.get("ruleset") or {})
    errors: list[RuleError] = []
    for section, rows in changes.items():
        if section not in PATCH_SECTIONS:
            errors.append(
                RuleError(str(section), f"unknown section; one of {', '.join(PATCH_SECTIONS)}")
            )
            continue
        if not isinstance(rows, Mapping):
            errors.append(RuleError(section, "must be an object: {name: entry or null}"))
            continue
        key_field = KEYS[section]
        entries = (
            list(ruleset.get("rules") or [])
            if section == "rules"
            else list(result.get(section) or [])
        )

        fold = str.lower if section == "reps" else str
        # Where each key's rows are, found once (a 20,000-row section patched key by key
        # scanned the whole section per key); a removed row is a hole until the section is
        # rebuilt. A key's first row is the one a patch sets or removes, as before.
        where: dict[str, list[int]] = {}
        for i, existing in enumerate(entries):
            if isinstance(existing, Mapping):
                where.setdefault(fold(str(existing.get(key_field))), []).append(i)
        holes = False
        for key, entry in rows.items():
            folded = fold(str(key))
            places = where.get(folded) or []
            if entry is None:
                if not places:
                    errors.append(RuleError(f"{section}.{key}", "not in the draft"))
                else:
                    entries[places.pop(0)] = _REMOVED
                    holes = True
                continue
            if not isinstance(entry, Mapping):
                errors.append(RuleError(f"{section}.{key}", "must be an object or null"))
                continue
            row = {key_field: key, **entry}
            named = fold(str(row.get(key_field)))  # an entry's own key renames the row
            if places:
                at = places[0]
                entries[at] = row
                if named != folded:
                    places.pop(0)
                    bisect.insort(where.setdefault(named, []), at)
            else:
                bisect.insort(where.setdefault(named, []), len(entries))
                entries.append(row)
        if holes:
            entries = [entry for entry in entries if entry is not _REMOVED]
        if section == "rules":
            ruleset["rules"] = entries
            result["ruleset"] = ruleset
        else:
            result[section] = entries
    if errors:
        raise RulesFileErrors(errors)
    return result


_POSITION = re.compile(r"(ruleset\.rules|[a-z_]+)\[(\d+)\]")


def _row_named(written: str, index: int, document: Mapping[str, Any]) -> str | None:
    """``teams[name=EMEA SDR]`` for ``written`` (``teams``, ``ruleset.rules``, ``rules``) and a
    position, when that row has a key; None otherwise."""
    section = "rules" if written in ("ruleset.rules", "rules") else written
    if section not in KEYS:
        return None
    key_field = KEYS[section]
    rows = _section_rows(document, section)
    row = rows[index] if index < len(rows) else None
    key = row.get(key_field) if isinstance(row, Mapping) else None
    if not isinstance(key, str) or not key:
        return None
    return f"{written}[{key_field}={key}]"


def _keyed(error: RuleError, document: Mapping[str, Any]) -> RuleError:
    """``error`` with the list position its path starts with (``teams[3]``) replaced by the
    row's natural key (``teams[name=EMEA SDR]``), when the row has one; so are the positions
    its message names (a duplicate's "also rules[0]")."""
    path = error.path
    found = _POSITION.match(path)
    if found is not None:
        named = _row_named(found[1], int(found[2]), document)
        if named is not None:
            path = named + path[found.end() :]
    message = _POSITION.sub(
        lambda seen: _row_named(seen[1], int(seen[2]), document) or seen[0], error.message
    )
    if (path, message) == (error.path, error.message):
        return error
    return RuleError(path, message)


def _section_rows(document: Mapping[str, Any], section: str) -> list[Any]:
    if section == "rules":
        ruleset = document.get("ruleset")
        rows = ruleset.get("rules") if isinstance(ruleset, Mapping) else None
    else:
        rows = document.get(section)
    return rows if isinstance(rows, list) else []


@transaction.atomic
def config_draft_patch(*, draft_id: int, changes: Any, actor: str) -> ConfigDraft:
    """Change rows of the draft by natural key: ``{"teams": {"EMEA SDR": {...}, "Old": null}}``
    sets (adds, or replaces whole) or removes each row; ``rules`` are the ruleset's, by name.
    An entry's own key, when it differs from the one it is filed under, renames the row.
    Raises RulesFileErrors (nothing written) when the result is invalid, each error's path
    naming the row by its key as the patch does (``teams[name=EMEA SDR].strategy``), not by
    its position in the draft."""
    draft = _open_locked(draft_id)
    document = _patched(draft.document, changes)
    try:
        return _save_document(draft, document, actor, "changed")
    except RulesFileErrors as exc:
        raise type(exc)([_keyed(error, document) for error in exc.errors]) from None


@transaction.atomic
def config_draft_discard(*, draft_id: int, actor: str) -> ConfigDraft:
    """Close a draft without publishing it."""
    draft = _open_locked(draft_id)
    draft.status = ConfigDraftStatus.DISCARDED
    draft.save(update_fields=["status", "updated_at"])
    config_change_record(
        actor=actor,
        obj=draft,
        action="discarded",
        before={"status": ConfigDraftStatus.OPEN},
        after={"status": draft.status},
    )
    return draft


def _draft_owners(document: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The team names and rep e-mails of a draft's document: what its CSV rows may name."""
    names: dict[str, list[str]] = {}
    for section, key in (("teams", "name"), ("reps", "email")):
        rows = document.get(section)
        names[section] = [
            row[key]
            for row in (rows if isinstance(rows, list) else [])
            if isinstance(row, Mapping) and isinstance(row.get(key), str)
        ]
    return names["teams"], names["reps"]


@dataclass(frozen=True)
class TableIntoDraft:
    """What a CSV import into a draft did."""

    draft: ConfigDraft
    rows: int  # data rows in the file
    set: int  # territories or accounts the file set (added or replaced)
    removed: int  # with ``delete_missing``: rows of the draft the file did not name


@transaction.atomic
def config_draft_import_table(
    *, draft_id: int, table: Table, content: str, delete_missing: bool, actor: str
) -> TableIntoDraft:
    """A territories or accounts CSV (``routing.tables_io``'s format, checked by its row-precise
    checks) into the draft rather than the live tables: a territory of the file replaces the
    draft's of that name whole, an account is set by domain, new ones are appended; with
    ``delete_missing`` the draft's rows the file does not name are removed. Owners must be
    the draft's teams and reps (one it adds counts, one it removes does not). Raises
    TableErrors (row by row) or RulesFileErrors (the draft it would make is invalid); nothing
    is written then."""
    draft = _open_locked(draft_id)
    teams, emails = _draft_owners(draft.document)
    plan = tables_plan(
        table=table,
        content=content,
        delete_missing=delete_missing,
        owners=Owners(
            teams={name: i for i, name in enumerate(teams)},
            reps={email.lower(): i for i, email in enumerate(emails)},
            where=" in the draft",
        ),
    )
    spelled = {email.lower(): email for email in emails}  # the draft's own spelling
    if table == "territories":
        key_field = "name"
        rows = [
            {
                "name": entry.name,
                "countries": entry.countries,
                "regions": entry.regions,
                "postal_prefixes": entry.postal_prefixes,
                entry.owner[0]: (
                    spelled[entry.owner[1]] if entry.owner[0] == "rep" else entry.owner[1]
                ),
            }
            for entry in plan.entries
        ]
    else:
        key_field = "domain"
        rows = [
            {
                "domain": entry.domain,
                "name": entry.name,
                "owner": emails[entry.owner_id] if entry.owner_id is not None else None,
                "tier": entry.tier,
            }
            for entry in plan.entries
        ]
    by_key = {row[key_field]: row for row in rows}
    current = [e for e in draft.document.get(table) or [] if isinstance(e, Mapping)]
    merged: list[Any] = []
    removed = 0
    for entry in current:
        key = entry.get(key_field)
        if key in by_key:
            merged.append(by_key.pop(key))
        elif delete_missing:
            removed += 1
        else:
            merged.append(entry)
    merged.extend(by_key.values())
    document = {**draft.document, table: merged}
    draft = _save_document(draft, document, actor, f"{table} imported")
    return TableIntoDraft(draft=draft, rows=plan.rows, set=len(rows), removed=removed)


# --- A rules-as-code file into a draft ----------------------------------------------------------


@dataclass(frozen=True)
class FileIntoDraft:
    """What ``config_draft_import_file`` did: the draft (None when the file changes nothing
    in the published configuration), its rows in words, and what of the file a draft does not
    hold (``path: why``)."""

    draft: ConfigDraft | None
    changes: list[RowChange]
    left_out: list[str]


def _left_out_of_draft(data: Mapping[str, Any]) -> list[str]:
    """What a file may hold that a draft does not (``_draft_rules``), in words."""
    notes: list[str] = []
    reps = data.get("reps")
    for i, rep in enumerate(reps if isinstance(reps, list) else []):
        if isinstance(rep, Mapping):
            notes.extend(
                f"reps[{i}].{key}: a rep's live state, not part of a draft: left out (set it "
                "with the roster API, or import the file with --publish)"
                for key in LIVE_REP_KEYS
                if key in rep
            )
    sources = data.get("sources")
    for i, source in enumerate(sources if isinstance(sources, list) else []):
        if isinstance(source, Mapping) and "token" in source:
            notes.append(
                f"sources[{i}].token: a secret is not kept in a draft: left out (a new source "
                "gets a fresh token when the draft is published, shown once)"
            )
    return notes


class _Undone(Exception):  # not an error: carries the document out of a rollback
    def __init__(self, document: dict[str, Any]) -> None:
        super().__init__("rolled back")
        self.document = document


def _document_after_import(plan: _Plan) -> dict[str, Any]:
    """The configuration document an import of ``plan`` would leave (published with its
    ruleset), without reps' live state: the import itself, written and exported in a savepoint
    that is then rolled back, so that the draft holds exactly what the import would (every
    default, every normalisation, a pruned row gone). Nothing stays written; callbacks the
    import registered for after the commit (re-routing) are dropped with it."""
    live = {"active", "out_of_office_until"}
    for entry in plan.sections["reps"]:
        entry.fields = {key: value for key, value in entry.fields.items() if key not in live}
        entry.refs.pop("absences", None)  # live state: never applied by a draft
        entry.refs.pop("absence_paths", None)
    try:
        with transaction.atomic():
            if plan_touches_claimed_rows(plan):
                decide_lock_exclusive()  # as an import does: see plan_touches_claimed_rows
            result = rules_apply(plan=plan)
            if plan.prune:
                rules_prune(plan=plan, live_rules=plan.rules)  # the file's rules, as published
            raise _Undone(rules_export(result.ruleset.version))
    except _Undone as undone:
        document = undone.document
    finally:
        clear_live_config_cache()  # configurations compiled in the savepoint are gone with it
    for rep in document["reps"]:
        for key in LIVE_REP_KEYS:
            rep.pop(key, None)
    return document


@transaction.atomic(durable=True)
def config_draft_import_file(
    *, data: Any, prune: bool = False, actor: str, note: str = ""
) -> FileIntoDraft:
    """A rules-as-code file (``routing_import FILE`` without ``--publish``) into a new draft of
    the whole configuration, to be tested, diffed and published from the admin or the API: the
    published configuration as importing the file would leave it (``prune``: without what the
    file no longer names, but reps, which a draft never deletes). The live tables are not
    changed. A rep's live state (``active``, ``out_of_office_until``, ``absences``) and source
    tokens are left out (``FileIntoDraft.left_out``). No draft is made when the file changes
    nothing.

    Raises ConfigurationBusy (an import or publish under way), RulesFileErrors (every problem
    with its path; PruneRefused), DraftRefused (nothing published yet); nothing is written then.
    """
    configuration_lock()
    plan = rules_plan(data, prune=prune)
    kept_reps: list[str] = []
    if plan.prune and "reps" in plan.present:
        named = {entry.key.lower() for entry in plan.sections["reps"]}
        kept_reps = sorted(
            e for e in Rep.objects.values_list("email", flat=True) if e.lower() not in named
        )
        plan = replace(plan, present=plan.present - {"reps"})  # a draft never deletes a rep
    document = _document_after_import(plan)
    try:
        current = configuration_document()
    except RuleSet.DoesNotExist:
        raise _nothing_published() from None
    changes = configuration_diff(before=current, after=document)
    left_out = _left_out_of_draft(data)
    if kept_reps:
        left_out.append(
            f"reps: {', '.join(kept_reps[:_STALE_SHOWN])}"
            + (
                f" and {len(kept_reps) - _STALE_SHOWN} more"
                if len(kept_reps) > _STALE_SHOWN
                else ""
            )
            + ": not in the file, but a draft never deletes a rep: kept (deactivate or delete "
            "them with the roster API or in the admin, or import the file with --publish)"
        )
    if not changes:
        return FileIntoDraft(draft=None, changes=[], left_out=left_out)
    draft = config_draft_create(actor=actor, note=note)
    draft = _save_document(draft, document, actor, "imported")
    return FileIntoDraft(draft=draft, changes=changes, left_out=left_out)


def _entries(document: Mapping[str, Any], section: str) -> dict[str, Any]:
    """A section's rows by natural key (reps ignoring case), in document order."""
    if section == "rules":
        ruleset = document.get("ruleset")
        raw = ruleset.get("rules") if isinstance(ruleset, Mapping) else None
    else:
        raw = document.get(section)
    key_field = KEYS[section]
    rows: dict[str, Any] = {}
    for entry in raw if isinstance(raw, list) else []:
        if isinstance(entry, Mapping) and isinstance(entry.get(key_field), str):
            key = entry[key_field].strip()
            rows[key.lower() if section == "reps" else key] = entry
    return rows


def _rebased(
    base: Mapping[str, Any], mine: Mapping[str, Any], theirs: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """``mine``'s changes from ``base`` applied to ``theirs``, row by row; and the rows both
    changed differently (conflicts), in words."""
    result = copy.deepcopy(dict(theirs))
    conflicts: list[str] = []
    for section in KEYS:
        b, m, t = _entries(base, section), _entries(mine, section), _entries(theirs, section)
        merged = dict(t)
        for key in [*m, *(k for k in b if k not in m)]:
            if m.get(key) == b.get(key):
                continue  # the draft left this row alone
            if t.get(key) not in (b.get(key), m.get(key)):
                shown = (m.get(key) or b.get(key) or {}).get(KEYS[section], key)
                conflicts.append(
                    f'{NOUNS[section]} "{shown}" was changed both in the draft '
                    f"({row_change_words(section, b.get(key), m.get(key))}) and in the "
                    f"published configuration ({row_change_words(section, b.get(key), t.get(key))})"
                )
            elif key in m:
                merged[key] = m[key]
            else:
                merged.pop(key, None)
        rows = [copy.deepcopy(entry) for entry in merged.values()]
        if section == "rules":
            result["ruleset"] = {**dict(result.get("ruleset") or {}), "rules": rows}
        else:
            result[section] = rows
    names = [
        doc.get("ruleset", {}).get("name") if isinstance(doc.get("ruleset"), Mapping) else None
        for doc in (base, mine, theirs)
    ]
    if names[1] != names[0]:
        if names[2] not in (names[0], names[1]):
            conflicts.append("The ruleset was renamed both in the draft and since it began")
        else:
            result["ruleset"]["name"] = names[1]
    return result, conflicts


@transaction.atomic
def config_draft_rebase(*, draft_id: int, actor: str) -> ConfigDraft:
    """Begin the draft again from the published configuration now, with its own changes
    applied row by row. Raises DraftConflict (``rebase_conflict``, the rows both sides changed)
    or RulesFileErrors (the result is invalid, e.g. a row it needs was removed); nothing
    written then. A draft that is not stale is left as it is."""
    draft = _open_locked(draft_id)
    try:
        current = configuration_document()
    except RuleSet.DoesNotExist:
        raise _nothing_published() from None
    digest = document_digest(current)
    if digest == draft.base_digest:
        return draft
    merged, conflicts = _rebased(draft.base_document, draft.document, current)
    if conflicts:
        raise DraftConflict(
            "Not rebased, nothing written: "
            + "; ".join(conflicts[:_STALE_SHOWN])
            + (
                f" and {len(conflicts) - _STALE_SHOWN} more"
                if len(conflicts) > _STALE_SHOWN
                else ""
            )
            + ". Begin a new draft and apply the change again.",
            conflicts,
        )
    draft_plan(merged)
    latest = config_snapshot_latest()
    before = draft.base_number
    draft.document = merged
    draft.base_document = current
    draft.base_digest = digest
    draft.base_number = latest.number if latest is not None else None
    draft.save(
        update_fields=["document", "base_document", "base_digest", "base_number", "updated_at"]
    )
    config_change_record(
        actor=actor,
        obj=draft,
        action="rebased",
        before={"base_number": before},
        after={"base_number": draft.base_number},
    )
    return draft


# --- Publishing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigPublish:
    """What a publish or rollback did."""

    snapshot: ConfigSnapshot
    changes: list[RowChange]
    failing: tuple[str, ...] = ()  # test cases failing, published over (force)
    source_tokens: dict[str, str] = field(default_factory=dict)  # new source -> token, once


def _actor_user(user: User) -> Actor:
    if user is None or isinstance(user, AnonymousUserType) or not user.is_authenticated:
        return None
    return user


def _publish_document(
    *,
    document: Any,
    kind: str,
    actor: str,
    user: User,
    force: bool,
    note: str,
    what: str,
    rolled_back_to: int | None = None,
) -> ConfigPublish:
    plan = draft_plan(document)
    before_document = configuration_document()
    before = ruleset_published()
    imported = configuration_apply_plan(
        plan=plan, publish=True, force=force, actor=_actor_user(user), file_name=what
    )
    ruleset = imported.result.ruleset
    if before is not None and ruleset.pk == before.pk:
        # Every version of the configuration has its own ruleset version: it is what each
        # lead's assignment and trace record, so it names the configuration that decided it.
        ruleset = ruleset_publish(
            ruleset=ruleset_copy(ruleset=ruleset, actor=_actor_user(user)),
            actor=_actor_user(user),
            note=f"Published with {what}",
        )
    after_document = configuration_document()
    changes = configuration_diff(before=before_document, after=after_document)
    snapshot = config_snapshot_record(
        kind=kind,
        document=after_document,
        ruleset_version=ruleset.version,
        actor=actor,
        note=note.strip(),
        rolled_back_to=rolled_back_to,
        failing_test_cases=imported.failing,
    )
    config_change_record(
        actor=actor,
        obj=snapshot,
        action="published",
        after={"number": snapshot.number, "ruleset_version": snapshot.ruleset_version},
        extra={
            "kind": kind,
            "from": what,
            "rows": [change.words for change in changes[:50]],
            "changed": len(changes),
            **({"rolled_back_to": rolled_back_to} if rolled_back_to is not None else {}),
            **(
                {"forced": True, "failing_test_cases": list(imported.failing)}
                if imported.failing
                else {}
            ),
        },
    )
    return ConfigPublish(
        snapshot=snapshot,
        changes=changes,
        failing=imported.failing,
        source_tokens=dict(imported.result.source_tokens),
    )


# Called with what a publish did, inside its transaction, before it commits: a background job
# (``routing.admin_jobs``) ends itself there, so that the job is done exactly when the publish
# is committed; raising in it rolls the publish back.
BeforeCommit = Callable[[ConfigPublish], None]


@transaction.atomic(durable=True)
def config_draft_publish(
    *,
    draft_id: int,
    actor: str,
    user: User = None,
    force: bool = False,
    note: str = "",
    revision: datetime | None = None,
    before_commit: BeforeCommit | None = None,
) -> ConfigPublish:
    """Publish a draft as the next configuration version, all or nothing.

    ``revision``: the draft's ``updated_at`` when the publish was asked for; a draft changed
    since is refused (``draft_changed``). Raises ConfigurationBusy (another import or publish
    holds the lock), DraftRefused (not found, not open, changed), DraftStale, RulesFileErrors
    (the document, with paths; PruneRefused for a row live leads still need) or
    TestCasesFailing (without ``force``); nothing is written then.
    """
    try:
        configuration_lock()
        draft = _open_locked(draft_id)
        if revision is not None and draft.updated_at != revision:
            raise DraftChanged(draft, revision, "publish")
        current = configuration_document()
        if document_digest(current) != draft.base_digest:
            changes = configuration_diff(before=draft.base_document, after=current)
            shown = "; ".join(change.words for change in changes[:_STALE_SHOWN])
            more = f" and {len(changes) - _STALE_SHOWN} more" if len(changes) > _STALE_SHOWN else ""
            latest = config_snapshot_latest()
            raise DraftStale(
                f"The published configuration changed since this draft began (from version "
                f"{draft.base_number}, now {latest.number if latest else '—'}): "
                f"{shown or 'live edits'}{more}. Rebase the draft (its changes applied to "
                "the published configuration) or begin a new one; nothing was written.",
                changes,
            )
        published = _publish_document(
            document=draft.document,
            kind=ConfigSnapshotKind.DRAFT,
            actor=actor,
            user=user,
            force=force,
            note=note or draft.note,
            what=f"configuration draft {draft.pk}",
        )
        draft.status = ConfigDraftStatus.PUBLISHED
        draft.published_as = published.snapshot
        draft.save(update_fields=["status", "published_as", "updated_at"])
        if before_commit is not None:
            before_commit(published)
        decide_lock_exclusive()  # the swap: the last statement before the commit
    except BaseException:
        # Configurations compiled inside the rolled-back transaction carry numbers a later,
        # real change takes again: forget them (as configuration_import does).
        clear_live_config_cache()
        raise
    return published


@dataclass(frozen=True)
class _RollbackReps:
    """How a version's reps are found today (``_rollback_reps``)."""

    document: Any  # the version's document without the reps gone
    renamed: dict[int, str]  # rep id -> the version's e-mail, for reps renamed since
    gone: list[str]  # the version's e-mails of reps that no longer exist


def _rollback_reps(snapshot: ConfigSnapshot) -> _RollbackReps:
    """Find the reps version ``snapshot`` names as they are today, by e-mail first, else by the
    id the version recorded (``rep_ids``): a rollback identifies each rep and never creates
    one. Re-creating a rep by e-mail would bring back, as a new row that is active, a rep who
    left (their live state is not in a version), or make a second row for a rep whose e-mail
    changed since. So a rep renamed since is renamed back (the same row, e-mail restored like
    any design field), and a rep deleted since is left out of the reps and the teams' members;
    a rule, territory, account, calendar or test case still naming one refuses the rollback
    with its path."""
    document = snapshot.document
    reps = document.get("reps") if isinstance(document, Mapping) else None
    if not isinstance(reps, list):
        return _RollbackReps(document, {}, [])
    live = dict(Rep.objects.values_list("pk", "email"))
    live_emails = {email.lower() for email in live.values()}
    named = {
        rep["email"].lower(): rep["email"]
        for rep in reps
        if isinstance(rep, Mapping) and isinstance(rep.get("email"), str)
    }
    recorded = snapshot.rep_ids or {}
    renamed: dict[int, str] = {}
    gone: list[str] = []
    for key, email in named.items():
        if key in live_emails:
            continue
        rep_id = recorded.get(key)
        now = live.get(rep_id) if isinstance(rep_id, int) else None
        if isinstance(rep_id, int) and now is not None and now.lower() not in named:
            renamed[rep_id] = email  # the same rep, known by another e-mail since
        else:
            gone.append(email)
    if not gone:
        return _RollbackReps(document, renamed, [])
    dropped = {email.lower() for email in gone}
    kept = copy.deepcopy(dict(document))
    kept["reps"] = [
        rep
        for rep in kept["reps"]
        if not (isinstance(rep, Mapping) and str(rep.get("email", "")).lower() in dropped)
    ]
    for team in kept.get("teams") or []:
        if isinstance(team, dict) and isinstance(team.get("members"), list):
            team["members"] = [
                member
                for member in team["members"]
                if not (
                    isinstance(member, Mapping) and str(member.get("rep", "")).lower() in dropped
                )
            ]
    return _RollbackReps(kept, renamed, gone)


@transaction.atomic(durable=True)
def config_rollback(
    *,
    number: int,
    actor: str,
    user: User = None,
    force: bool = False,
    note: str = "",
    before_commit: BeforeCommit | None = None,
) -> ConfigPublish:
    """Publish configuration version ``number``'s document again, as a new version; the same
    checks and errors as ``config_draft_publish`` (no staleness: it replaces whatever is live).
    Reps are identified by e-mail, else by id, and never created: one renamed since is renamed
    back, one deleted since is left out and named in the version's note (``_rollback_reps``).
    """
    try:
        configuration_lock()
        snapshot = ConfigSnapshot.objects.filter(number=number).first()
        if snapshot is None:
            raise DraftRefused("not_found", f"No configuration version {number}.", status=404)
        reps = _rollback_reps(snapshot)
        gone = reps.gone
        left_out = f" (without reps deleted since: {', '.join(gone)})" if gone else ""
        if reps.renamed:
            # A rep's row written: the decide lock first (a lead being decided locks it).
            decide_lock_exclusive()
            for rep_id, email in reps.renamed.items():
                Rep.objects.filter(pk=rep_id).update(email=email)
        try:
            published = _publish_document(
                document=reps.document,
                kind=ConfigSnapshotKind.ROLLBACK,
                actor=actor,
                user=user,
                force=force,
                note=(note or f"Rollback to version {number}") + left_out,
                what=f"configuration version {number}",
                rolled_back_to=number,
            )
        except RulesFileErrors as exc:
            if not gone:
                raise
            raise RulesFileErrors(
                [
                    RuleError(
                        "reps",
                        f"version {number} names reps that no longer exist ({', '.join(gone)}): "
                        "a rollback does not bring back a deleted rep; what still names them "
                        "follows",
                    ),
                    *exc.errors,
                ]
            ) from None
        if before_commit is not None:
            before_commit(published)
        decide_lock_exclusive()  # the swap: the last statement before the commit
    except BaseException:
        clear_live_config_cache()
        raise
    return published
