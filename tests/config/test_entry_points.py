"""Each process's entry point imports in a fresh interpreter, as gunicorn, uvicorn and celery do.

The suite itself imports Django's apps before any test runs, so a module that reaches a model
while the app registry is still loading (``AppRegistryNotReady``) passes every in-process test and
still stops `make run`'s web process from booting. These import each entry point alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "statement",
    [
        "import config.wsgi",  # gunicorn config.wsgi:application
        "import config.asgi",  # uvicorn config.asgi:application
        "import config.celery",  # celery -A config
        "import config.errors",  # imported by config.wsgi before django.setup()
    ],
)
def test_entry_point_imports_in_a_fresh_interpreter(statement: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["DJANGO_SETTINGS_MODULE"] = "config.settings.base"
    result = subprocess.run(
        [sys.executable, "-c", statement],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
