"""The routing configuration's version: bumped by the database on every change that matters.

Workers cache the compiled live configuration (rules, teams and their members, territories,
value lists, the reps' e-mails and time zones) and check one small row per lead to know whether
it is still current. Triggers on the configuration tables bump that row in the writer's own
transaction, whatever wrote (the admin, an import, a queryset ``update()``, raw SQL), so the
cache can neither miss a change nor cost more with bigger tables. Writes the pipeline makes on
every lead (a team's rotation state, a rep's last assignment time) are not configuration and
do not bump it.

The row is upserted, and created with a random version: after ``flush`` (tests) versions do
not restart at a number a worker may have cached.
"""

from __future__ import annotations

from typing import Any

TABLE = "routing_configversion"

# table -> the columns whose UPDATE changes the configuration (None: any change of a row).
WATCHED: dict[str, tuple[str, ...] | None] = {
    "routing_rep": ("id", "email", "timezone"),
    "routing_team": ("id", "name", "strategy", "respect_working_hours", "sla_minutes"),
    "routing_teammembership": None,
    "routing_territory": None,
    "routing_valuelist": None,
    "routing_ruleset": None,
    "routing_rule": None,
}


def _postgres() -> tuple[list[str], list[str]]:
    create = [
        """
        CREATE OR REPLACE FUNCTION routing_config_bump() RETURNS trigger AS $$
        BEGIN
            INSERT INTO routing_configversion (id, version)
            VALUES (1, floor(random() * 1e15)::bigint)
            ON CONFLICT (id) DO UPDATE SET version = routing_configversion.version + 1;
            RETURN NULL;
        END;
        $$ LANGUAGE plpgsql
        """
    ]
    drop = []
    for table, columns in WATCHED.items():
        update = f"UPDATE OF {', '.join(columns)}" if columns else "UPDATE"
        create.append(
            f"CREATE TRIGGER {table}_config_bump AFTER INSERT OR DELETE OR {update} ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION routing_config_bump()"
        )
        drop.append(f"DROP TRIGGER IF EXISTS {table}_config_bump ON {table}")
    drop.append("DROP FUNCTION IF EXISTS routing_config_bump()")
    return create, drop


def _sqlite() -> tuple[list[str], list[str]]:
    bump = (
        "INSERT INTO routing_configversion (id, version) "
        "VALUES (1, abs(random() % 1000000000000000)) "
        "ON CONFLICT (id) DO UPDATE SET version = version + 1;"
    )
    create, drop = [], []
    for table, columns in WATCHED.items():
        events = ["INSERT", "DELETE", f"UPDATE OF {', '.join(columns)}" if columns else "UPDATE"]
        for number, event in enumerate(events):
            name = f"{table}_config_bump_{number}"
            create.append(
                f"CREATE TRIGGER IF NOT EXISTS {name} AFTER {event} ON {table} BEGIN {bump} END"
            )
            drop.append(f"DROP TRIGGER IF EXISTS {name}")
    return create, drop


def _statements(vendor: str, *, create: bool) -> list[str]:
    if vendor == "postgresql":
        made, dropped = _postgres()
    elif vendor == "sqlite":
        made, dropped = _sqlite()
    else:
        raise NotImplementedError(f"no configuration triggers for the {vendor} database")
    return made if create else dropped


def config_triggers_create(connection: Any) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, create=True):
            cursor.execute(sql)


def config_triggers_drop(connection: Any) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, create=False):
            cursor.execute(sql)
