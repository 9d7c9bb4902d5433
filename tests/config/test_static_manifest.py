"""Issue 23, item 2: production settings without `collectstatic`.

A deployment that skipped `collectstatic` (or mounted a volume over the static root) must say so
where an operator looks (`manage.py check --deploy`, `/readyz`, the web log), and the login page
must still answer 200, not 500.
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.processes import BIN, ROOT, child_env, free_port, start, wait_until


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except OSError:
        return 0, b""


def _production_env(tmp_path: Path) -> dict[str, str]:
    static_root = tmp_path / "static"  # exists, and is empty: collectstatic never ran
    static_root.mkdir()
    return child_env(
        DJANGO_SETTINGS_MODULE="config.settings.base",  # production: manifest storage
        STATIC_ROOT=str(static_root),
        DEBUG="false",
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_gunicorn_without_collectstatic_serves_the_login_page_and_readyz_says_what_to_run(
    tmp_path: Path,
) -> None:
    env = _production_env(tmp_path)
    port = free_port()
    env.update(PORT=str(port), HOST="127.0.0.1", WEB_CONCURRENCY="1")
    web = start(
        [str(BIN / "gunicorn"), "config.wsgi:application", "--config", "config/gunicorn.py"], env
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: _get(f"{base}/healthz")[0] == 200,
            timeout=60,
            message=lambda: f"gunicorn never answered:\n{web.text()[-3000:]}",
        )
        status, body = _get(f"{base}/admin/login/")
        assert status == 200, (status, body[-2000:], web.text()[-3000:])
        assert b'name="username"' in body

        status, body = _get(f"{base}/readyz")
        assert status == 503, body
        answer = json.loads(body)
        assert answer["checks"]["static"].startswith("error:")
        assert "collectstatic" in answer["checks"]["static"]
        assert "static" in answer["error"]["message"]
        # The web log names the cause and the command too.
        wait_until(
            lambda: "collectstatic" in web.text(),
            timeout=10,
            message=lambda: f"no log line names collectstatic:\n{web.text()[-3000:]}",
        )
    finally:
        web.stop()


def test_check_deploy_names_the_missing_manifest_and_the_command(tmp_path: Path) -> None:
    env = _production_env(tmp_path)
    done = subprocess.run(
        [str(BIN / "python"), "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "leadrouter.E001" in output, output
    assert "collectstatic --noinput" in output, output
    assert str(tmp_path / "static") in output, output


def test_check_deploy_is_quiet_about_static_once_collected(tmp_path: Path) -> None:
    env = _production_env(tmp_path)
    subprocess.run(
        [str(BIN / "python"), "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=300,
    )
    done = subprocess.run(
        [str(BIN / "python"), "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "leadrouter.E001" not in done.stdout + done.stderr
