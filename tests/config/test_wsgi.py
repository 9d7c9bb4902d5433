"""config.wsgi and config.gunicorn: requests Django cannot build, and gunicorn's own loggers."""

from __future__ import annotations

import io
import json
import logging
import logging.config
from typing import Any

import pytest

from config.logging import RedactTokensFilter
from config.wsgi import application  # at import: its django.setup() reconfigures logging

TOKEN = "s3cr3t-T0KEN-value"
HOSTILE_TYPE = "application/json; charset*=bogus''x"


def environ(**overrides: Any) -> dict[str, Any]:
    body = b'{"email": "ana@acme.com"}'
    env: dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/api/v1/intake/webform/",
        "QUERY_STRING": f"token={TOKEN}",
        "CONTENT_TYPE": HOSTILE_TYPE,
        "CONTENT_LENGTH": str(len(body)),
        "SERVER_NAME": "testserver",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": io.StringIO(),
    }
    env.update(overrides)
    return env


class StartResponse:
    def __init__(self) -> None:
        self.status = ""
        self.headers: dict[str, str] = {}

    def __call__(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        self.status = status
        self.headers = dict(headers)


@pytest.fixture(autouse=True)
def _keep_the_test_connection():
    """Requests close "old" connections on start and finish; not the test's connection."""
    from django.core import signals
    from django.db import close_old_connections

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


def call(env: dict[str, Any]) -> tuple[StartResponse, bytes]:
    start_response = StartResponse()
    result = application(env, start_response)
    try:
        body = b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return start_response, body


def test_a_request_django_cannot_build_is_a_json_400_logged_once_without_the_token(caplog):
    caplog.set_level(logging.DEBUG)
    start_response, body = call(environ())
    assert start_response.status.startswith("400 ")
    assert start_response.headers["Content-Type"] == "application/json"
    assert int(start_response.headers["Content-Length"]) == len(body)
    error = json.loads(body)["error"]
    assert error["code"] == "bad_request"
    assert error["message"]
    assert TOKEN not in caplog.text
    mine = [r for r in caplog.records if r.name == "config.wsgi"]
    assert len(mine) == 1
    assert mine[0].levelno == logging.ERROR
    message = mine[0].getMessage()
    assert "ValueError" in message
    assert "/api/v1/intake/webform/?token=[redacted]" in message


@pytest.mark.django_db
def test_other_failures_escaping_django_are_a_json_500_logged_at_error(caplog, monkeypatch):
    from django.core import signals

    def broken(**kwargs: Any) -> None:
        raise RuntimeError("receiver broke")

    signals.request_started.connect(broken, dispatch_uid="test-broken-receiver")
    try:
        start_response, body = call(environ(CONTENT_TYPE="application/json"))
    finally:
        signals.request_started.disconnect(dispatch_uid="test-broken-receiver")
    assert start_response.status.startswith("500 ")
    assert json.loads(body)["error"]["code"] == "server_error"
    errors = [r for r in caplog.records if r.name == "config.wsgi"]
    assert len(errors) == 1
    assert errors[0].levelno == logging.ERROR
    assert "RuntimeError" in errors[0].getMessage()
    assert errors[0].exc_info is not None
    assert TOKEN not in caplog.text


@pytest.mark.django_db
def test_a_readable_request_still_reaches_django():
    start_response, body = call(
        environ(CONTENT_TYPE="application/json", PATH_INFO="/api/v1/intake/nosuch/")
    )
    assert start_response.status.startswith("404 ")
    assert json.loads(body)["error"]["code"] == "source_not_found"


# --- gunicorn's loggers ----------------------------------------------------------------------


@pytest.fixture
def gunicorn_logging():
    """config.gunicorn.logconfig_dict applied (as gunicorn applies it); restored afterwards."""
    from gunicorn.glogging import CONFIG_DEFAULTS

    from config import gunicorn as gunicorn_conf

    names = ("gunicorn.error", "gunicorn.access", "")
    saved = {}
    for name in names:
        logger = logging.getLogger(name)
        saved[name] = (logger.level, logger.propagate, logger.handlers[:], logger.filters[:])
    config = CONFIG_DEFAULTS.copy()
    config.update(gunicorn_conf.logconfig_dict)
    logging.config.dictConfig(config)
    yield
    for name, (level, propagate, handlers, filters) in saved.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.propagate = propagate
        logger.handlers[:] = handlers
        logger.filters[:] = filters


def own_handlers(logger: logging.Logger) -> list[logging.Handler]:
    """The handlers the config made (pytest's capture handlers left out)."""
    return [h for h in logger.handlers if type(h) is logging.StreamHandler]


def capture(logger: logging.Logger) -> io.StringIO:
    """The logger's own handler, writing to a buffer (its filters and formatter kept)."""
    stream = io.StringIO()
    handlers = own_handlers(logger)
    assert handlers, logger.handlers
    for handler in handlers:
        handler.setStream(stream)
    return stream


def test_gunicorn_loggers_carry_the_token_filter(gunicorn_logging):
    for name in ("gunicorn.error", "gunicorn.access"):
        logger = logging.getLogger(name)
        assert any(isinstance(f, RedactTokensFilter) for f in logger.filters), name
        assert logger.propagate is False
        assert own_handlers(logger), name
        for handler in own_handlers(logger):
            assert any(isinstance(f, RedactTokensFilter) for f in handler.filters), name


def test_gunicorn_error_lines_are_redacted_in_gunicorns_format(gunicorn_logging):
    logger = logging.getLogger("gunicorn.error")
    stream = capture(logger)
    logger.error("Error handling request %s", f"POST /api/v1/intake/x/?token={TOKEN}")
    logger.error("Invalid request line %s", f"GET /?token={TOKEN} HTTP/1.1".encode("latin-1"))
    out = stream.getvalue()
    assert TOKEN not in out
    assert "Error handling request POST /api/v1/intake/x/?token=[redacted]" in out
    assert "[ERROR] Error handling request" in out  # gunicorn's "[pid] [LEVEL] message" format


def test_gunicorn_access_lines_are_redacted_and_unknown_atoms_still_dash(gunicorn_logging):
    from gunicorn.glogging import SafeAtoms

    logger = logging.getLogger("gunicorn.access")
    stream = capture(logger)
    atoms = SafeAtoms({"r": f"POST /in/?token={TOKEN} HTTP/1.1", "s": "202"})
    logger.info('"%(r)s" %(s)s %({x-forwarded-for}i)s', atoms)
    assert stream.getvalue() == '"POST /in/?token=[redacted] HTTP/1.1" 202 -\n'


def test_filter_redacts_bytes_and_dict_args():
    record = logging.LogRecord(
        "gunicorn.error",
        logging.ERROR,
        __file__,
        1,
        "%s %s",
        (b"GET /?token=abc HTTP/1.1", {"url": "/in/?api_key=def"}),
        None,
    )
    assert RedactTokensFilter().filter(record)
    message = record.getMessage()
    assert "abc" not in message
    assert "def" not in message
    assert "b'GET /?token=[redacted] HTTP/1.1'" in message
