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
    for name in ("web", "worker", "io-worker", "beat"):
        url = _services()[name]["environment"]["DATABASE_URL"]
        assert urlsplit(url).username == "leadrouter_app", name


def test_migrate_connects_as_the_owner_and_grants_the_app_role_after_migrating():
    services = _services()
    migrate = services["migrate"]
    owner = services["postgres"]["environment"]["POSTGRES_USER"]
    script = " ".join(migrate["command"])
    # The owner's URL is built in the container from the secret, before anything runs.
    assert (
        f'export DATABASE_URL="postgres://{owner}:$$(cat /run/secrets/db_owner_password)@' in script
    )
    assert owner != "leadrouter_app"
    assert script.index("export DATABASE_URL") < script.index("migrate --noinput")
    assert script.index("migrate --noinput") < script.index(
        "db_grant_app_role --role leadrouter_app --password-env DB_APP_PASSWORD"
    )
    assert "DB_APP_PASSWORD" in migrate["environment"]


def test_workers_keep_the_audit_heads_on_a_volume():
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert "audit-heads:/app/var/audit-heads" in compose["services"]["worker"]["volumes"]
    assert "audit-heads" in compose["volumes"]


def test_the_owner_password_reaches_only_postgres_and_migrate():
    """Every app container reads .env, and the owner can lift the audit log's triggers: its
    password is a Docker secret mounted only where it is needed, never a variable."""
    text = COMPOSE.read_text(encoding="utf-8")
    assert "DB_OWNER_PASSWORD" not in text
    compose = yaml.safe_load(text)
    assert compose["secrets"]["db_owner_password"]["file"] == "./secrets/db_owner_password"
    services = compose["services"]
    with_secret = {name for name, svc in services.items() if "db_owner_password" in str(svc)}
    assert with_secret == {"postgres", "migrate"}
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"] == (
        "/run/secrets/db_owner_password"
    )
    for name in ("web", "worker", "beat"):
        url = services[name]["environment"]["DATABASE_URL"]
        assert urlsplit(url).username == "leadrouter_app", name
    example = (COMPOSE.parent / ".env.example").read_text(encoding="utf-8")
    assert "DB_OWNER_PASSWORD" not in example


def test_the_io_worker_drains_the_outside_call_queues_on_threads_and_the_worker_the_rest():
    services = _services()
    worker = " ".join(services["worker"]["command"])
    io = " ".join(services["io-worker"]["command"])
    assert "--queues routing.realtime,maintenance,routing,routing.bulk" in worker
    assert "--queues enrichment.realtime,crm.realtime,enrichment,crm,delivery --pool threads" in io
    assert "--concurrency $${IO_WORKER_CONCURRENCY:-32}" in io
    assert services["io-worker"]["stop_signal"] == "SIGQUIT"


def test_compose_requires_the_privacy_keys_and_the_image_bakes_none() -> None:
    """A key file in the image opens every sealed person for whoever can pull it (review of
    issue 21): compose refuses to start without the keys, the build leaves none behind."""
    environment = _services()["web"]["environment"]
    for name in ("PRIVACY_KEYS", "PRIVACY_HASH_KEY"):
        assert environment[name] == f"${{{name}:?set {name} in .env (see .env.example)}}"
    dockerfile = (COMPOSE.parent / "Dockerfile").read_text(encoding="utf-8")
    build = dockerfile[dockerfile.index("collectstatic") - 300 :]
    assert "PRIVACY_KEYS=collectstatic-only" in build
    assert "PRIVACY_HASH_KEY=collectstatic-only" in build
    assert "/app/var/privacy-key /app/var/privacy-hash-key" in build
