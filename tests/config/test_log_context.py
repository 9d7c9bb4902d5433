"""Issue 23, item 5: every log line about a lead carries lead_id, source and task_id as fields."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from pythonjsonlogger.json import JsonFormatter

from config.logging import ContextTextFormatter, LogContextFilter, log_context, log_context_add
from leads.models import Lead, LeadStatus
from routing import services
from routing.tasks import process_lead
from tests.leads.factories import LeadFactory

Lines = Callable[[], list[dict[str, Any]]]


@pytest.fixture
def json_lines() -> Iterator[Lines]:
    """The records the configured console handler writes, as the JSON format writes them."""
    root = logging.getLogger()
    handler = next(
        h
        for h in root.handlers
        if isinstance(h, logging.StreamHandler)
        and any(isinstance(f, LogContextFilter) for f in h.filters)
    )
    assert isinstance(handler, logging.StreamHandler)
    stream = io.StringIO()
    old_stream = handler.setStream(stream)
    old_formatter = handler.formatter
    config = settings.LOGGING["formatters"]["json"]
    handler.setFormatter(JsonFormatter(config["format"], rename_fields=config["rename_fields"]))
    try:
        yield lambda: [json.loads(line) for line in stream.getvalue().splitlines() if line]
    finally:
        handler.setFormatter(old_formatter)
        if old_stream is not None:
            handler.setStream(old_stream)


def _record(msg: str = "hello", **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("routing.services", logging.INFO, __file__, 1, msg, (), None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_the_context_is_added_inside_and_gone_outside() -> None:
    context_filter = LogContextFilter()
    with log_context(lead_id="L1"):
        log_context_add(source="webinar")
        with log_context(lead_id="L2"):
            inner = _record()
            context_filter.filter(inner)
        outer = _record()
        context_filter.filter(outer)
        explicit = _record(lead_id="mine")
        context_filter.filter(explicit)
    after = _record()
    context_filter.filter(after)
    assert (inner.lead_id, inner.source) == ("L2", "webinar")  # type: ignore[attr-defined]
    assert (outer.lead_id, outer.source) == ("L1", "webinar")  # type: ignore[attr-defined]
    assert explicit.lead_id == "mine"  # type: ignore[attr-defined]
    assert not hasattr(after, "lead_id")
    assert not hasattr(after, "source")


def test_text_lines_end_with_the_fields_before_any_traceback() -> None:
    formatter = ContextTextFormatter("%(levelname)s %(message)s")
    assert formatter.format(_record("plain")) == "INFO plain"
    record = _record("routed", lead_id="L1", source="webinar", task_id="t-1")
    assert formatter.format(record) == "INFO routed lead_id=L1 source=webinar task_id=t-1"
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    failed.lead_id = "L1"  # type: ignore[attr-defined]
    first, _, rest = formatter.format(failed).partition("\n")
    assert first == "ERROR failed lead_id=L1"
    assert rest.startswith("Traceback")


@pytest.mark.django_db
def test_a_failing_pipeline_run_logs_the_lead_its_source_and_the_task(
    json_lines: Lines, monkeypatch: pytest.MonkeyPatch
) -> None:
    lead = LeadFactory()

    def broken(*, lead: Lead) -> None:
        raise ValueError("normalisation exploded")

    monkeypatch.setattr(services, "lead_apply_normalization", broken)
    process_lead.apply(args=[str(lead.id)], task_id="task-h23")
    failed = [line for line in json_lines() if line["message"].startswith("processing lead")]
    assert len(failed) == 1, json_lines()
    assert failed[0]["lead_id"] == str(lead.id)
    assert failed[0]["source"] == lead.source.slug
    assert failed[0]["task_id"] == "task-h23"
    assert failed[0]["level"] == "ERROR"


@pytest.mark.django_db
def test_a_retried_unassigned_lead_and_its_enqueue_failure_name_the_lead(
    json_lines: Lines, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from routing.decisions import clear_live_config_cache
    from routing.monitoring.unassigned import unassigned_retry

    clear_live_config_cache()
    lead = LeadFactory()
    services.lead_process(lead_id=lead.id)
    lead.refresh_from_db()
    assert lead.status == LeadStatus.UNASSIGNED
    assert lead.unassigned_retry_at is not None
    assert unassigned_retry(now=lead.unassigned_retry_at + timedelta(seconds=1)) == 1
    process_lead.apply(args=[str(lead.id)], task_id="task-retry")
    still = [line for line in json_lines() if "still unassigned" in line["message"]]
    assert len(still) == 1, json_lines()
    assert (still[0]["lead_id"], still[0]["source"], still[0]["task_id"]) == (
        str(lead.id),
        lead.source.slug,
        "task-retry",
    )

    # Outside any task or pipeline: a line about one lead still names it.
    from leads import services as lead_services

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("broker gone")

    monkeypatch.setattr(lead_services.celery_app, "send_task", refuse)
    monkeypatch.setattr(lead_services.broker_breaker, "allows", lambda: True)
    monkeypatch.setattr(lead_services.broker_breaker, "trip", lambda seconds: None)
    assert lead_services.lead_enqueue_later(lead.id, delay=1.0) is False
    refused = [line for line in json_lines() if "could not re-enqueue" in line["message"]]
    assert len(refused) == 1
    assert refused[0]["lead_id"] == str(lead.id)
    assert "task_id" not in refused[0]
