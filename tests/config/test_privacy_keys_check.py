"""`check --deploy` refuses privacy keys generated under var/ (leadrouter.E002; review of #21)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from tests.support.processes import BIN, ROOT, child_env


def _deploy_check(tmp_path: Path, **extra: str) -> str:
    env = child_env(LEADROUTER_VAR_DIR=str(tmp_path / "var"), DEBUG="false", **extra)
    for name in ("PRIVACY_KEYS", "PRIVACY_HASH_KEY"):
        if name not in extra:
            env.pop(name, None)
    done = subprocess.run(
        [str(BIN / "python"), "manage.py", "check", "--deploy", "--tag", "security"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout + done.stderr


@pytest.mark.slow
def test_generated_privacy_keys_fail_the_deploy_check_and_configured_ones_pass(
    tmp_path: Path,
) -> None:
    generated = _deploy_check(tmp_path)
    assert "leadrouter.E002" in generated
    assert "PRIVACY_KEYS and PRIVACY_HASH_KEY not set" in generated
    half = _deploy_check(tmp_path, PRIVACY_KEYS=Fernet.generate_key().decode())
    assert "leadrouter.E002" in half
    assert "PRIVACY_HASH_KEY not set" in half
    configured = _deploy_check(
        tmp_path, PRIVACY_KEYS=Fernet.generate_key().decode(), PRIVACY_HASH_KEY="x" * 43
    )
    assert "leadrouter.E002" not in configured


GOOD_HASH_KEY = "h" * 43


@pytest.mark.parametrize(
    ("keys", "hash_key", "said"),
    [
        (["not-base64!!"], GOOD_HASH_KEY, "key 1 of 1 is not a Fernet key"),
        # Valid base64, wrong length (16 bytes).
        (["AAAAAAAAAAAAAAAAAAAAAA=="], GOOD_HASH_KEY, "key 1 of 1 is not a Fernet key"),
        ([Fernet.generate_key().decode(), "truncated"], GOOD_HASH_KEY, "key 2 of 2"),
        ([" "], GOOD_HASH_KEY, "PRIVACY_KEYS holds no key"),
        ([Fernet.generate_key().decode()], "short", "shorter than 32 characters"),
        ([Fernet.generate_key().decode()], "", "PRIVACY_HASH_KEY is empty"),
        ([Fernet.generate_key().decode()], GOOD_HASH_KEY + "\n", "white space"),
    ],
)
def test_malformed_key_material_fails_the_start_up_check_and_the_worker_start(
    keys: list[str], hash_key: str, said: str
) -> None:
    """Issue 21: a malformed key stopped routing at the first lead; now nothing starts."""
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    from config.celery import worker_privacy_keys_check
    from config.checks import privacy_key_material_check

    with override_settings(PRIVACY_KEYS=keys, PRIVACY_HASH_KEY=hash_key):
        errors = privacy_key_material_check()
        assert [e.id for e in errors] == ["leadrouter.E003"]
        assert said in errors[0].msg
        for key in keys:  # the message never quotes a key
            assert not key.strip() or key.strip() not in errors[0].msg + str(errors[0].hint)
        with pytest.raises(ImproperlyConfigured, match=said.split(" (")[0]):
            worker_privacy_keys_check()


def test_well_formed_key_material_passes() -> None:
    from django.test import override_settings

    from config.checks import privacy_key_material_check

    keys = [Fernet.generate_key().decode(), Fernet.generate_key().decode()]
    with override_settings(PRIVACY_KEYS=keys, PRIVACY_HASH_KEY=GOOD_HASH_KEY):
        assert privacy_key_material_check() == []


@pytest.mark.slow
def test_migrate_refuses_to_run_with_a_malformed_key(tmp_path: Path) -> None:
    env = child_env(
        LEADROUTER_VAR_DIR=str(tmp_path / "var"),
        PRIVACY_KEYS="not-a-fernet-key",
        PRIVACY_HASH_KEY=GOOD_HASH_KEY,
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
    )
    done = subprocess.run(
        [str(BIN / "python"), "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "leadrouter.E003" in done.stdout + done.stderr
    assert "not-a-fernet-key" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("backend", "enabled", "warned"),
    [
        ("django.core.mail.backends.console.EmailBackend", True, True),
        ("django.core.mail.backends.smtp.EmailBackend", True, False),
        ("django.core.mail.backends.console.EmailBackend", False, False),
    ],
)
def test_the_deploy_check_warns_that_console_mail_prints_leads_into_the_log(
    backend: str, enabled: bool, warned: bool
) -> None:
    """EMAIL_URL's default, consolemail://, writes every rep's notification (the lead's name,
    e-mail, phone, company) into the io worker's log, where no erasure reaches it; docker
    compose left it at that default (final review of issue 21)."""
    from django.test import override_settings

    from config.checks import console_mail_check

    with override_settings(EMAIL_BACKEND=backend, DELIVERY_EMAIL_ENABLED=enabled):
        found = console_mail_check()
    assert [w.id for w in found] == (["leadrouter.W002"] if warned else [])
    if warned:
        assert "personal data" in found[0].msg
        assert "EMAIL_URL" in found[0].hint
