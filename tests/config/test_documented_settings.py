"""Every environment variable the settings read is documented for the operator who sets it.

DEVELOPERS.md ("Settings and documentation") promises that each variable read under `config/` is
in the README's Configuration section and in `.env.example` with its default. A README row may
stand for a family (`CRM_*`, "see docs"): a variable of such a family is then named in
docs/operations.md instead. This test keeps the promise instead of a shell loop someone must
remember to run.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Keys read from a WSGI environ (a request's, not the process's), and a flag config/asgi.py
# sets for itself before the settings load: not settings anyone configures.
NOT_SETTINGS = {"PATH_INFO", "QUERY_STRING", "REQUEST_METHOD", "LEADROUTER_ASGI_PROCESS"}

_READ = re.compile(
    r"""(?:env\.\w+\(\s*|environ(?:\.get|\.setdefault)?[(\[]\s*)["']([A-Z][A-Z0-9_]+)["']""",
    re.S,
)


def _variables() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "config").rglob("*.py"):
        names |= set(_READ.findall(path.read_text(encoding="utf-8")))
    return names - NOT_SETTINGS


def _named(name: str, text: str) -> bool:
    """Named as a variable: `NAME` or `NAME=...` in backticks."""
    return re.search(rf"`{name}[`=]", text) is not None


def test_the_scan_finds_the_settings_it_should():
    found = _variables()
    # A scan that silently matched nothing would pass everything below.
    assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "CRM_TIMEOUT_SECONDS"} <= found
    assert len(found) > 100


def test_every_setting_is_in_the_readme_or_its_family_in_the_operations_guide():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    operations = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    families = re.findall(r"`([A-Z][A-Z0-9_]*_)\*`", readme)
    missing = [
        name
        for name in sorted(_variables())
        if not _named(name, readme)
        and not (any(name.startswith(f) for f in families) and _named(name, operations))
    ]
    assert not missing, f"not documented in README.md (or docs/operations.md): {missing}"


def test_every_setting_has_a_line_with_its_default_in_the_env_example():
    example = (ROOT / ".env.example").read_text(encoding="utf-8")
    missing = [
        name for name in sorted(_variables()) if re.search(rf"^#? ?{name}=", example, re.M) is None
    ]
    assert not missing, f"no line in .env.example: {missing}"


def test_the_env_example_names_no_setting_that_is_not_read():
    """A line for a variable nothing reads misleads the operator who sets it."""
    example = (ROOT / ".env.example").read_text(encoding="utf-8")
    listed = set(re.findall(r"^#? ?([A-Z][A-Z0-9_]+)=", example, re.M))
    # Read outside config/: docker compose (the app role's password) and the Docker image.
    read_elsewhere = {
        name
        for name in listed
        if any(
            name in (ROOT / f).read_text(encoding="utf-8")
            for f in ("docker-compose.yml", "Dockerfile", "Makefile", "Procfile")
            if (ROOT / f).exists()
        )
    }
    stale = sorted(listed - _variables() - read_elsewhere - NOT_SETTINGS)
    assert not stale, f".env.example lists variables nothing reads: {stale}"
