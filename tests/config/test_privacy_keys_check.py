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
