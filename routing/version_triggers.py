"""Published and archived ruleset versions are frozen by the database, for PostgreSQL and SQLite.

The models refuse too (``Rule.save``/``delete``, ``RuleSet.save``/``delete``), but a queryset's
``update()``, ``delete()`` or ``bulk_create()``, or raw SQL, skips them. These triggers refuse:

- INSERT, UPDATE and DELETE of a rule whose ruleset (before or after) is not a draft;
- DELETE of a ruleset that is not a draft;
- UPDATE of a ruleset that is not a draft, except: published → archived (what publishing the
  next version does) with nothing else changed, and ``created_by``/``published_by`` set to NULL
  (a deleted user). A draft changes freely; draft → published is how publishing starts.

Both refuse with an IntegrityError ("… only drafts can change"). Made by the migration that
added them on PostgreSQL; on SQLite, where a migration rebuilding ``routing_ruleset`` would
fail on a trigger of ``routing_rule`` naming it, they are dropped before every migrate and made
after it (``routing.apps``), as are both after ``manage.py flush``.
"""

from __future__ import annotations

from typing import Any

MESSAGE = "published and archived ruleset versions are read-only: only drafts can change"

_PG_CREATE = [
    """
    CREATE OR REPLACE FUNCTION routing_rule_draft_only() RETURNS trigger AS $$
    DECLARE
        state text;
    BEGIN
        -- FOR SHARE: wait for a publish of the same ruleset in flight, then see its outcome.
        IF TG_OP IN ('UPDATE', 'DELETE') THEN
            SELECT status INTO state FROM routing_ruleset WHERE id = OLD.ruleset_id FOR SHARE;
            IF state IS NOT NULL AND state <> 'draft' THEN
                RAISE EXCEPTION '{MESSAGE}' USING ERRCODE = 'integrity_constraint_violation';
            END IF;
        END IF;
        IF TG_OP IN ('INSERT', 'UPDATE') THEN
            SELECT status INTO state FROM routing_ruleset WHERE id = NEW.ruleset_id FOR SHARE;
            IF state IS NOT NULL AND state <> 'draft' THEN
                RAISE EXCEPTION '{MESSAGE}' USING ERRCODE = 'integrity_constraint_violation';
            END IF;
            RETURN NEW;
        END IF;
        RETURN OLD;
    END;
    $$ LANGUAGE plpgsql
    """.replace("{MESSAGE}", MESSAGE),
    """
    CREATE TRIGGER routing_rule_draft_only BEFORE INSERT OR UPDATE OR DELETE ON routing_rule
    FOR EACH ROW EXECUTE FUNCTION routing_rule_draft_only()
    """,
    f"""
    CREATE OR REPLACE FUNCTION routing_ruleset_frozen() RETURNS trigger AS $$
    BEGIN
        IF TG_OP = 'DELETE' THEN
            IF OLD.status <> 'draft' THEN
                RAISE EXCEPTION '{MESSAGE}' USING ERRCODE = 'integrity_constraint_violation';
            END IF;
            RETURN OLD;
        END IF;
        IF OLD.status = 'draft' THEN
            RETURN NEW;
        END IF;
        IF NEW.id = OLD.id AND NEW.version = OLD.version AND NEW.name = OLD.name
            AND NEW.note = OLD.note AND NEW.created_at = OLD.created_at
            AND NEW.published_at IS NOT DISTINCT FROM OLD.published_at
            AND (NEW.created_by_id IS NULL OR NEW.created_by_id = OLD.created_by_id)
            AND (NEW.published_by_id IS NULL OR NEW.published_by_id = OLD.published_by_id)
            AND (NEW.status = OLD.status OR (OLD.status = 'published' AND NEW.status = 'archived'))
        THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION '{MESSAGE}' USING ERRCODE = 'integrity_constraint_violation';
    END;
    $$ LANGUAGE plpgsql
    """,
    """
    CREATE TRIGGER routing_ruleset_frozen BEFORE UPDATE OR DELETE ON routing_ruleset
    FOR EACH ROW EXECUTE FUNCTION routing_ruleset_frozen()
    """,
]
_PG_DROP = [
    "DROP TRIGGER IF EXISTS routing_rule_draft_only ON routing_rule",
    "DROP TRIGGER IF EXISTS routing_ruleset_frozen ON routing_ruleset",
    "DROP FUNCTION IF EXISTS routing_rule_draft_only()",
    "DROP FUNCTION IF EXISTS routing_ruleset_frozen()",
]

_STATE = "(SELECT status FROM routing_ruleset WHERE id = {row}.ruleset_id)"
_REFUSE = f"BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
_SQLITE_CREATE = [
    f"""
    CREATE TRIGGER IF NOT EXISTS routing_rule_draft_only_insert BEFORE INSERT ON routing_rule
    WHEN {_STATE.format(row="NEW")} <> 'draft' {_REFUSE}
    """,
    f"""
    CREATE TRIGGER IF NOT EXISTS routing_rule_draft_only_update BEFORE UPDATE ON routing_rule
    WHEN {_STATE.format(row="OLD")} <> 'draft' OR {_STATE.format(row="NEW")} <> 'draft' {_REFUSE}
    """,
    f"""
    CREATE TRIGGER IF NOT EXISTS routing_rule_draft_only_delete BEFORE DELETE ON routing_rule
    WHEN {_STATE.format(row="OLD")} <> 'draft' {_REFUSE}
    """,
    f"""
    CREATE TRIGGER IF NOT EXISTS routing_ruleset_frozen_delete BEFORE DELETE ON routing_ruleset
    WHEN OLD.status <> 'draft' {_REFUSE}
    """,
    f"""
    CREATE TRIGGER IF NOT EXISTS routing_ruleset_frozen_update BEFORE UPDATE ON routing_ruleset
    WHEN OLD.status <> 'draft' AND NOT (
        NEW.id = OLD.id AND NEW.version = OLD.version AND NEW.name = OLD.name
        AND NEW.note = OLD.note AND NEW.created_at = OLD.created_at
        AND NEW.published_at IS OLD.published_at
        AND (NEW.created_by_id IS NULL OR NEW.created_by_id = OLD.created_by_id)
        AND (NEW.published_by_id IS NULL OR NEW.published_by_id = OLD.published_by_id)
        AND (NEW.status = OLD.status OR (OLD.status = 'published' AND NEW.status = 'archived'))
    ) {_REFUSE}
    """,
]
_SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS routing_rule_draft_only_insert",
    "DROP TRIGGER IF EXISTS routing_rule_draft_only_update",
    "DROP TRIGGER IF EXISTS routing_rule_draft_only_delete",
    "DROP TRIGGER IF EXISTS routing_ruleset_frozen_delete",
    "DROP TRIGGER IF EXISTS routing_ruleset_frozen_update",
]


def _statements(vendor: str, *, create: bool) -> list[str]:
    if vendor == "postgresql":
        return _PG_CREATE if create else _PG_DROP
    if vendor == "sqlite":
        return _SQLITE_CREATE if create else _SQLITE_DROP
    raise NotImplementedError(f"no ruleset version triggers for the {vendor} database")


def version_triggers_create(connection: Any) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, create=False):
            cursor.execute(sql)
        for sql in _statements(connection.vendor, create=True):
            cursor.execute(sql)


def version_triggers_drop(connection: Any) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, create=False):
            cursor.execute(sql)
