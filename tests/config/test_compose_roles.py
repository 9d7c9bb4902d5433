"""docker-compose.yml: only the one-shot migrate service connects as the owner of the tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def _services() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]


def test_web_worker_and_beat_connect_as_the_app_role():
    for name in ("web", "worker", "beat"):
        url = _services()[name]["environment"]["DATABASE_URL"]
        assert urlsplit(url).username == "leadrouter_app", name


def test_migrate_connects_as_the_owner_and_grants_the_app_role_after_migrating():
    services = _services()
    migrate = services["migrate"]
    owner = services["postgres"]["environment"]["POSTGRES_USER"]
    assert urlsplit(migrate["environment"]["DATABASE_URL"]).username == owner != "leadrouter_app"
    script = " ".join(migrate["command"])
    assert script.index("migrate --noinput") < script.index(
        "db_grant_app_role --role leadrouter_app --password-env DB_APP_PASSWORD"
    )
    assert "DB_APP_PASSWORD" in migrate["environment"]


def test_workers_keep_the_audit_heads_on_a_volume():
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert "audit-heads:/app/var/audit-heads" in compose["services"]["worker"]["volumes"]
    assert "audit-heads" in compose["volumes"]
