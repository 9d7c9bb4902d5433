"""Single sign-on's settings: off when unset, and a half-done configuration stops the start."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.processes import BIN, ROOT, child_env


def _settings(tmp_path: Path, **oidc: str) -> subprocess.CompletedProcess[str]:
    env = child_env(LEADROUTER_VAR_DIR=str(tmp_path / "var"), **oidc)
    for name in list(env):
        if name.startswith("OIDC_") and name not in oidc:
            env.pop(name)
    return subprocess.run(
        [
            str(BIN / "python"),
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print('SSO', settings.SSO_ENABLED, settings.OIDC_ALLOWED_EMAIL_DOMAINS)",
        ],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "config.settings.base"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_single_sign_on_is_off_unless_configured_and_refuses_to_start_half_configured(
    tmp_path: Path,
) -> None:
    assert "SSO False []" in _settings(tmp_path).stdout
    on = _settings(
        tmp_path,
        OIDC_RP_CLIENT_ID="lr",
        OIDC_RP_CLIENT_SECRET="s",
        OIDC_OP_ISSUER="https://idp.example",
        OIDC_ALLOWED_EMAIL_DOMAINS="Example.com, @example.de",
    )
    assert "SSO True ['example.com', 'example.de']" in on.stdout, on.stderr
    no_secret = _settings(tmp_path, OIDC_RP_CLIENT_ID="lr", OIDC_OP_ISSUER="https://idp.example")
    assert no_secret.returncode != 0
    assert "OIDC_RP_CLIENT_SECRET is not" in no_secret.stderr
    no_provider = _settings(
        tmp_path,
        OIDC_RP_CLIENT_ID="lr",
        OIDC_RP_CLIENT_SECRET="s",
        OIDC_OP_TOKEN_ENDPOINT="https://idp.example/token",
    )
    assert no_provider.returncode != 0
    assert "needs OIDC_OP_ISSUER, or all four" in no_provider.stderr
