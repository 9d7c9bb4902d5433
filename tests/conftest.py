"""Shared fixtures and the service-marker policy.

Tests marked ``postgres`` or ``redis`` need those servers (``DATABASE_URL`` / ``REDIS_URL``);
``browser`` needs Debian's Chromium, ``redis_server`` the ``redis-server`` program (for a
throwaway server the test starts and faults). Without them the tests skip with the reason, and
the run ends with a banner listing what was not tested. With ``REQUIRE_SERVICES=1`` (CI) a missing
service is a failure, not a skip.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from django.conf import settings

from tests.support.services import chromium_path, service_missing_reason

REQUIRE_SERVICES = os.environ.get("REQUIRE_SERVICES") == "1"
_skipped_for_services: list[str] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in ("postgres", "redis", "redis_server", "browser"):
        if item.get_closest_marker(marker) is None:
            continue
        reason = service_missing_reason(marker)
        if reason is None:
            continue
        if REQUIRE_SERVICES:
            pytest.fail(f"REQUIRE_SERVICES=1 but {reason}", pytrace=False)
        _skipped_for_services.append(f"{item.nodeid}: {reason}")
        pytest.skip(reason)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _skipped_for_services:
        terminalreporter.section("NOT TESTED: services missing", sep="!", yellow=True, bold=True)
        terminalreporter.write_line(
            f"{len(_skipped_for_services)} test(s) skipped because a service is not configured. "
            "Set DATABASE_URL / REDIS_URL (and install chromium) to run them; "
            "REQUIRE_SERVICES=1 turns these skips into failures."
        )
        for line in _skipped_for_services[:50]:
            terminalreporter.write_line(f"  {line}")


@pytest.fixture(scope="session", autouse=True)
def _remove_test_broker_folder() -> Iterator[None]:
    yield
    if settings.BROKER_IS_FILESYSTEM and settings.BROKER_DIR.name.startswith("test-broker-"):
        shutil.rmtree(settings.BROKER_DIR, ignore_errors=True)
    if settings.STATUS_WAKE_DIR.name.startswith("test-wake-"):
        shutil.rmtree(settings.STATUS_WAKE_DIR, ignore_errors=True)


@pytest.fixture
def chromium() -> str:
    """Path of the Chromium binary for Playwright (the test is marked ``browser``)."""
    path = chromium_path()
    assert path is not None
    return path


@pytest.fixture
def broker_is_redis() -> bool:
    return not settings.BROKER_IS_FILESYSTEM


@pytest.fixture(autouse=True)
def _no_sentry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SENTRY_DSN", raising=False)


@pytest.fixture(autouse=True)
def _fresh_live_config() -> Iterator[None]:
    """Every test starts without a compiled routing configuration cached by an earlier one.

    Rolled-back tests also roll back the configuration version (and SQLite reuses ids), so a
    cache key could otherwise repeat with a different configuration behind it.
    """
    from routing.decisions import clear_live_config_cache

    clear_live_config_cache()
    yield
    clear_live_config_cache()


# Fixtures through which a test reaches the database, the broker or the cache: a test that uses
# none of them (and has no django_db or service mark) cannot behave differently on PostgreSQL
# and Redis than on the embedded defaults.
_SERVICE_FIXTURES = {
    "db",
    "transactional_db",
    "client",
    "admin_client",
    "admin_user",
    "django_user_model",
    "live_server",
    "broker_is_redis",
    "settings",
}
_SERVICE_MARKS = ("django_db", "postgres", "redis", "worker", "browser", "reliability")


# The modules of code that is free of Django by design: the decision core and normalisation.
_PURE_MODULES = (
    "tests/routing/engine/",
    "tests/leads/test_normalize.py",
    "tests/routing/admin/test_describe.py",
    "tests/routing/delivery/test_backoff.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``LEADROUTER_SKIP_SERVICE_FREE=1`` (CI's PostgreSQL + Redis run only): deselect the tests
    of the Django-free code (_PURE_MODULES) that use no database, broker, cache or settings. The
    embedded run has just run them, and they cannot give another answer on PostgreSQL and Redis;
    CI saves their time (a third of the suite's tests, mostly Hypothesis properties)."""
    if os.environ.get("LEADROUTER_SKIP_SERVICE_FREE") != "1":
        return
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        uses = set(getattr(item, "fixturenames", ()))
        marked = any(item.get_closest_marker(m) is not None for m in _SERVICE_MARKS)
        pure = item.nodeid.startswith(_PURE_MODULES)
        (dropped if pure and not marked and not uses & _SERVICE_FIXTURES else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
